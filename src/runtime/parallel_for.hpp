// parallel_for: the float64 CPU backends' one threading primitive (qkv::cpu::attention and
// qkv::cpu::sdpa). Internal to the library.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace qkv::cpu::detail {

/// Work (multiply-adds, roughly) above which a loop is spread over threads.
constexpr std::size_t parallel_threshold = std::size_t{1} << 20;

/// Query rows per work item of the attention loop: small enough to balance the threads, large
/// enough that handing out items costs nothing.
constexpr std::size_t rows_per_item = 32;

/// Calls body(i) for every i in [0, count), on up to hardware_concurrency() threads when
/// `work` is large. Items are handed out one at a time, so uneven items (causal rows) balance.
/// The first exception thrown by a body stops the remaining items and is rethrown here.
template <class Body>
void parallel_for(std::size_t count, std::size_t work, const Body& body) {
    std::size_t threads = std::max<std::size_t>(1, std::thread::hardware_concurrency());
    threads = std::min(threads, count);
    if (work <= parallel_threshold || threads <= 1) {
        for (std::size_t i = 0; i < count; ++i) body(i);
        return;
    }

    std::atomic<std::size_t> next{0};
    std::exception_ptr failure;
    std::mutex failure_mutex;
    const auto worker = [&] {
        for (std::size_t i = next.fetch_add(1); i < count; i = next.fetch_add(1)) {
            try {
                body(i);
            } catch (...) {
                const std::lock_guard lock(failure_mutex);
                if (!failure) failure = std::current_exception();
                next.store(count);  // hand out nothing more
            }
        }
    };

    std::vector<std::thread> pool;
    pool.reserve(threads - 1);
    try {
        for (std::size_t t = 0; t + 1 < threads; ++t) pool.emplace_back(worker);
    } catch (...) {
        // Could not start another thread: the ones running and this one finish the work.
    }
    worker();
    for (std::thread& t : pool) t.join();
    if (failure) std::rethrow_exception(failure);
}

}  // namespace qkv::cpu::detail
