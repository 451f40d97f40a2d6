// The call skeleton: every operation (run_attention, run_sdpa, run_decode) is the same short list
// of named steps over a call_session:
//
//   plan      a pure function of the problem's shapes and options, the device description and the
//             settings (plan.hpp, sdpa_plan.hpp): routes, kernels, tiles, buffer sizes, downloads
//   check     the host's part of the overflow rule (range_guard.hpp, sdpa_guard.hpp)
//   prepare   call_session(env, plan.buffers, plan.downloads): the buffers, by role (call_io.hpp)
//   write     the inputs packed at the plan's offsets (call_io.hpp's put_*)
//   record    begin() (the upload), the operation's kernels, finish() (the download), submit
//   read      read() each download; the verdicts after the readback; assemble the result
//
// context.cpp holds the lock, the device-loss bookkeeping and the statistics around each.
#pragma once

#include <span>

#include "api/call_io.hpp"
#include "api/device_core.hpp"
#include "api/sdpa_guard.hpp"
#include "api/sdpa_plan.hpp"
#include "kernels/settings.hpp"
#include "qkv/vulkan/problem.hpp"

namespace qkv::vulkan::detail {

/// What a run works with: the shared device, the context's settings and buffers.
struct call_env {
    device_core& core;
    const settings& set;
    call_buffers& buffers;
};

/// Device times of a call's phases (0 without timestamps).
struct phase_times {
    double device_ms = 0;  ///< the whole command buffer
    double projection_ms = 0, attention_ms = 0, output_projection_ms = 0;
    bool device_range_check = false;  ///< the attention's range guard ran on the device
};

template <class Output>
struct call_run {
    Output output;
    phase_times times;
};

/// One call's command buffer over the context's buffers.
class call_session {
public:
    /// Prepares the buffers the plan asks for (call_buffers::prepare).
    call_session(call_env& env, const buffer_plan& buffers, std::span<const download> downloads);

    /// Where the inputs are written before begin().
    [[nodiscard]] std::byte* inputs() const { return env_.buffers.inputs(); }
    /// Starts the command buffer with the upload of the inputs; marks "inputs on the device".
    void begin();
    /// Ends a phase (a timestamp; see executor::mark).
    void mark() { exec().mark(); }
    /// Records the download, submits, waits; returns the device time and each phase's (from the
    /// marks: inputs, then the phases in order).
    phase_times submit();
    /// After submit(): the bytes of download i.
    void read(std::size_t i, void* to) const { env_.buffers.read(downloads_, i, to); }

    [[nodiscard]] executor& exec() const { return *env_.core.exec; }
    [[nodiscard]] pipeline_set& pipes() const { return *env_.core.pipes; }
    [[nodiscard]] const device& dev() const { return *env_.core.dev; }
    [[nodiscard]] call_buffers& buffers() const { return env_.buffers; }

private:
    call_env& env_;
    buffer_plan plan_;
    std::span<const download> downloads_;
};

call_run<attention_output> run_attention(call_env& env, const attention_problem& problem);

/// Q, K and V from the host: plan_sdpa's route, fused or decode.
call_run<sdpa_output> run_sdpa(call_env& env, const sdpa_problem& problem);

/// K and V of a kv_cache (kv_cache.cpp), as the decode kernels read them: texel views, or (q8_0,
/// q4_0) the blocks' storage bindings.
struct cache_kv {
    VkBufferView k = VK_NULL_HANDLE, v = VK_NULL_HANDLE;
    binding k_blocks{}, v_blocks{};
    cache_desc desc;
    const kv_stats* stats = nullptr;
};

/// The decode route of a planned call: K and V from the host (packed into the inputs, `cache`
/// null) or from a cache.
call_run<sdpa_output> run_decode(call_env& env, const sdpa_plan& plan, const sdpa_problem& problem,
                                 const cache_kv* cache);

/// The fused route of a planned call (run_sdpa.cpp).
call_run<sdpa_output> run_fused_sdpa(call_env& env, const sdpa_plan& plan, const sdpa_problem& problem);

}  // namespace qkv::vulkan::detail
