// testing::measure_ceiling (qkv/vulkan/testing.hpp): the device's own limits, measured with the same executor and clock
// as the attention calls, so kernel throughput can be stated as a fraction of them.
#include <algorithm>
#include <chrono>
#include <vector>

#include "api/context_impl.hpp"
#include "kernels/stages.hpp"

namespace qkv::vulkan {

using namespace detail;

namespace {

using contract::ceiling_copy_push;  // shaders/contract/ceiling.h
using contract::ceiling_fma_push;

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

/// Device time of one recorded piece of work (timestamps), or host time around submit and fence.
template <class Record>
double time_ms(executor& exec, Record&& record) {
    const auto start = std::chrono::steady_clock::now();
    exec.begin();
    record();
    const double device = exec.submit_and_wait();
    const double host = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    return device > 0 ? device : host;
}

}  // namespace

namespace {

testing::device_ceiling measure(detail::device_core& core) {
    executor& exec = *core.exec;
    pipeline_set& pipes = *core.pipes;
    allocator& alloc = *core.alloc;
    const device_info& info = core.dev->info();
    testing::device_ceiling c;
    c.device_timestamps = info.timestamps;

    std::vector<double> empty;
    for (int i = 0; i < 21; ++i) {
        const auto start = std::chrono::steady_clock::now();
        exec.begin();
        (void)exec.submit_and_wait();
        empty.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    }
    c.empty_submit_ms = median(empty);

    // Arithmetic: 16 independent vec4 chains (measured on lavapipe under load, alternating runs:
    // 4 chains 9.6, 8 chains 26, 16 chains 35-50, 32 chains 35-48 GFLOP/s: latency-bound below 16), an unrolled inner
    // loop, at most 60,000 loop iterations per invocation (CPU drivers end loops after 65,535); more workgroups than
    // cores or SMs. Grow the iterations, then the workgroups, until one run takes >= 20 ms; median of 5.
    {
        constexpr std::uint32_t chains = 16, unroll = 8, max_iterations = 60000;
        const std::uint32_t local = std::min<std::uint32_t>(64, info.max_workgroup_invocations);
        std::uint32_t groups = info.type == device_type::cpu ? 256 : 4096;
        const std::uint32_t max_groups = 1u << 16;
        buffer out = alloc.create(std::uint64_t{max_groups} * local * 4, memory_use::device, "ceiling");
        contract::ceiling_fma_spec spec{};
        spec.workgroup = local, spec.chains = chains, spec.unroll = unroll;
        static_assert(detail::row_matches<contract::ceiling_fma_push, contract::ceiling_fma_spec>(
            detail::shader_id::ceiling_fma, "s"));
        const pipeline& p = pipes.get(detail::shader_id::ceiling_fma, spec);
        ceiling_fma_push push{};
        push.iterations = 16;
        push.seed = 1.0f;
        auto run = [&] {
            const std::uint32_t grid[3] = {groups, 1, 1};
            return time_ms(exec, [&] { exec.dispatch(p, {{out.handle(), 0, out.size()}}, &push, grid); });
        };
        (void)run();  // compile and first touch
        double ms = run();
        while (ms < 20.0 && push.iterations < max_iterations) {
            push.iterations = std::min(push.iterations * 4, max_iterations);
            ms = run();
        }
        while (ms < 20.0 && groups < max_groups) {
            groups *= 2;
            ms = run();
        }
        std::vector<double> runs;
        for (int i = 0; i < 5; ++i) runs.push_back(run());
        const double flop =
            8.0 * chains * unroll * static_cast<double>(push.iterations) * static_cast<double>(groups) * local;
        c.fma_gflops = flop / (median(runs) * 1e6);
    }
    // Memory: copy a buffer of up to 256 MiB (bounded by the device's limits), median of 5.
    {
        std::uint64_t bytes =
            std::min<std::uint64_t>({256ull << 20, info.max_storage_buffer_range, info.device_local_memory / 4});
        if (info.type == device_type::cpu) bytes = std::min<std::uint64_t>(bytes, 64ull << 20);
        bytes = bytes / 4096 * 4096;
        buffer src = alloc.create(bytes, memory_use::device, "ceiling source");
        buffer dst = alloc.create(bytes, memory_use::device, "ceiling destination");
        static_assert(
            detail::row_matches<contract::ceiling_copy_push, detail::no_spec>(detail::shader_id::ceiling_copy, "ss"));
        const pipeline& p = pipes.get(detail::shader_id::ceiling_copy);
        ceiling_copy_push push{};
        push.count = static_cast<std::uint32_t>(bytes / 16);
        constexpr std::uint32_t wg = contract::CEILING_COPY_WORKGROUP;
        const std::uint32_t grid[3] = {(push.count + wg - 1) / wg, 1, 1};
        auto run = [&] {
            return time_ms(exec, [&] {
                exec.dispatch(p, {{src.handle(), 0, bytes}, {dst.handle(), 0, bytes}}, &push, grid);
            });
        };
        (void)run();  // first touch
        std::vector<double> runs;
        for (int i = 0; i < 5; ++i) runs.push_back(run());
        c.copy_gb_per_s = 2.0 * static_cast<double>(bytes) / (median(runs) * 1e6);
    }
    return c;
}

}  // namespace

testing::device_ceiling testing::measure_ceiling(context& ctx) {
    detail::device_core& core = *context_access::of(ctx).core;
    std::lock_guard lock(core.mutex);
    core.check_alive();
    return core.guarded("testing::measure_ceiling", [&] { return measure(core); });
}

}  // namespace qkv::vulkan
