#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : enable
// The attention weights of scaled_dot_product_attention on request, without an L x S staging
// pass: the fused kernel (flash.comp or flash_cpu.comp, with FLASH_STATS) has stored each row's
// final softmax statistics (m, l) in `state`; this kernel recomputes one score per invocation and
// writes weights(b, h, i, j) = exp(scale·q_i·k_j + mask - m) / l, the same normalisation the
// output used (with a sink, exp(score - m) / (l + exp(sink - m))). The score rules are
// score_rules.glsl's, with the call's features read from the params buffer (score_params::features).
// 0 where the key is masked and for a row with nothing to attend to (l = 0); NaN for a poisoned row
// (m stored as NaN). With dropout, a dropped weight is negated (FlashAttention's return_attn_probs).
// Weights are (batch, heads, L, S), contiguous.
//
// The grid: x = key blocks of FLASH_WEIGHTS_WORKGROUP, y = query rows, z = batch · heads. The only
// loop runs over the E columns of one q·k (the host keeps E far below llvmpipe's 65,535
// iterations per invocation).
#include "precision.glsl"
#include "contract/flash.h"
#include "contract/score.h"
#define QKV_SCORE_PARAMS_BINDING FLASH_WEIGHTS_BINDING_PARAMS
#include "score_rules.glsl"
#include "contract/philox.h"
#include "dropout.glsl"

layout(local_size_x = FLASH_WEIGHTS_WORKGROUP, local_size_y = 1, local_size_z = 1) in;

layout(std430, binding = FLASH_WEIGHTS_BINDING_QKV) readonly buffer QKV { QKV_T qkv[]; };
layout(std430, binding = FLASH_WEIGHTS_BINDING_MASK) readonly buffer MaskBits { uint mask_bits[]; };
layout(std430, binding = FLASH_WEIGHTS_BINDING_ADDITIVE) readonly buffer Additive { float additive[]; };
layout(std430, binding = FLASH_WEIGHTS_BINDING_STATE) readonly buffer State { float state[]; };
layout(std430, binding = FLASH_WEIGHTS_BINDING_OUT) writeonly buffer Weights { float weights[]; };

layout(push_constant) uniform Push { flash_push pc; };

void main() {
    const uint j = (gl_WorkGroupID.x + pc.group_x) * FLASH_WEIGHTS_WORKGROUP + gl_LocalInvocationID.x;
    const uint i = gl_WorkGroupID.y + pc.group_y;
    const uint z = gl_WorkGroupID.z + pc.group_z;
    if (j >= pc.kv_len || i >= pc.q_len) return;
    const uint batch = z / pc.heads, head = z % pc.heads, kv_head = head / pc.group;
    const uint out_at = (z * pc.q_len + i) * pc.kv_len + j;

    const float m = state[2u * (z * pc.q_len + i)], l = state[2u * (z * pc.q_len + i) + 1u];
    const uint masks = pc.flags & (MASK_FLAG_CAUSAL | MASK_FLAG_BOOLEAN | MASK_FLAG_ADDITIVE);
    const score_params sp = score_in;
    const int p = int(i) + pc.causal_offset;
    const uint features = sp.features;
    const int d = int(j) - p;
    const uint mi = head * pc.m_hs + i * pc.m_rs + j * pc.m_cs, bit = batch * pc.m_bs + mi;
    bool allowed = (masks & MASK_FLAG_CAUSAL) == 0u || d <= 0;
    if ((features & SCORE_WINDOW) != 0u) allowed = allowed && window_admits(d, sp);
    if ((masks & MASK_FLAG_BOOLEAN) != 0u) allowed = allowed && ((mask_bits[bit >> 5] >> (bit & 31u)) & 1u) != 0u;
    if (isnan(m) || isnan(l)) {  // a poisoned row (a NaN or +inf score): NaN, as its output
        weights[out_at] = uintBitsToFloat(0x7fc00000u);
        return;
    }
    if (!allowed || l == 0.0) {
        weights[out_at] = 0.0;
        return;
    }
    const uint q_at = batch * pc.q_bs + head * pc.q_hs + i * pc.q_rs;
    const uint k_at = pc.k_off + batch * pc.k_bs + kv_head * pc.k_hs + j * pc.k_rs;
    float dot_qk = 0.0;
    for (uint c = 0; c < pc.d; ++c) dot_qk += (float(qkv[q_at + c]) * pc.scale) * float(qkv[k_at + c]);
    const float slope = (features & SCORE_ALIBI) != 0u ? head_values[head].x : 0.0;
    const float add = (masks & MASK_FLAG_ADDITIVE) != 0u ? additive[batch * pc.a_bs + mi] : 0.0;
    const float score = rule_score(dot_qk, d, nearest_key_distance(p, pc.kv_len), features, masks, sp, slope, true, add);
    float w = 0.0;
    if (score != score_neg_inf()) {
        if ((features & SCORE_SINKS) != 0u)  // the sink meets ALiBi's relative scores (score_rules.glsl)
            w = exp(score - m) *
                row_normaliser(m, l, features, head_values[head].y + alibi_drop(p, pc.kv_len, features, sp, slope));
        else
            w = exp(score - m) / l;
        // FlashAttention's return_attn_probs: a dropped weight negated (its sign bit set)
        if ((features & SCORE_DROPOUT) != 0u && !dropout_keeps(z * pc.q_len + i, j, sp)) w = -w;
    }
    weights[out_at] = w;
}
