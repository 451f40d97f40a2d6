// scaled_dot_product_attention on the device (qkv::vulkan::context::sdpa): plan in, commands
// recorded. Lays q, k, v and the masks out in one upload, checks the device's limits, picks the
// fused kernel family, records the kernel (and the weights kernel on request) into one command
// buffer, submits once and reads the results back.
#pragma once

#include "api/dispatch.hpp"
#include "qkv/runtime/sdpa.hpp"

namespace qkv::vulkan::detail {

/// Runs a validated SDPA problem on env's device, reusing env's buffers. Throws limit_exceeded /
/// unavailable before any work is submitted, numeric_overflow when fp16 storage cannot hold an
/// input, out_of_memory, device_lost or error as run_attention does.
struct sdpa_run {
    sdpa_output output;
    double device_ms = 0;     ///< the whole command buffer (0 without timestamps)
    double attention_ms = 0;  ///< the kernels, without the upload
};
sdpa_run run_sdpa(dispatch_environment& env, const sdpa_problem& problem);

}  // namespace qkv::vulkan::detail
