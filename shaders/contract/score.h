// The host–shader contract of the score rules beyond PyTorch's SDPA (qkv/runtime/sdpa.hpp): softcap,
// ALiBi, the sliding window, sinks and the log-sum-exp, shared by every attention kernel that
// applies them (flash.comp, flash_cpu.comp, flash_weights.comp, sdpa_decode.comp, sdpa_merge.comp)
// through shaders/score_rules.glsl, and attention dropout (shaders/dropout.glsl), which the fused
// kernels and the backward kernels apply. See common.h for the convention.
//
// Which rules a call uses is a set of SCORE_* bits: a specialization constant of each kernel
// (FLASH_SPEC_FEATURES, FLASH_CPU_SPEC_FEATURES, DECODE_SPEC_FEATURES; a call without them builds
// no code for them), and score_params::features for the kernels that read it at run time
// (flash_weights.comp, sdpa_merge.comp). Their values travel in one storage buffer, the "params"
// binding of each kernel, written by the host once per call:
//
//   score_params                     48 bytes: the window's sides, the softcap, the features,
//                                    dropout's seed, offset, threshold and scale
//   vec2 heads[q_heads]              per query head h: (ALiBi slope of h, sink logit of h)
//
// The slopes are ggml's (qkv::alibi_slope, computed by the host in float64 and rounded once); a
// head without a sink has -inf. Window sides are -1 (unbounded) or at most kv_len + q_len.
#ifndef QKV_CONTRACT_SCORE_H
#define QKV_CONTRACT_SCORE_H

#include "common.h"

QKV_CONTRACT_BEGIN

struct score_params {
    int window_left, window_right;  // key j may be attended from position p = i + off when
                                    // p - window_left <= j <= p + window_right; -1: that side unbounded
    float softcap;                  // C > 0: s <- C·tanh(s / C)
    uint features;                  // SCORE_* below
    // Dropout (SCORE_DROPOUT; contract/philox.h, shaders/dropout.glsl): the 64-bit seed and offset
    // as (low, high) words, the keep threshold ceil(p·2^32) (qkv::dropout_threshold) and 1 / (1 - p).
    uint dropout_seed_lo, dropout_seed_hi;
    uint dropout_offset_lo, dropout_offset_hi;
    uint dropout_threshold;
    float dropout_scale;
    uint pad0, pad1;
};

QKV_CONST uint SCORE_SOFTCAP = 1u;   // s <- C·tanh(s / C), first
QKV_CONST uint SCORE_ALIBI = 2u;     // s <- s - slope_h·|i + off - j|, after the softcap
QKV_CONST uint SCORE_WINDOW = 4u;    // the sliding window (ANDed with causal and the masks)
QKV_CONST uint SCORE_SINKS = 8u;     // sink logits join each row's softmax denominator
QKV_CONST uint SCORE_LSE = 16u;      // the kernel writes each row's log-sum-exp (sinks not included)
QKV_CONST uint SCORE_DROPOUT = 32u;  // attention dropout: a weight is kept (scaled by 1 / (1 - p)) or dropped
QKV_CONST uint SCORE_FEATURES_ALL = 63u;

/// Bytes before the per-head values (vec2 per query head) in the params buffer.
QKV_CONST uint SCORE_PARAMS_HEAD_OFFSET = 48u;

QKV_CONTRACT_END

QKV_CONTRACT_CHECK(sizeof(qkv::contract::score_params) == qkv::contract::SCORE_PARAMS_HEAD_OFFSET)

#endif
