// Compile-time proofs of qkv::scaled_dot_product_attention (qkv/sdpa.hpp): the worked example
// through SDPA is self_attention bit for bit; cross-attention (L != S, E != Ev), both causal
// alignments, bool and additive masks, grouped-query attention and a single decode row against
// float64 references computed independently (NumPy, tests/compile/gen_sdpa_reference.py, after
// PyTorch's documented semantics); the shape rules as concepts.
#include <qkv/qkv.hpp>
#include <qkv/tutorial.hpp>

#include "sdpa_reference.hpp"

namespace {

using qkv::causal_mode;
namespace tut = qkv::tutorial;
namespace ref = qkv_test::sdpa;

/// Largest |computed - reference| (NaN-propagating: a NaN makes the comparison below fail).
template <class T, std::size_t R, std::size_t C>
constexpr double max_error(const qkv::matrix<T, R, C>& got, const qkv::matrix<double, R, C>& want) {
    return qkv::max_abs_diff(qkv::cast<double>(got), want);
}

/// float32 results against the float64 references; the script reports the float32 error of each
/// case (at most 1.4e-7 here), so this tolerance leaves a margin of 7x and still catches any
/// wrong weight or masked key (the values are multiples of 1/16, |output| up to 1.5).
constexpr double tolerance = 1e-6;
static_assert(ref::float32_error * 4 < tolerance);

template <class T, std::size_t R, std::size_t C>
constexpr bool all_zero_row(const qkv::matrix<T, R, C>& m, std::size_t row) {
    for (std::size_t c = 0; c < C; ++c)
        if (m.elems[row][c] != T{}) return false;
    return true;
}

// ---- The seed example: SDPA of the tutorial's Q, K, V is self_attention, bit for bit -------------
constexpr auto seed_plain =
    qkv::scaled_dot_product_attention(tut::plain.queries, tut::plain.keys, tut::plain.values, {.scale = 1.f});
static_assert(seed_plain.scores == tut::plain.scores && seed_plain.weights == tut::plain.weights &&
              seed_plain.output == tut::plain.output);
// The tutorial's exact scores, and its output to the printed digits.
static_assert(seed_plain.scores == qkv::matrix_of<float>({{2, 4, 4}, {4, 16, 12}, {4, 12, 10}}));
static_assert(qkv::approx_equal(seed_plain.output,
                                qkv::matrix_of<float>({{1.9366f, 6.6831f, 1.5951f},
                                                       {1.99999397f, 7.96399160f, 0.05397641f},
                                                       {1.99970461f, 7.75989225f, 0.35838929f}}),
                                1e-3f));
// Default scale 1/sqrt(E).
constexpr auto seed_scaled =
    qkv::scaled_dot_product_attention(tut::scaled.queries, tut::scaled.keys, tut::scaled.values);
static_assert(seed_scaled.scores == tut::scaled.scores && seed_scaled.weights == tut::scaled.weights &&
              seed_scaled.output == tut::scaled.output);
// Square (L = S): both causal alignments are self_attention's causal mask.
constexpr auto seed_causal =
    qkv::self_attention(tut::inputs, tut::w_query, tut::w_key, tut::w_value, {.scale = 1.f, .causal = true});
constexpr auto seed_top_left = qkv::scaled_dot_product_attention(tut::plain.queries, tut::plain.keys, tut::plain.values,
                                                                 {.scale = 1.f, .causal = causal_mode::top_left});
constexpr auto seed_bottom_right = qkv::scaled_dot_product_attention(
    tut::plain.queries, tut::plain.keys, tut::plain.values, {.scale = 1.f, .causal = causal_mode::bottom_right});
static_assert(seed_top_left.weights == seed_causal.weights && seed_top_left.output == seed_causal.output);
static_assert(seed_bottom_right == seed_top_left);
static_assert(seed_top_left.weights(0, 1) == 0.f && seed_top_left.weights(0, 0) == 1.f);
// A bool mask equal to the causal pattern gives the same bits.
constexpr auto seed_masked = qkv::scaled_dot_product_attention(tut::plain.queries, tut::plain.keys, tut::plain.values,
                                                               {.scale = 1.f, .mask = qkv::causal_mask<3>()});
static_assert(seed_masked == seed_top_left);
// An additive mask of zeros changes nothing; one of -inf below the diagonal is the causal mask.
constexpr auto seed_zero_bias =
    qkv::scaled_dot_product_attention(tut::plain.queries, tut::plain.keys, tut::plain.values,
                                      {.scale = 1.f, .additive_mask = qkv::filled<float, 3, 3>(0.f)});
static_assert(seed_zero_bias == seed_plain);
constexpr auto seed_inf_bias = qkv::scaled_dot_product_attention(
    tut::plain.queries, tut::plain.keys, tut::plain.values,
    {.scale = 1.f,
     .additive_mask = qkv::matrix_of<float>(
         {{0.f, ref::ninf<float>, ref::ninf<float>}, {0.f, 0.f, ref::ninf<float>}, {0.f, 0.f, 0.f}})});
static_assert(seed_inf_bias.weights == seed_top_left.weights && seed_inf_bias.output == seed_top_left.output);

// ---- Cross-attention: L = 3 queries over S = 5 keys, E = 4, Ev = 2 -------------------------------
constexpr auto cross = qkv::scaled_dot_product_attention(ref::q, ref::k, ref::v);
static_assert(max_error(cross.output, ref::cross_output) <= tolerance);
static_assert(max_error(cross.weights, ref::cross_weights) <= tolerance);
static_assert(qkv::max_abs_diff(qkv::cast<double>(cross.output), qkv::filled<double, 3, 2>(0.0)) > 0.5);  // not trivial
// scores are q·kᵀ·scale, exactly as matmul computes q·kᵀ.
static_assert(cross.scores == qkv::matmul(ref::q, qkv::transpose(ref::k)) * (1.f / qkv::sqrt(4.f)));

constexpr auto cross_scaled = qkv::scaled_dot_product_attention(ref::q, ref::k, ref::v, {.scale = 0.5f});
static_assert(max_error(cross_scaled.output, ref::cross_scaled_output) <= tolerance);

// double: the same inputs, within float64 rounding of the reference.
constexpr auto cross_d =
    qkv::scaled_dot_product_attention(qkv::cast<double>(ref::q), qkv::cast<double>(ref::k), qkv::cast<double>(ref::v));
static_assert(max_error(cross_d.output, ref::cross_output) <= 1e-14);
static_assert(max_error(cross_d.weights, ref::cross_weights) <= 1e-14);

// ---- Causal, both alignments ---------------------------------------------------------------------
// top-left: query i sees keys j <= i.
constexpr auto top_left = qkv::scaled_dot_product_attention(ref::q, ref::k, ref::v, {.causal = causal_mode::top_left});
static_assert(max_error(top_left.output, ref::top_left_output) <= tolerance);
static_assert(max_error(top_left.weights, ref::top_left_weights) <= tolerance);
static_assert(top_left.weights(0, 0) == 1.f && top_left.weights(0, 1) == 0.f && top_left.weights(2, 3) == 0.f);
// bottom-right: query i sees keys j <= i + S - L = i + 2; the last query sees every key.
constexpr auto bottom_right =
    qkv::scaled_dot_product_attention(ref::q, ref::k, ref::v, {.causal = causal_mode::bottom_right});
static_assert(max_error(bottom_right.output, ref::bottom_right_output) <= tolerance);
static_assert(max_error(bottom_right.weights, ref::bottom_right_weights) <= tolerance);
static_assert(bottom_right.weights(0, 2) > 0.f && bottom_right.weights(0, 3) == 0.f &&
              bottom_right.weights(1, 4) == 0.f);
static_assert(bottom_right.weights[2][4] == cross.weights[2][4] && bottom_right.output(2, 0) == cross.output(2, 0));

// L = 5 > S = 3. top-left: every query sees key 0 at least; bottom-right: j <= i - 2, so
// queries 0 and 1 see nothing and get zero weights and a zero output.
constexpr auto long_top_left =
    qkv::scaled_dot_product_attention(ref::q_long, ref::k3, ref::v3, {.causal = causal_mode::top_left});
static_assert(max_error(long_top_left.output, ref::long_top_left_output) <= tolerance);
constexpr auto long_bottom_right =
    qkv::scaled_dot_product_attention(ref::q_long, ref::k3, ref::v3, {.causal = causal_mode::bottom_right});
static_assert(max_error(long_bottom_right.output, ref::long_bottom_right_output) <= tolerance);
static_assert(max_error(long_bottom_right.weights, ref::long_bottom_right_weights) <= tolerance);
static_assert(all_zero_row(long_bottom_right.output, 0) && all_zero_row(long_bottom_right.output, 1) &&
              all_zero_row(long_bottom_right.weights, 0) && all_zero_row(long_bottom_right.weights, 1));
static_assert(!all_zero_row(long_bottom_right.output, 2) && long_bottom_right.weights(2, 0) == 1.f);

// ---- Masks ---------------------------------------------------------------------------------------
// Bool (true = attend); row 1 attends to nothing.
constexpr auto masked = qkv::scaled_dot_product_attention(ref::q, ref::k, ref::v, {.mask = ref::mask});
static_assert(max_error(masked.output, ref::masked_output) <= tolerance);
static_assert(max_error(masked.weights, ref::masked_weights) <= tolerance);
static_assert(all_zero_row(masked.output, 1) && all_zero_row(masked.weights, 1) && !all_zero_row(masked.output, 0));
static_assert(masked.scores == cross.scores);  // scores are before the bool mask

// Additive: added to the scaled scores, -inf masks; row 2 is all -inf, so it attends to nothing.
constexpr auto additive = qkv::scaled_dot_product_attention(ref::q, ref::k, ref::v, {.additive_mask = ref::additive});
static_assert(max_error(additive.output, ref::additive_output) <= tolerance);
static_assert(max_error(additive.weights, ref::additive_weights) <= tolerance);
static_assert(additive.scores == cross.scores + ref::additive);
static_assert(additive.weights(0, 3) == 0.f && additive.weights(1, 0) == 0.f && all_zero_row(additive.output, 2));

// Both masks and causal bottom-right combine: a key must pass all three.
constexpr auto combo = qkv::scaled_dot_product_attention(
    ref::q, ref::k, ref::v,
    {.causal = causal_mode::bottom_right, .mask = ref::mask_combo, .additive_mask = ref::additive_combo});
static_assert(max_error(combo.output, ref::combo_output) <= tolerance);
static_assert(max_error(combo.weights, ref::combo_weights) <= tolerance);
// The same as one bool mask that is the AND of the bool mask and the bottom-right pattern.
constexpr auto bottom_right_pattern = qkv::matrix<bool, 3, 5>{
    {{true, true, true, false, false}, {true, true, true, true, false}, {true, true, true, true, true}}};
constexpr auto combo_as_one_mask = qkv::scaled_dot_product_attention(
    ref::q, ref::k, ref::v,
    {.mask = qkv::mask_and(ref::mask_combo, bottom_right_pattern), .additive_mask = ref::additive_combo});
static_assert(combo_as_one_mask == combo);

// ---- Decode: one query row (L = 1) against S = 5 keys ----------------------------------------------
constexpr auto decode = qkv::scaled_dot_product_attention(ref::q1, ref::k, ref::v);
static_assert(max_error(decode.output, ref::decode_output) <= tolerance);
static_assert(max_error(decode.weights, ref::decode_weights) <= tolerance);
// Bottom-right: the one (last) query sees every key; top-left: it sees key 0 only.
static_assert(qkv::scaled_dot_product_attention(ref::q1, ref::k, ref::v, {.causal = causal_mode::bottom_right}) ==
              decode);
constexpr auto decode_top_left =
    qkv::scaled_dot_product_attention(ref::q1, ref::k, ref::v, {.causal = causal_mode::top_left});
static_assert(decode_top_left.weights(0, 0) == 1.f && decode_top_left.output(0, 1) == ref::v(0, 1));
// A decode row is the last row of the full computation with the same query as its last row.
constexpr auto q_with_decode_row = [] {
    auto m = ref::q;
    for (std::size_t c = 0; c < 4; ++c) m(2, c) = ref::q1(0, c);
    return m;
}();
constexpr auto full_with_decode_row =
    qkv::scaled_dot_product_attention(q_with_decode_row, ref::k, ref::v, {.causal = causal_mode::bottom_right});
static_assert(full_with_decode_row.output(2, 0) == decode.output(0, 0) &&
              full_with_decode_row.output(2, 1) == decode.output(0, 1));

// ---- Grouped-query attention: Hq = 4 query heads over Hkv = 2 K/V heads (E = 2, Ev = 3) ------------
constexpr auto gqa = qkv::scaled_dot_product_attention<4, 2>(ref::q_gqa, ref::k_gqa, ref::v_gqa);
static_assert(max_error(gqa.output, ref::gqa_output) <= tolerance);
static_assert(max_error(gqa.weights[0], ref::gqa_weights_0) <= tolerance &&
              max_error(gqa.weights[1], ref::gqa_weights_1) <= tolerance &&
              max_error(gqa.weights[2], ref::gqa_weights_2) <= tolerance &&
              max_error(gqa.weights[3], ref::gqa_weights_3) <= tolerance);
// Query head h is single-head SDPA of its columns against K/V head h / 2, bit for bit.
template <std::size_t H>
constexpr bool gqa_head_is_single_head() {
    constexpr std::size_t g = H / 2;
    constexpr auto one = qkv::scaled_dot_product_attention(
        qkv::columns<2>(ref::q_gqa, H * 2), qkv::columns<2>(ref::k_gqa, g * 2), qkv::columns<3>(ref::v_gqa, g * 3));
    return one.scores == gqa.scores[H] && one.weights == gqa.weights[H] &&
           one.output == qkv::columns<3>(gqa.output, H * 3);
}
static_assert(gqa_head_is_single_head<0>() && gqa_head_is_single_head<1>() && gqa_head_is_single_head<2>() &&
              gqa_head_is_single_head<3>());
// Heads 0 and 1 share K/V head 0 but not their weights (different queries).
static_assert(gqa.weights[0] != gqa.weights[1]);
// With the causal mode and a scale, every head applies them.
constexpr auto gqa_causal = qkv::scaled_dot_product_attention<4, 2>(
    ref::q_gqa, ref::k_gqa, ref::v_gqa, {.scale = 0.75f, .causal = causal_mode::bottom_right});
static_assert(max_error(gqa_causal.output, ref::gqa_causal_output) <= tolerance);
static_assert(gqa_causal.weights[3](0, 3) == 0.f && gqa_causal.weights[3](0, 2) > 0.f);

// Hkv = Hq is multi-head attention: multi_head_attention<2> is its projections followed by this.
constexpr auto wq4 = qkv::matrix_of<float>({{1, 0, 1, 0}, {1, 0, 0, 1}, {0, 0, 1, 1}, {0, 1, 1, 0}}) * 0.5f;
constexpr auto wk4 = qkv::matrix_of<float>({{0, 0, 1, 1}, {1, 1, 0, 0}, {0, 1, 0, 1}, {1, 1, 0, 0}}) * 0.5f;
constexpr auto wv4 = qkv::matrix_of<float>({{0, 2, 0, 1}, {0, 3, 0, 0}, {1, 0, 3, 1}, {1, 1, 0, 2}}) * 0.5f;
constexpr auto mh = qkv::multi_head_attention<2>(tut::inputs, wq4, wk4, wv4, {.causal = true});
constexpr auto mh_sdpa =
    qkv::scaled_dot_product_attention<2, 2>(mh.queries, mh.keys, mh.values, {.causal = causal_mode::top_left});
static_assert(mh_sdpa.scores == mh.scores && mh_sdpa.weights == mh.weights && mh_sdpa.output == mh.concat);
// One head, one K/V head: the single-head form.
static_assert(qkv::scaled_dot_product_attention<1, 1>(ref::q, ref::k, ref::v).output == cross.output);

// ---- The staged form (qkv/staged.hpp): blocks of query rows, each its own evaluation, same bits ----
using qkv::staged::detail::sdpa_blocked;
using cross_options = qkv::sdpa_options_for<decltype(ref::q), decltype(ref::k)>;
constexpr cross_options combo_options{
    .causal = causal_mode::bottom_right, .mask = ref::mask_combo, .additive_mask = ref::additive_combo};
constexpr cross_options mask_options{.mask = ref::mask};
constexpr cross_options additive_options{.additive_mask = ref::additive};
constexpr cross_options top_left_options{.scale = 0.5f, .causal = causal_mode::top_left};
constexpr qkv::sdpa_options_for<decltype(ref::q_long), decltype(ref::k3)> long_options{.causal =
                                                                                           causal_mode::bottom_right};
static_assert(qkv::staged::scaled_dot_product_attention<ref::q, ref::k, ref::v> == cross);
static_assert(qkv::staged::scaled_dot_product_attention<ref::q, ref::k, ref::v, combo_options> == combo);
static_assert(qkv::staged::scaled_dot_product_attention<ref::q, ref::k, ref::v, mask_options> == masked);
static_assert(qkv::staged::scaled_dot_product_attention<ref::q, ref::k, ref::v, additive_options> == additive);
static_assert(qkv::staged::scaled_dot_product_attention<ref::q_long, ref::k3, ref::v3, long_options> ==
              long_bottom_right);
static_assert(qkv::staged::scaled_dot_product_attention<ref::q1, ref::k, ref::v> == decode);
// Cut into uneven blocks (2 + 1 and 2 + 2 + 1 query rows, one row per block).
static_assert(sdpa_blocked<ref::q, ref::k, ref::v, combo_options, 2> == combo);
static_assert(sdpa_blocked<ref::q, ref::k, ref::v, additive_options, 1> == additive);
static_assert(sdpa_blocked<ref::q_long, ref::k3, ref::v3, long_options, 2> == long_bottom_right);
// Not vacuous: other options give other bits.
static_assert(sdpa_blocked<ref::q, ref::k, ref::v, top_left_options, 2> ==
              qkv::scaled_dot_product_attention(ref::q, ref::k, ref::v, top_left_options));
static_assert(qkv::staged::scaled_dot_product_attention<ref::q, ref::k, ref::v, top_left_options> != cross);

// ---- Shape rules ---------------------------------------------------------------------------------
template <std::size_t R, std::size_t C>
using m = qkv::matrix<float, R, C>;
template <class Q, class K, class V>
concept can_sdpa = requires(const Q& q, const K& k, const V& v) {
    qkv::scaled_dot_product_attention(q, k, v);
};
template <const auto& Q, const auto& K, const auto& V>
concept can_stage_sdpa = requires {
    qkv::staged::scaled_dot_product_attention<Q, K, V>;
};
template <std::size_t HQ, std::size_t HKV, class Q, class K, class V>
concept can_gqa = requires(const Q& q, const K& k, const V& v) {
    qkv::scaled_dot_product_attention<HQ, HKV>(q, k, v);
};
static_assert(can_sdpa<m<3, 4>, m<5, 4>, m<5, 2>>);
static_assert(!can_sdpa<m<3, 4>, m<5, 3>, m<5, 2>>);                    // q and k widths differ
static_assert(!can_sdpa<m<3, 4>, m<5, 4>, m<4, 2>>);                    // k and v lengths differ
static_assert(!can_sdpa<m<3, 4>, m<5, 4>, qkv::matrix<double, 5, 2>>);  // element types differ
static_assert(!can_sdpa<qkv::matrix<int, 3, 4>, qkv::matrix<int, 5, 4>, qkv::matrix<int, 5, 2>>);
static_assert(can_stage_sdpa<ref::q, ref::k, ref::v> && !can_stage_sdpa<ref::q, ref::k, ref::v3> &&
              !can_stage_sdpa<ref::q, ref::v, ref::v>);
static_assert(can_gqa<4, 2, m<3, 8>, m<5, 4>, m<5, 6>>);
static_assert(!can_gqa<4, 3, m<3, 8>, m<5, 6>, m<5, 6>>);  // 3 K/V heads cannot serve 4 query heads
static_assert(!can_gqa<4, 0, m<3, 8>, m<5, 4>, m<5, 6>>);
static_assert(!can_gqa<4, 2, m<3, 8>, m<5, 6>, m<5, 6>>);  // per-head widths: q 2, k 3
static_assert(!can_gqa<4, 2, m<3, 8>, m<5, 4>, m<5, 5>>);  // 2 K/V heads cannot split Ev = 5
static_assert(!can_gqa<4, 2, m<3, 8>, m<5, 4>, m<6, 6>>);  // k and v lengths differ

}  // namespace
