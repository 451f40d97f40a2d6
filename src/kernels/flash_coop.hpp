// The cooperative-matrix family of the fused attention kernel (shaders/flash_coop.comp): its
// recording, for the fused route and the split-K decode route. Its tiles, gates and plan:
// flash_coop_plan.hpp.
#pragma once

#include <cstdint>

#include "kernels/flash_coop_plan.hpp"
#include "kernels/flash_io.hpp"
#include "vk/executor.hpp"
#include "vk/pipelines.hpp"

namespace qkv::vulkan::detail {

/// Records the fused kernel over every group (batch, K/V head) and row block, one dispatch per key
/// chunk. `stats`: the last chunk also stores each row's (max, sum) in io.state (for the weights).
/// `v_finite`: the caller knows every value of V is finite (or the call fails its range check), so
/// the pipeline without the careful path runs.
void record_flash_coop(recorder& exec, pipeline_set& pipes, const flash_layout& layout, const flash_coop_plan& plan,
                       const flash_io& io, bool stats, bool v_finite);

/// The split-K decode dispatch (its merge is the decode route's, kernels/sdpa_decode.hpp): keys
/// [kv_first, kv_end) in chunks of `chunk` keys; Q, K and V as float16 rows of the decode route's
/// layouts, whose element strides `layout` gives (q_off, k_off and v_off: the rows' first elements
/// in their bindings).
struct coop_decode_io {
    binding q, k, v, mask, additive, params, stats, acc;
    std::uint32_t q_off = 0, k_off = 0, v_off = 0;
};
void record_coop_decode(recorder& exec, pipeline_set& pipes, const flash_layout& layout, const coop_tiles& tiles,
                        std::uint32_t kv_first, std::uint32_t kv_end, std::uint32_t chunk, std::uint32_t chunks,
                        const coop_decode_io& io, bool v_finite);

}  // namespace qkv::vulkan::detail
