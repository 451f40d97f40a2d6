// scaled_dot_product_attention over tensors the caller already holds: PyTorch's
// F.scaled_dot_product_attention(q, k, v, attn_mask, is_causal, scale, enable_gqa) semantics, and
// the attention of today's models beyond it (sliding windows, sinks, softcap, ALiBi, quantized
// K/V, log-sum-exp), for the float64 CPU backend (qkv::cpu::sdpa) and the Vulkan backend
// (qkv::vulkan::context::sdpa).
//
// Shapes (row-major, contiguous):
//   q  batch x q_heads  x q_len  x d_qk        (B, Hq, L, E)
//   k  batch x kv_heads x kv_len x d_qk        (B, Hkv, S, E)
//   v  batch x kv_heads x kv_len x d_v         (B, Hkv, S, Ev)
//   sinks   q_heads                            (Hq,), optional
//   output  batch x q_heads x q_len x d_v      (B, Hq, L, Ev)
//   weights batch x q_heads x q_len x kv_len   (B, Hq, L, S), on request
//   lse     batch x q_heads x q_len            (B, Hq, L), on request
// The 3-D (H, ·, ·) and 2-D (·, ·) forms are batch = 1 (and heads = 1).
//
// Grouped-query attention: kv_heads divides q_heads; query head h uses K/V head
// h / (q_heads / kv_heads), as PyTorch's enable_gqa=True (repeat_interleave of K and V).
//
// The score of query i and key j of query head h, with off = 0 (alignment top_left) or S - L
// (bottom_right), in this order:
//   s = scale · q_i · k_j                     scale defaults to 1 / sqrt(d_qk); any finite value
//   s = C · tanh(s / C)                       softcap C > 0 (0: off)
//   s = s - slope_h · |i + off - j|           ALiBi, alibi_max_bias b > 0 (0: off); with
//                                             n = 2^floor(log2 Hq), m0 = 2^(-b/n), m1 = 2^(-b/(2n)):
//                                             slope_h = m0^(h+1) for h < n, else m1^(2(h-n)+1);
//                                             or the slopes given, alibi_slopes (one per query
//                                             head, FlashAttention's alibi_slopes)
//   s = s + additive_mask                     broadcast; an entry of -inf masks
// Key j may be attended by query i when it passes every rule given (AND):
//   mask (bool, 1 = may attend)               broadcast
//   causal                                    j <= i + off (top_left: PyTorch's is_causal,
//                                             tril(ones(L, S)); bottom_right: tril(ones(L, S), S - L),
//                                             the KV-cache convention: the last query sees every key)
//   window (window_left, window_right)        i + off - window_left <= j <= i + off + window_right,
//                                             -1 leaving that side unbounded (FlashAttention's
//                                             window_size); off comes from `alignment` whether or
//                                             not `causal` is set
//   s != -inf
// Masks have any shape that broadcasts NumPy-style to (B, Hq, L, S): mask_shape lists the mask's
// dimensions (at most 4; missing leading dimensions are 1; each is 1 or the target's).
//
// With the allowed scores s_j of a row and m = max_j s_j:
//   without sinks:  w_j = e^(s_j - m) / Σ_j e^(s_j - m),   output = Σ_j w_j · v_j
//   with sinks:     one logit σ_h per query head joins the denominator and attends to nothing:
//                   M = max(m, σ_h),  w_j = e^(s_j - M) / (Σ_j e^(s_j - M) + e^(σ_h - M))
//                   (the weights of a row then sum to less than one)
//   lse = log Σ_j e^(s_j) = m + log Σ_j e^(s_j - m), sinks not included
// A row left with no key to attend to gets zero weights, a zero output (PyTorch gives NaN) and
// lse = -inf, sinks or not. A NaN or +inf among a row's allowed scores makes its weights, output
// and lse NaN (as PyTorch); a masked key contributes nothing, even a NaN value.
// Dropout (dropout_p > 0): output = Σ_j z_ij · w_ij / (1 - p) · v_j with qkv/dropout.hpp's z; the
// weights returned are w_ij, negated where z_ij = 0; lse unchanged.
// The gradients: qkv/runtime/sdpa_backward.hpp.
// Partial results over disjoint key sets merge into the whole: merge_attention below.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "qkv/causal.hpp"
#include "qkv/runtime/element_type.hpp"
#include "qkv/runtime/export.hpp"
#include "qkv/runtime/options.hpp"
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

/// Calls f(name, member) for every dimension of `s` (an sdpa_shape, const or not), in order: the
/// one list of the shape's fields, for the code that moves or compares shapes (qkv::mpi's wire).
template <class Shape, class F>
requires std::is_same_v<std::remove_const_t<Shape>, sdpa_shape>
constexpr void visit_shape(Shape& s, F&& f) {
    f("batch", s.batch);
    f("q_heads", s.q_heads);
    f("kv_heads", s.kv_heads);
    f("q_len", s.q_len);
    f("kv_len", s.kv_len);
    f("d_qk", s.d_qk);
    f("d_v", s.d_v);
}
static_assert(sizeof(sdpa_shape) == 7 * sizeof(std::size_t), "a dimension added to sdpa_shape belongs in visit_shape");

// sdpa_options (qkv/runtime/options.hpp, one row each in qkv/runtime/sdpa_options.def): scale,
// causal, alignment (off: 0 for top_left, kv_len - q_len for bottom_right), return_weights,
// precision and kernel (the Vulkan backend's storage of q and its kernel family), window_left and
// window_right, softcap, alibi_max_bias, return_lse, and
//   kv_type          how K and V are stored on the device: f32, f16, q8_0 or q4_0 (d_qk and d_v
//                    multiples of 32 for the last two). Unset: as `precision` says (fp32: f32,
//                    fp16: f16); see stored_kv_type. The CPU backend, which ignores `precision`,
//                    computes from K and V as the device would store them when kv_type is set
//                    (round_trip through that type).
//   position_offset  off given explicitly: query i sits at key position i + position_offset, for
//                    the causal rule, the window and ALiBi's distances, in place of the
//                    alignment's. For a block of a longer sequence (queries from position qa,
//                    keys from ka, of a whole whose off is o: position_offset = qa + o - ka), as
//                    context parallelism (qkv::mpi) computes its blocks. |position_offset| <= 2^62.
//   dropout_p, dropout_seed, dropout_offset
//                    attention dropout, PyTorch's dropout_p (qkv/dropout.hpp defines the mask):
//                    each weight is kept with probability 1 - dropout_p and scaled by
//                    1 / (1 - dropout_p), or dropped. The mask is Philox4x32-10's under the 64-bit
//                    dropout_seed, for row (b·Hq + h)·L + i and key j, from counter
//                    dropout_offset + ⌊j / 4⌋; the lse and the sinks are not affected; returned
//                    weights are the probabilities, a dropped one negated (FlashAttention's
//                    return_attn_probs). 0 <= dropout_p < 1; 0: off.

/// The element type K and V are stored in on the device: options.kv_type, or f16 for
/// precision::fp16 and f32 otherwise.
[[nodiscard]] constexpr element_type stored_kv_type(const sdpa_options& options) {
    if (options.kv_type) return *options.kv_type;
    return options.precision == precision::fp16 ? element_type::f16 : element_type::f32;
}

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
    /// Empty, or one logit per query head (q_heads values): joins every row's softmax
    /// denominator, attends to nothing. Each is finite or -inf (-inf: no sink for that head);
    /// NaN and +inf are refused.
    std::span<const T> sinks{};
    /// Empty, or one ALiBi slope per query head (q_heads values), given rather than derived
    /// (FlashAttention's alibi_slopes): s <- s - alibi_slopes[h] · |i + off - j|, in the place of
    /// alibi_max_bias's slopes (the two are not given together). Each is finite and at least 0.
    std::span<const T> alibi_slopes{};
};
using sdpa_problem = basic_sdpa_problem<float>;
using sdpa_problem_f64 = basic_sdpa_problem<double>;

template <class T>
struct basic_sdpa_output {
    std::vector<T> output;   ///< batch x q_heads x q_len x d_v
    std::vector<T> weights;  ///< batch x q_heads x q_len x kv_len, when options.return_weights
    /// batch x q_heads x q_len, when options.return_lse: log Σ_j e^(s_j) over the keys the row may
    /// attend, sinks not included; -inf for a row with none, NaN for a row a NaN poisons.
    std::vector<T> lse;
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
/// product that overflows; an option out of its range, naming it: alignment none or unknown,
/// window_left or window_right below -1, softcap or alibi_max_bias negative or not finite, an
/// unknown kv_type, a quantized kv_type (q8_0, q4_0) with d_qk or d_v not a multiple of 32, a
/// dropout_p outside [0, 1); sinks other than empty or q_heads values, or a sink that is NaN or +inf;
/// alibi_slopes other than empty or q_heads values, a slope that is negative or not finite, or
/// alibi_slopes with alibi_max_bias.
QKV_RUNTIME_API void validate(const sdpa_problem& problem);
QKV_RUNTIME_API void validate(const sdpa_problem_f64& problem);

/// Every check of validate() but those of the k and v spans, which must be empty: for a call
/// whose K and V are held elsewhere (a device K/V cache of shape.kv_len rows), checked against
/// the same shape (kv_len >= 1, d_qk, d_v, kv_heads as the K/V store has them).
QKV_RUNTIME_API void validate_queries(const sdpa_problem& problem);
QKV_RUNTIME_API void validate_queries(const sdpa_problem_f64& problem);

/// Every check of validate() but those of the q, k and v spans, which must all be empty: the
/// description of a call whose data lives on a device (qkv::vulkan::sdpa_call), with its shape,
/// options, masks and sinks.
QKV_RUNTIME_API void validate_description(const sdpa_problem& problem);

/// The scale used when options.scale is not set: 1/sqrt(d_qk).
[[nodiscard]] QKV_RUNTIME_API float default_scale(const sdpa_shape& shape);

/// Element strides of a mask of shape `mask_shape` broadcast to (B, Hq, L, S): stride 0 along
/// every broadcast dimension. Throws qkv::invalid_argument if it does not broadcast.
struct mask_strides {
    std::size_t batch = 0, head = 0, row = 0, col = 0;
};
[[nodiscard]] QKV_RUNTIME_API mask_strides broadcast_strides(const std::vector<std::size_t>& mask_shape,
                                                             const sdpa_shape& shape);

/// off, where query i sits among the keys (key position i + off; may be negative): the causal
/// rule keeps j <= i + off, the window and ALiBi measure from i + off. options.position_offset
/// when set; else kv_len - q_len for alignment bottom_right, 0 otherwise. The one place off is
/// computed: every backend takes it from here.
[[nodiscard]] constexpr std::int64_t causal_offset(const sdpa_shape& shape, const sdpa_options& options) {
    if (options.position_offset) return *options.position_offset;
    return options.alignment == causal_alignment::bottom_right
               ? static_cast<std::int64_t>(shape.kv_len) - static_cast<std::int64_t>(shape.q_len)
               : 0;
}

/// The keys query i may attend by the causal rule and the window alone: [first, end) (empty when
/// first >= end). Masks and -inf scores may remove more. Kernels skip key tiles outside it.
struct key_range {
    std::size_t first = 0, end = 0;
};
[[nodiscard]] constexpr key_range visible_keys(const sdpa_shape& shape, const sdpa_options& options, std::size_t i) {
    // Signed positions (|off| <= 2^62, kv_len and q_len below 2^62); a window side is applied only
    // where it cuts into [0, kv_len), so that no sum overflows whatever its size.
    const auto S = static_cast<std::int64_t>(shape.kv_len);
    const std::int64_t pos = static_cast<std::int64_t>(i) + causal_offset(shape, options);
    std::int64_t first = 0, end = S;
    // No <algorithm> in this header: it must survive windows.h's min/max macros (windows_h_static.cpp).
    if (options.causal && pos + 1 < end) end = pos + 1;
    if (options.window_right >= 0 && options.window_right < S - pos)
        end = pos + options.window_right + 1 < end ? pos + options.window_right + 1 : end;
    if (options.window_left >= 0 && options.window_left < pos && pos - options.window_left > first)
        first = pos - options.window_left;
    if (end <= first) return {0, 0};
    return {static_cast<std::size_t>(first), static_cast<std::size_t>(end)};
}

/// The keys some query of rows [first_row, end_row) may attend by the causal rule and the window
/// alone: the union of visible_keys over those rows (empty when none sees a key). Exact: a row's
/// keys are nonempty for one run of rows (bounds on its position i + off), and the ranges of
/// neighbouring rows of that run touch, so the union is [the run's first row's first, its last
/// row's end). A block of a longer sequence is (shape, options) with position_offset set.
[[nodiscard]] constexpr key_range visible_keys(const sdpa_shape& shape, const sdpa_options& options,
                                               std::size_t first_row, std::size_t end_row) {
    if (end_row <= first_row || shape.kv_len == 0) return {0, 0};
    constexpr std::int64_t reach = std::int64_t{1} << 62;  // |off|, and rows and keys, stay within it
    const auto S = static_cast<std::int64_t>(shape.kv_len);
    const std::int64_t off = causal_offset(shape, options);
    // A row at position pos = i + off sees a key when pos >= low and pos <= high (both within
    // [-2^62, 2^62): with |off| <= 2^62, no difference below overflows).
    std::int64_t low = -reach, high = reach - 1;
    if (options.causal) low = 0;
    if (options.window_right >= 0 && options.window_right < reach && -options.window_right > low)
        low = -options.window_right;
    if (options.window_left >= 0 && options.window_left < reach - S) high = S - 1 + options.window_left;
    std::int64_t first = static_cast<std::int64_t>(first_row), last = static_cast<std::int64_t>(end_row) - 1;
    if (low - off > first) first = low - off;
    if (high - off < last) last = high - off;
    if (first > last) return {0, 0};
    const key_range a = visible_keys(shape, options, static_cast<std::size_t>(first));
    const key_range b = visible_keys(shape, options, static_cast<std::size_t>(last));
    if (a.end <= a.first || b.end <= b.first) return {0, 0};
    return {a.first, b.end};
}

/// ALiBi's slope of query head `head` among `q_heads` for max_bias b (ggml's rule, in float64):
/// n = 2^floor(log2 q_heads), m0 = 2^(-b/n), m1 = 2^(-b/(2n)); m0^(head+1) for head < n, else
/// m1^(2(head-n)+1). 0 when b is 0.
[[nodiscard]] QKV_RUNTIME_API double alibi_slope(float max_bias, std::size_t q_heads, std::size_t head);

// ---- Merging partial results -------------------------------------------------------------------
//
// Attention over a key set split into disjoint parts P_1 ... P_n (key shards, devices, machines),
// each part computed on its own WITHOUT sinks, with return_lse: part p gives, for every row,
// o_p = Σ_{j∈P_p} e^(s_j - lse_p) · v_j and lse_p = log Σ_{j∈P_p} e^(s_j). Then, per row, with
// the parts whose lse_p is -inf (no key of the row in that part) left out, and M = max_p lse_p:
//   lse = M + log Σ_p e^(lse_p - M)                                     (log Σ over every key)
//   without sinks:  o = Σ_p e^(lse_p - M) · o_p / Σ_p e^(lse_p - M)
//   with sinks, applied once here:  M' = max(M, σ_h),
//                   o = Σ_p e^(lse_p - M') · o_p / (Σ_p e^(lse_p - M') + e^(σ_h - M'))
// which is the whole call's output (sinks included) and lse (sinks excluded), up to rounding.
// A row where every part's lse is -inf gets a zero output and lse -inf (as the whole call: no key,
// zeros, sinks or not). A row where some part's lse is NaN gets NaN (a NaN poisoned that part's
// row). An lse of +inf is refused (qkv::invalid_argument): it only arises when a float32 lse left
// float32's range, and the merge could not be exact.

/// One partial result: out (B, Hq, L, Ev) and lse (B, Hq, L), as sdpa_output's output and lse.
template <class T>
struct basic_attention_part {
    std::span<const T> out{};
    std::span<const T> lse{};
};
using attention_part = basic_attention_part<float>;
using attention_part_f64 = basic_attention_part<double>;

/// The shape of the rows being merged: out is (batch, q_heads, q_len, d_v), lse (batch, q_heads, q_len).
struct merge_shape {
    std::size_t batch = 1;
    std::size_t q_heads = 1;
    std::size_t q_len = 0;
    std::size_t d_v = 0;
    friend constexpr bool operator==(const merge_shape&, const merge_shape&) = default;
};

template <class T>
struct basic_merged_attention {
    std::vector<T> out;  ///< (B, Hq, L, Ev)
    std::vector<T> lse;  ///< (B, Hq, L), sinks not included
};
using merged_attention = basic_merged_attention<float>;
using merged_attention_f64 = basic_merged_attention<double>;

/// Merges partial results over disjoint key sets (the rule above), in float64; float32 results are
/// rounded once. `sinks`: empty, or one logit per query head (finite or -inf), applied once.
/// Throws qkv::invalid_argument for no parts, a zero dimension, spans whose sizes do not fit
/// `shape`, sinks of the wrong size or NaN/+inf, an lse of +inf.
[[nodiscard]] QKV_RUNTIME_API merged_attention merge_attention(std::span<const attention_part> parts,
                                                               const merge_shape& shape,
                                                               std::span<const float> sinks = {});
[[nodiscard]] QKV_RUNTIME_API merged_attention_f64 merge_attention(std::span<const attention_part_f64> parts,
                                                                   const merge_shape& shape,
                                                                   std::span<const double> sinks = {});

}  // namespace qkv
