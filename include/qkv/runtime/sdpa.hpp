// scaled_dot_product_attention over tensors the caller already holds: PyTorch's
// F.scaled_dot_product_attention(q, k, v, attn_mask, is_causal, scale, enable_gqa) semantics, for
// the float64 CPU backend (qkv::cpu::sdpa) and the Vulkan backend (qkv::vulkan::context::sdpa).
//
// Shapes (row-major, contiguous):
//   q  batch x q_heads  x q_len  x d_qk        (B, Hq, L, E)
//   k  batch x kv_heads x kv_len x d_qk        (B, Hkv, S, E)
//   v  batch x kv_heads x kv_len x d_v         (B, Hkv, S, Ev)
//   output  batch x q_heads x q_len x d_v      (B, Hq, L, Ev)
//   weights batch x q_heads x q_len x kv_len   (B, Hq, L, S), on request
// The 3-D (H, ·, ·) and 2-D (·, ·) forms are batch = 1 (and heads = 1).
//
// Grouped-query attention: kv_heads divides q_heads; query head h uses K/V head
// h / (q_heads / kv_heads), as PyTorch's enable_gqa=True (repeat_interleave of K and V).
//
// score(b, h, i, j) = scale · q[b, h, i] · k[b, h / g, j]  (+ additive_mask, broadcast)
//   scale defaults to 1 / sqrt(d_qk).
//   mask (bool, 1 = may attend) and additive_mask (float, added to the scaled score; -inf masks)
//   have any shape that broadcasts NumPy-style to (B, Hq, L, S): mask_shape lists the mask's
//   dimensions (at most 4; missing leading dimensions are 1; each is 1 or the target's).
//   causal keeps j <= i + offset: offset 0 with causal_alignment::top_left (PyTorch's is_causal,
//   tril(ones(L, S))), S - L with bottom_right (tril(ones(L, S), S - L), the KV-cache convention:
//   the last query sees every key). Causal and the masks combine: a key must pass all of them.
// A row left with no key to attend to gets zero weights and a zero output (PyTorch gives NaN).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "qkv/causal.hpp"
#include "qkv/runtime/export.hpp"
#include "qkv/runtime/problem.hpp"

namespace qkv {

struct sdpa_shape {
    std::size_t batch = 1;     ///< B
    std::size_t q_heads = 1;   ///< Hq
    std::size_t kv_heads = 1;  ///< Hkv, divides q_heads
    std::size_t q_len = 0;     ///< L, queries per head
    std::size_t kv_len = 0;    ///< S, keys and values per head
    std::size_t d_qk = 0;      ///< E, width of queries and keys
    std::size_t d_v = 0;       ///< Ev, width of values and of the output

    /// Query heads per K/V head (q_heads / kv_heads).
    [[nodiscard]] constexpr std::size_t group() const { return kv_heads ? q_heads / kv_heads : 0; }
    friend constexpr bool operator==(const sdpa_shape&, const sdpa_shape&) = default;
};

/// Where the causal diagonal starts: top_left (query i sees keys j <= i, PyTorch's is_causal=True)
/// or bottom_right (j <= i + kv_len - q_len: the last query sees every key). The core's
/// qkv::causal_mode (qkv/causal.hpp) under the run-time API's name: one enum, so
/// `causal_alignment::bottom_right` and `causal_mode::bottom_right` are the same value. Its third
/// value, `none`, is not an alignment: validate() refuses it (say "no causal mask" with
/// `causal = false`).
using causal_alignment = causal_mode;

struct sdpa_options {
    std::optional<float> scale{};  ///< multiplies q·k; default 1/sqrt(d_qk)
    bool causal = false;
    causal_alignment alignment = causal_alignment::top_left;
    bool return_weights = false;                           ///< also return the attention probabilities (B, Hq, L, S)
    qkv::precision precision = precision::fp32;            ///< Vulkan: storage of q, k, v
    qkv::kernel_family kernel = kernel_family::automatic;  ///< Vulkan: which kernel family runs
};

/// An SDPA problem over host data of element type T (float; double for the CPU backend's float64
/// path). Spans are read during the call only.
template <class T>
struct basic_sdpa_problem {
    sdpa_shape shape{};
    std::span<const T> q{}, k{}, v{};
    std::span<const std::uint8_t> mask{};  ///< 0/1, shape mask_shape
    std::span<const T> additive_mask{};    ///< shape mask_shape
    /// The dimensions of whichever mask is given (both masks, if both are given), outermost
    /// first, at most 4. Empty with a mask: the mask is L x S.
    std::vector<std::size_t> mask_shape{};
    sdpa_options options{};
};
using sdpa_problem = basic_sdpa_problem<float>;
using sdpa_problem_f64 = basic_sdpa_problem<double>;

template <class T>
struct basic_sdpa_output {
    std::vector<T> output;   ///< batch x q_heads x q_len x d_v
    std::vector<T> weights;  ///< batch x q_heads x q_len x kv_len, when options.return_weights
    sdpa_shape shape{};
    qkv::kernel_family kernel = kernel_family::automatic;  ///< Vulkan: the family that ran
    std::string device;                                    ///< which device (or "cpu reference") ran it
};
using sdpa_output = basic_sdpa_output<float>;
using sdpa_output_f64 = basic_sdpa_output<double>;

/// Throws qkv::invalid_argument naming the inputs and their shapes when the problem is not
/// well-formed: a zero dimension, kv_heads not dividing q_heads, a span whose size does not fit its
/// shape, a mask that does not broadcast to (B, Hq, L, S), a mask value other than 0/1, a
/// non-finite scale (any finite scale is valid, negative and zero included, as PyTorch's), a size
/// product that overflows.
QKV_RUNTIME_API void validate(const sdpa_problem& problem);
QKV_RUNTIME_API void validate(const sdpa_problem_f64& problem);

/// The scale used when options.scale is not set: 1/sqrt(d_qk).
[[nodiscard]] QKV_RUNTIME_API float default_scale(const sdpa_shape& shape);

/// Element strides of a mask of shape `mask_shape` broadcast to (B, Hq, L, S): stride 0 along
/// every broadcast dimension. Throws qkv::invalid_argument if it does not broadcast.
struct mask_strides {
    std::size_t batch = 0, head = 0, row = 0, col = 0;
};
[[nodiscard]] QKV_RUNTIME_API mask_strides broadcast_strides(const std::vector<std::size_t>& mask_shape,
                                                             const sdpa_shape& shape);

/// The causal offset: key j is visible from query i when j <= i + offset (may be negative):
/// kv_len - q_len for bottom_right, 0 otherwise.
[[nodiscard]] constexpr std::ptrdiff_t causal_offset(const sdpa_shape& shape, causal_alignment alignment) {
    return alignment == causal_alignment::bottom_right
               ? static_cast<std::ptrdiff_t>(shape.kv_len) - static_cast<std::ptrdiff_t>(shape.q_len)
               : 0;
}

}  // namespace qkv
