// The backward pass of scaled_dot_product_attention (qkv/runtime/sdpa.hpp): the gradients of a
// loss with respect to q, k, v, the sinks and the additive mask, given the forward problem, the
// forward's saved output and log-sum-exp, and the loss's gradient d_out of the output. Computed by
// qkv::cpu::sdpa_backward (qkv/runtime/cpu.hpp), the float64 reference.
//
// Shapes (row-major, contiguous), as the forward's:
//   out, d_out   batch x q_heads x q_len x d_v     (B, Hq, L, Ev)
//   lse          batch x q_heads x q_len           (B, Hq, L)
//   dq           (B, Hq, L, E);   dk (B, Hkv, S, E);   dv (B, Hkv, S, Ev)
//   d_sinks      (Hq,), when the problem has sinks
//   d_additive_mask  the additive mask's own shape (mask_shape), when asked
//
// FlashAttention-2's algorithm, for the row i of query head h (batch element b) with the forward's
// scores s_ij over its allowed keys J_i (qkv/runtime/sdpa.hpp: every mask, the causal rule, the
// window, s != -inf), scale c, the head's sink σ_h and dropout's z_ij (qkv/dropout.hpp):
//   lse'   = log(e^lse + e^σ_h)                    (lse without a sink)
//   P_ij   = e^(s_ij - lse'),   Z_ij = z_ij / (1 - p)   (Z = 1 without dropout)
//   dP_ij  = Z_ij · d_out_i · v_j,   D_i = d_out_i · out_i  (= Σ_j P_ij dP_ij)
//   dS_ij  = P_ij · (dP_ij - D_i)                  the gradient of the logit s_ij
//   dR_ij  = dS_ij · (1 - tanh²(r_ij / C))          through the softcap (r = c · q_i · k_j); dS without
//   dq_i   = c · Σ_{j∈J_i} dR_ij · k_j
//   dk_j   = c · Σ_{h, i: j∈J_i} dR_ij · q_i       (over the query heads h of k's K/V head)
//   dv_j   = Σ_{h, i: j∈J_i} P_ij · Z_ij · d_out_i
//   dσ_h   = -Σ_{b, i} P_σ,i · D_i,   P_σ,i = e^(σ_h - lse'_i)
//   d_additive_mask = Σ dS over the dimensions the mask broadcasts along (PyTorch's gradient of a
//                     broadcast attn_mask), 0 where a key is masked (its -inf entries included)
// The ALiBi bias is a constant (no gradient for the slopes); a masked key gets no gradient and
// passes none; a row with no key gets zero gradients (as its forward is zero whatever q).
// The order of every sum is fixed (keys ascending for dq; query heads, then rows ascending for
// dk, dv; batch, then rows for dσ; (b, h, i) ascending for the mask), whatever the thread count:
// the same inputs give the same bits.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "qkv/runtime/export.hpp"
#include "qkv/runtime/sdpa.hpp"

namespace qkv {

/// A backward problem over host data of element type T (float; double for the float64 path).
/// Spans are read during the call only.
template <class T>
struct basic_sdpa_backward_problem {
    /// The forward call: shape, q, k, v, masks, sinks and options, dropout included (the same
    /// seed and offset give the same mask). return_weights, return_lse, precision and kernel are
    /// not used.
    basic_sdpa_problem<T> forward{};
    /// The forward's output (B, Hq, L, Ev), for D = rowsum(d_out ∘ out). Empty: recomputed here
    /// in float64.
    std::span<const T> out{};
    /// The forward's log-sum-exp (B, Hq, L), sinks not included (-inf for a row with no key), for
    /// P = e^(s - lse'). Empty: recomputed here in float64.
    std::span<const T> lse{};
    /// The loss's gradient with respect to the output (B, Hq, L, Ev). A NaN or infinite element is
    /// taken, as the forward takes NaN inputs: it poisons the gradients its row reaches (so that a
    /// gradient scaler sees an overflowed fp16 loss).
    std::span<const T> d_out{};
    /// Also return the additive mask's gradient (in its shape; the problem must have one).
    bool return_d_additive_mask = false;
};
using sdpa_backward_problem = basic_sdpa_backward_problem<float>;
using sdpa_backward_problem_f64 = basic_sdpa_backward_problem<double>;

template <class T>
struct basic_sdpa_gradients {
    std::vector<T> dq;               ///< (B, Hq, L, E)
    std::vector<T> dk;               ///< (B, Hkv, S, E), summed over each K/V head's query heads
    std::vector<T> dv;               ///< (B, Hkv, S, Ev), likewise
    std::vector<T> d_sinks;          ///< (Hq,), when the problem has sinks
    std::vector<T> d_additive_mask;  ///< the mask's shape, when return_d_additive_mask
    sdpa_shape shape{};
    std::string device;  ///< which device (or "cpu reference") computed them
};
using sdpa_gradients = basic_sdpa_gradients<float>;
using sdpa_gradients_f64 = basic_sdpa_gradients<double>;

/// Throws qkv::invalid_argument naming the input when the backward problem is not well-formed:
/// every check of validate(forward); d_out not of the output's size (B·Hq·L·Ev); out or lse
/// neither empty nor of their sizes; an lse of +inf (beyond float32's range: the saved result
/// cannot be exact); return_d_additive_mask without an additive mask.
/// (That out and lse are the forward's results is checked while computing: qkv::cpu::sdpa_backward.)
QKV_RUNTIME_API void validate(const sdpa_backward_problem& problem);
QKV_RUNTIME_API void validate(const sdpa_backward_problem_f64& problem);

/// Every check of validate() but those of the data, whose spans must all be empty (the forward's
/// q, k and v, and out, lse and d_out): the description of a backward call over device tensors
/// (qkv::vulkan::sdpa_backward_call), with its shape, options, masks and sinks.
QKV_RUNTIME_API void validate_description(const sdpa_backward_problem& problem);

}  // namespace qkv
