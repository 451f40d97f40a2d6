// How a failure travels between ranks: a fixed-size record (a kind, the message, the fingerprint of
// what the rank was asked to do), and the codec that turns an exception into a kind and a kind back
// into the same exception type on every rank. The kinds of qkv::mpi and qkv::runtime are built in;
// a backend registers the kinds of its own errors (the Vulkan backend: vulkan_backend.cpp), so this
// code knows no backend's types. Internal.
#pragma once

#include <cstdint>
#include <exception>
#include <string>

namespace qkv::mpi::detail {

/// Thrown inside a call when another rank's failure notice arrives: this rank stops and agrees.
class peer_failed : public std::exception {
public:
    explicit peer_failed(int rank) : rank_(rank) {}
    [[nodiscard]] const char* what() const noexcept override { return "another rank failed"; }
    [[nodiscard]] int rank() const { return rank_; }

private:
    int rank_;
};

/// The kinds that are not an exception of their own: success, and a rank that stopped because
/// another failed (peer_failed).
inline constexpr std::int32_t failure_ok = 0;
inline constexpr std::int32_t failure_stopped = 1;

/// A failure as it travels (plain bytes: every rank runs the same build).
struct failure_record {
    std::int32_t what = failure_ok;  ///< the kind
    std::int32_t notified = 0;       ///< this rank sent a failure notice to every other rank
    std::uint64_t fingerprint = 0;
    /// The stage of the channel it was made in (the agreements before it, channel.cpp): a notice
    /// that comes while a rank is still ending one agreement may belong to the next stage.
    std::uint64_t stage = 0;
    char message[1008] = {};

    [[nodiscard]] bool succeeded() const { return what == failure_ok || what == failure_stopped; }
    [[nodiscard]] std::string text() const;
};
static_assert(sizeof(failure_record) == 1032);

/// A kind of failure: `code` (unique, the same on every rank), whether an exception is of it (the
/// kinds are tried in the order they were registered, so register the derived types before their
/// bases), and how to throw it again.
struct failure_kind {
    std::int32_t code;
    bool (*matches)(const std::exception& e);
    void (*rethrow)(const std::string& message);  ///< throws, never returns
};

/// The kind of exception type E (constructible from its message), under `code`.
template <class E>
constexpr failure_kind kind_of(std::int32_t code) {
    return {code, [](const std::exception& e) { return dynamic_cast<const E*>(&e) != nullptr; },
            [](const std::string& message) { throw E(message); }};
}

/// Adds a kind to the codec (before any channel runs: from a static initialiser of the backend's
/// source). A code already registered is refused (std::logic_error).
void register_failure_kind(const failure_kind& kind);

/// The record of `failure` (null: success) with `fingerprint`, marked notified where the rank told
/// the others already, made in `stage`.
[[nodiscard]] failure_record make_record(const std::exception_ptr& failure, std::uint64_t fingerprint, bool notified,
                                         std::uint64_t stage);

/// Throws the exception of kind `what` with `message` (an unknown kind: qkv::mpi::error).
[[noreturn]] void rethrow(std::int32_t what, const std::string& message);

/// Throws qkv::mpi::timeout(message), noting first that the ranks are out of step (out_of_step).
[[noreturn]] void throw_timeout(const std::string& message);

/// Whether a qkv::mpi::timeout has been thrown in this process, by throw_timeout or rethrown from
/// another rank's report: the ranks' collective calls are then no longer in step, and MPI_Finalize
/// (which waits for every rank) may wait forever (qkv::mpi::timed_out).
[[nodiscard]] bool out_of_step();

}  // namespace qkv::mpi::detail
