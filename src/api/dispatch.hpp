// The attention dispatcher: uploads a call's inputs, records the staged or fused stages for every
// batch element and head into one command buffer, submits once, and reads the results back.
#pragma once

#include "kernels/flash_cpu.hpp"
#include "kernels/range_guard.hpp"
#include "qkv/vulkan/problem.hpp"
#include "vk/executor.hpp"
#include "vk/memory.hpp"
#include "vk/pipelines.hpp"

namespace qkv::vulkan::detail {

/// Device buffers kept between calls. A buffer is reused while it is at least as large as a call
/// needs and at most twice as large; otherwise it is reallocated to fit, so memory follows the
/// calls' sizes in both directions.
struct buffer_cache {
    buffer inputs, staging_in, qkv, scores, concat, out, staging_out;
    buffer flash_state;           // the fused kernel's (max, sum) per row between key chunks, where needed
    range_guard_buffers guard;    // the range guard's result (range_guard.hpp)
    buffer flash_texels;          // the cpu kernel family's Q, K, V as texels
    flash_cpu_views flash_views;  // views of flash_texels, made per call
};

struct dispatch_environment {
    const device& dev;
    allocator& alloc;
    pipeline_set& pipes;
    executor& exec;
    buffer_cache& buffers;
    bool force_staging = false;
    std::uint32_t max_fused_keys = 0;             ///< context_options::max_fused_keys_per_dispatch
    const device_info* fused_tiles_as = nullptr;  ///< context_options::fused_tiles_as
};

/// A call's result and its device times (0 without timestamps).
struct attention_run {
    attention_output output;
    double device_ms = 0;                                                  ///< the whole command buffer
    double projection_ms = 0, attention_ms = 0, output_projection_ms = 0;  ///< its phases
    bool range_guard = false;  ///< whether the range guard ran on the device (range_guard.hpp)
};

/// Runs a validated problem. Throws limit_exceeded / unavailable before any work is submitted,
/// out_of_memory if a buffer cannot be allocated, device_lost or error if the device fails.
attention_run run_attention(dispatch_environment& env, const attention_problem& problem);

}  // namespace qkv::vulkan::detail
