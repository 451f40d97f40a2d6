// One call of a fused attention kernel, as both kernel families (flash_gpu, flash_cpu) and the
// weights kernel see it: shapes, element strides of every tensor, the masks' broadcast strides,
// the causal offset and the scale. The attention plan (plan/attention_plan.cpp) describes its
// projected Q|K|V rows this way, the sdpa plan (plan/sdpa_plan.cpp) its (B, H, L, E) tensors. The
// buffers the kernels bind: flash_io.hpp.
#pragma once

#include <cstdint>

#include "contract/flash.h"

namespace qkv::vulkan::detail {

/// Element strides of a (batch, head, row, column) tensor; columns are contiguous.
struct tensor_strides {
    std::uint32_t bs = 0, hs = 0, rs = 0;
};

struct flash_layout {
    std::uint32_t batch = 1, heads = 1, kv_heads = 1;  ///< B, Hq, Hkv (Hkv divides Hq)
    std::uint32_t q_len = 0, kv_len = 0;               ///< L, S
    std::uint32_t d = 0, dv = 0;                       ///< E (Q, K), Ev (V, O)
    tensor_strides q, k, v, o;
    std::uint32_t k_off = 0, v_off = 0;                    ///< first element of K and V in the Q|K|V binding (Q at 0)
    std::uint32_t m_bs = 0, m_hs = 0, m_rs = 0, m_cs = 0;  ///< mask strides (0 = broadcast)
    std::uint32_t a_bs = 0;  ///< the additive mask's batch stride (m_bs unless the masks differ there)
    bool causal = false, mask = false, additive = false;
    std::int32_t causal_offset = 0;  ///< key j is visible from row i when j <= i + causal_offset
    float scale = 1.0f;
    bool fp16 = false;  ///< the Q|K|V binding holds float16
    /// contract/score.h's SCORE_* rules: the kernels' FEATURES constant; their values are in
    /// flash_io::params.
    std::uint32_t features = 0;

    [[nodiscard]] std::uint32_t group() const { return heads / kv_heads; }
    [[nodiscard]] std::uint32_t q_batches() const { return batch * heads; }
    [[nodiscard]] std::uint32_t kv_batches() const { return batch * kv_heads; }
    /// The kernels take the output's batch stride to be heads·L·Ev.
    [[nodiscard]] bool output_contiguous_per_batch() const {
        return std::uint64_t{o.bs} == std::uint64_t{heads} * q_len * dv;
    }
    [[nodiscard]] std::uint32_t mask_flags() const {
        return (causal ? contract::MASK_FLAG_CAUSAL : 0u) | (mask ? contract::MASK_FLAG_BOOLEAN : 0u) |
               (additive ? contract::MASK_FLAG_ADDITIVE : 0u);
    }
    /// The push block of flash.comp and flash_weights.comp (keys: all of them; no chunk flags).
    [[nodiscard]] contract::flash_push push() const {
        contract::flash_push p{};
        p.q_len = q_len, p.kv_len = kv_len, p.d = d, p.dv = dv;
        p.q_bs = q.bs, p.q_hs = q.hs, p.q_rs = q.rs;
        p.k_bs = k.bs, p.k_hs = k.hs, p.k_rs = k.rs;
        p.v_bs = v.bs, p.v_hs = v.hs, p.v_rs = v.rs;
        p.a_bs = a_bs, p.o_hs = o.hs, p.o_rs = o.rs;  // o.bs is heads·L·Ev (checked by the planners)
        p.k_off = k_off, p.v_off = v_off;
        p.heads = heads, p.group = group();
        p.causal_offset = causal_offset;
        p.m_bs = m_bs, p.m_hs = m_hs, p.m_rs = m_rs, p.m_cs = m_cs;
        p.scale = scale;
        p.flags = mask_flags();
        p.kv_begin = 0, p.kv_stop = kv_len;
        return p;
    }
};

/// One dispatch per key chunk of `chunk_keys` keys (one dispatch for no keys): calls
/// `dispatch(push, first)` with `push` covering the chunk, its chunking flags set (FLASH_RESUME
/// after the first, FLASH_PARTIAL before the last, FLASH_STATS on the last where `stats`).
template <class Push, class Dispatch>
void for_each_key_chunk(const Push& push, std::uint32_t kv_len, std::uint32_t chunk_keys, bool stats,
                        Dispatch&& dispatch) {
    for (std::uint32_t begin = 0; begin < (kv_len > 0 ? kv_len : 1u); begin += chunk_keys) {
        Push part = push;
        part.kv_begin = begin;
        part.kv_stop = kv_len - begin < chunk_keys ? kv_len : begin + chunk_keys;
        if (begin > 0) part.flags |= contract::FLASH_RESUME;
        if (part.kv_stop < kv_len)
            part.flags |= contract::FLASH_PARTIAL;
        else if (stats)
            part.flags |= contract::FLASH_STATS;
        dispatch(part, begin == 0);
    }
}

}  // namespace qkv::vulkan::detail
