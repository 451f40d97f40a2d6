// The one way qkv::mpi talks between ranks: a duplicate of the caller's communicator, non-blocking
// transfers polled against a deadline, failure notices that stop the other ranks early, and the
// agreement that ends every collective call with the same verdict on every rank (a failure
// travels as failure.hpp encodes it). Internal.
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "mpi/failure.hpp"
#include "qkv/mpi/collective.hpp"

namespace qkv::mpi::detail {

using clock = std::chrono::steady_clock;

[[nodiscard]] inline double ms_between(clock::time_point a, clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
}

/// Throws qkv::mpi::error naming `call` unless `rc` is MPI_SUCCESS.
void check_mpi(int rc, const char* call);

using bytes = std::vector<std::byte>;
using shared_bytes = std::shared_ptr<bytes>;

/// FNV-1a over the bytes of what every rank must agree on (shapes, options, masks, sinks).
class fingerprint {
public:
    void add(const void* data, std::size_t n);
    template <class T>
    void add_value(const T& v) {
        add(&v, sizeof v);
    }
    [[nodiscard]] std::uint64_t value() const { return h_; }

private:
    std::uint64_t h_ = 1469598103934665603ull;
};

class channel {
public:
    /// Duplicates `user` (MPI_Comm_idup, under the deadline). `operation` names the call in messages.
    channel(MPI_Comm user, const comm_options& options, std::string operation);
    ~channel();
    channel(const channel&) = delete;
    channel& operator=(const channel&) = delete;

    [[nodiscard]] int rank() const { return rank_; }
    [[nodiscard]] int size() const { return size_; }

    /// Non-blocking transfers, tracked until done; `what` names them in a timeout's message.
    /// The channel keeps `data` alive until the transfer is done (or parked, after a failure).
    std::size_t post_send(shared_bytes data, int peer, int tag, std::string what);
    std::size_t post_recv(shared_bytes data, int peer, int tag, std::string what);
    [[nodiscard]] bool done(std::size_t transfer) const;

    /// Polls until the transfers `which` are done (and notes the completion of every other one
    /// in flight). `work`, when given, runs on a worker thread meanwhile (it must not call MPI); no
    /// deadline runs while it does. Throws the work's exception, qkv::mpi::timeout, or
    /// peer_failed when another rank's failure notice arrives.
    void wait(std::span<const std::size_t> which, const std::function<void()>& work = {});

    /// The agreement that ends a stage: every rank passes its failure (null: none) and the
    /// fingerprint of what it was asked to do; returns when every rank succeeded with the same
    /// fingerprint, else throws the lowest failing rank's failure on every rank (a fingerprint
    /// that differs from rank 0's is qkv::invalid_argument). When `local` is set and this rank
    /// has not told the others yet, it does first (so that they stop waiting on it).
    void agree(std::exception_ptr local, std::uint64_t fingerprint, const std::string& stage);

    /// Time spent making the duplicate and in agree() so far (waiting for every rank to arrive).
    [[nodiscard]] double agreement_ms() const { return agreement_ms_; }
    /// What wait() observed so far: the work's time; the time some transfer was in flight (the
    /// union of each transfer's post-to-completion interval, completions seen by polling every
    /// 0.1 ms); and of it, the time no work ran (exposed communication).
    [[nodiscard]] double compute_ms() const { return compute_ms_; }
    [[nodiscard]] double comm_ms() const;
    [[nodiscard]] double exposed_ms() const;
    [[nodiscard]] std::uint64_t bytes_sent() const { return sent_; }
    [[nodiscard]] std::uint64_t bytes_received() const { return received_; }

private:
    struct transfer {
        std::vector<MPI_Request> requests;
        shared_bytes data;
        int peer = 0;
        bool send = false;
        bool finished = false;
        std::string what;
        clock::time_point posted{}, done{};
    };
    /// post_send and post_recv: the transfer in pieces MPI's int counts can hold.
    std::size_t post(shared_bytes data, int peer, int tag, std::string what, bool send);
    void poll(std::span<const std::size_t> which, bool& all_done);
    void poll_others();
    void check_notices();
    void notify(const std::exception_ptr& failure);
    void abandon_pending();
    [[noreturn]] void time_out(std::span<const std::size_t> which, const std::string& during);
    void wait_requests(std::vector<MPI_Request>& requests, const std::string& during);

    MPI_Comm comm_ = MPI_COMM_NULL;
    /// After a failure messages may still be in flight on comm_ (a late rank's, a cancelled
    /// receive's): the duplicate is then never freed, so that MPI never gives its context id to a
    /// later communicator, where a stale message could match.
    bool poisoned_ = false;
    int rank_ = 0, size_ = 1;
    comm_options options_;
    std::string operation_;
    std::vector<transfer> transfers_;
    bool notified_ = false;
    /// The stage running: the agreements this channel has ended. A failure notice carries the stage
    /// it was sent in.
    std::uint64_t stage_ = 0;
    /// The failure notices this rank has received, by sender (a record, see channel.cpp), including
    /// one kept for the stage after the agreement that received it.
    std::map<int, std::vector<std::byte>> notices_;
    std::vector<std::pair<MPI_Request, shared_bytes>> notice_sends_;
    double agreement_ms_ = 0, compute_ms_ = 0;
    std::vector<std::pair<clock::time_point, clock::time_point>> work_spans_;  ///< when work ran
    std::uint64_t sent_ = 0, received_ = 0;
};

/// MPI_Finalize for qkv::mpi::environment, after the transfers a failure left behind are released
/// (a point-to-point request is freed: MPI finishes or drops it; an agreement another rank never
/// joined is given a moment, then left to MPI_Finalize). Their buffers outlive MPI_Finalize, which
/// may still write them.
void finalize_mpi();

/// "rank R of N: " for messages.
[[nodiscard]] std::string rank_prefix(int rank, int size);

}  // namespace qkv::mpi::detail
