// The codec of failures between ranks (failure.hpp): the built-in kinds (qkv::mpi's and
// qkv::runtime's errors), the ones backends register, and the generic fallbacks.
#include "mpi/failure.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <new>
#include <stdexcept>
#include <vector>

#include "qkv/mpi/error.hpp"
#include "qkv/runtime/error.hpp"

namespace qkv::mpi::detail {
namespace {

/// The built-in kinds, tried before the registered ones (none derives from another's type), and
/// the generic ones tried after them.
constexpr failure_kind invalid_argument_kind = kind_of<qkv::invalid_argument>(2);
constexpr failure_kind timeout_kind = kind_of<qkv::mpi::timeout>(5);
constexpr failure_kind mpi_error_kind = kind_of<qkv::mpi::error>(4);
constexpr failure_kind qkv_error_kind = kind_of<qkv::error>(3);
constexpr std::int32_t other_code = 6;  // any other exception: qkv::mpi::error on every rank

std::mutex& registry_mutex() {
    static std::mutex m;
    return m;
}
std::vector<failure_kind>& registered() {
    static std::vector<failure_kind> kinds;
    return kinds;
}

/// Every kind, in the order classify tries them.
std::vector<failure_kind> kinds() {
    std::vector<failure_kind> all{invalid_argument_kind, timeout_kind, mpi_error_kind};
    {
        const std::lock_guard lock(registry_mutex());
        all.insert(all.end(), registered().begin(), registered().end());
    }
    all.push_back(qkv_error_kind);
    return all;
}

std::pair<std::int32_t, std::string> classify(const std::exception_ptr& failure) {
    if (!failure) return {failure_ok, {}};
    try {
        std::rethrow_exception(failure);
    } catch (const peer_failed& e) {
        return {failure_stopped, "stopped: rank " + std::to_string(e.rank()) + " failed"};
    } catch (const std::bad_alloc&) {
        return {other_code, "out of host memory (std::bad_alloc)"};
    } catch (const std::exception& e) {
        for (const failure_kind& k : kinds())
            if (k.matches(e)) return {k.code, e.what()};
        return {other_code, e.what()};
    } catch (...) {
        return {other_code, "an unknown exception"};
    }
}

}  // namespace

std::string failure_record::text() const {
    return std::string(message, std::find(message, message + sizeof message, '\0'));
}

void register_failure_kind(const failure_kind& kind) {
    const std::lock_guard lock(registry_mutex());
    for (const failure_kind& k : registered())
        if (k.code == kind.code) throw std::logic_error("qkv::mpi: a failure kind registered twice");
    for (const std::int32_t taken : {failure_ok, failure_stopped, invalid_argument_kind.code, qkv_error_kind.code,
                                     mpi_error_kind.code, timeout_kind.code, other_code})
        if (kind.code == taken) throw std::logic_error("qkv::mpi: a failure kind's code is a built-in one's");
    registered().push_back(kind);
}

failure_record make_record(const std::exception_ptr& failure, std::uint64_t fingerprint, bool notified,
                           std::uint64_t stage) {
    failure_record r;
    const auto [what, message] = classify(failure);
    r.what = what;
    r.notified = notified ? 1 : 0;
    r.fingerprint = fingerprint;
    r.stage = stage;
    const std::size_t n = std::min(message.size(), sizeof r.message - 1);
    std::memcpy(r.message, message.data(), n);
    r.message[n] = '\0';
    return r;
}

namespace {
std::atomic<bool> timed_out_here{false};
}  // namespace

void throw_timeout(const std::string& message) {
    timed_out_here = true;
    throw qkv::mpi::timeout(message);
}

bool out_of_step() { return timed_out_here; }

void rethrow(std::int32_t what, const std::string& message) {
    if (what == timeout_kind.code) timed_out_here = true;  // another rank timed out: out of step too
    for (const failure_kind& k : kinds())
        if (k.code == what) k.rethrow(message);
    throw qkv::mpi::error(message);
}

}  // namespace qkv::mpi::detail
