// Compile-time proofs of the attention options of today's models in qkv::scaled_dot_product_attention:
// softcap, ALiBi (a slope, or ggml's slopes from max_bias), sliding windows in both
// alignments, sinks and the log-sum-exp, alone and combined, single-head, grouped-query (Hq = 12
// over Hkv = 4, Hq = 3 over 1) and staged, on odd shapes (L, S in 1, 3, 5, 17; E != Ev), against
// float64 references computed independently (NumPy, tests/compile/gen_sdpa_reference.py); the
// staged form bit-equal to the one evaluation; the merge rule of partial results over disjoint
// key sets.
#include <qkv/qkv.hpp>

#include "sdpa_features_reference.hpp"

namespace {

using qkv::causal_mode;
using qkv::position_alignment;
namespace ref = qkv_test::sdpa_features;

/// Largest |computed - reference| (NaN-propagating: a NaN makes the comparisons below fail).
template <class T, std::size_t R, std::size_t C>
constexpr double max_error(const qkv::matrix<T, R, C>& got, const qkv::matrix<double, R, C>& want) {
    return qkv::max_abs_diff(qkv::cast<double>(got), want);
}

/// Largest |computed - reference| of log-sum-exps, where a -inf reference (a query with no key)
/// must be matched by -inf exactly (anything else, or a NaN, gives +inf).
template <class T, std::size_t R, std::size_t C>
constexpr double lse_error(const qkv::matrix<T, R, C>& got, const qkv::matrix<double, R, C>& want) {
    double worst = 0.0;
    for (std::size_t r = 0; r < R; ++r)
        for (std::size_t c = 0; c < C; ++c) {
            const double g = static_cast<double>(got(r, c)), w = want(r, c);
            if (w == -qkv::infinity<double>() || g == -qkv::infinity<double>() || qkv::isnan(g)) {
                if (!(g == w)) return qkv::infinity<double>();
                continue;
            }
            const double d = qkv::abs(g - w);
            if (d > worst) worst = d;
        }
    return worst;
}

/// float32 results against the float64 references: the script reports each case's float32
/// error (outputs at most 2.1e-7, lse 2.3e-7), so these keep a margin of 4x and still catch a
/// wrong weight, a wrongly masked key or a slope of another head (differences of 1e-3 and more).
constexpr double tolerance = 1e-6;
constexpr double lse_tolerance = 1e-6;
static_assert(ref::float32_error * 4 < tolerance && ref::float32_lse_error * 4 < lse_tolerance);

template <class T, std::size_t R, std::size_t C>
constexpr bool all_zero_row(const qkv::matrix<T, R, C>& m, std::size_t row) {
    for (std::size_t c = 0; c < C; ++c)
        if (m.elems[row][c] != T{}) return false;
    return true;
}

template <class T, std::size_t R, std::size_t C>
constexpr T row_sum(const qkv::matrix<T, R, C>& m, std::size_t row) {
    T s{};
    for (std::size_t c = 0; c < C; ++c) s += m.elems[row][c];
    return s;
}

template <class R, class O, class LSE>
constexpr bool matches(const R& r, const O& output, const LSE& lse) {
    return max_error(r.output, output) <= tolerance && lse_error(r.lse, lse) <= lse_tolerance;
}

using options_a = qkv::sdpa_options_for<decltype(ref::qa), decltype(ref::ka)>;  // L = 3, S = 17
using options_b = qkv::sdpa_options_for<decltype(ref::qb), decltype(ref::kb)>;  // L = 17, S = 5
using options_d = qkv::sdpa_options_for<decltype(ref::qd), decltype(ref::ka)>;  // L = 1, S = 17
constexpr auto plain = qkv::scaled_dot_product_attention(ref::qa, ref::ka, ref::va);
constexpr auto plain_unscaled = qkv::scaled_dot_product_attention(ref::qa, ref::ka, ref::va, {.scale = 1.f});

// ---- The log-sum-exp of plain attention ------------------------------------------------------------
// lse_i = log Σ_j e^(s_ij): checked against the scores themselves, and the weights are e^(s - lse).
static_assert([] {
    for (std::size_t i = 0; i < 3; ++i) {
        double sum = 0.0;
        for (std::size_t j = 0; j < 17; ++j) sum += qkv::exp(static_cast<double>(plain.scores(i, j)));
        if (qkv::abs(qkv::log(sum) - static_cast<double>(plain.lse(0, i))) > 1e-6) return false;
        for (std::size_t j = 0; j < 17; ++j)
            if (qkv::abs(qkv::exp(static_cast<double>(plain.scores(i, j) - plain.lse(0, i))) -
                         static_cast<double>(plain.weights(i, j))) > 1e-6)
                return false;
    }
    return true;
}());
// The options' defaults are "off": the new members left out give the old bits.
static_assert(qkv::scaled_dot_product_attention(ref::qa, ref::ka, ref::va,
                                                {.softcap = 0.f, .alibi_slope = 0.f, .window = {-1, -1}}) == plain);

// ---- Softcap: s <- C·tanh(s / C), first ------------------------------------------------------------
constexpr options_a softcap_options{.scale = 1.f, .softcap = 2.f};
constexpr auto softcap = qkv::scaled_dot_product_attention(ref::qa, ref::ka, ref::va, softcap_options);
static_assert(matches(softcap, ref::softcap_output, ref::softcap_lse));
static_assert(max_error(softcap.weights, ref::softcap_weights) <= tolerance);
static_assert(max_error(softcap.scores, ref::softcap_scores) <= tolerance);
static_assert([] {  // every score in (-2, 2), and C·tanh(s / C) of the unscaled score, exactly
    for (std::size_t i = 0; i < 3; ++i)
        for (std::size_t j = 0; j < 17; ++j)
            if (!(qkv::abs(softcap.scores(i, j)) < 2.f) ||
                softcap.scores(i, j) != 2.f * qkv::tanh(plain_unscaled.scores(i, j) / 2.f))
                return false;
    return true;
}());
static_assert(max_error(softcap.output, ref::softcap_output) < max_error(plain_unscaled.output, ref::softcap_output));
// With masks: the cap applies to the scaled score, before the additive mask.
constexpr options_a softcap_masked_options{
    .scale = 1.f, .mask = ref::mask_a, .additive_mask = ref::additive_a, .softcap = 2.f};
constexpr auto softcap_masked = qkv::scaled_dot_product_attention(ref::qa, ref::ka, ref::va, softcap_masked_options);
static_assert(matches(softcap_masked, ref::softcap_masked_output, ref::softcap_masked_lse));
static_assert(max_error(softcap_masked.weights, ref::softcap_masked_weights) <= tolerance);
static_assert(softcap_masked.scores == softcap.scores + ref::additive_a);
static_assert(all_zero_row(softcap_masked.output, 1) && softcap_masked.lse(0, 1) == -qkv::infinity<float>());

// ---- ALiBi: s <- s - slope·|i + off - j| -----------------------------------------------------------
constexpr options_a alibi_options{.alibi_slope = 0.25f};
constexpr auto alibi = qkv::scaled_dot_product_attention(ref::qa, ref::ka, ref::va, alibi_options);
static_assert(matches(alibi, ref::alibi_top_left_output, ref::alibi_top_left_lse));
static_assert(max_error(alibi.scores, ref::alibi_top_left_scores) <= tolerance);
static_assert(alibi.scores(2, 2) == plain.scores(2, 2) && alibi.scores(2, 7) == plain.scores(2, 7) - 0.25f * 5.f);
constexpr options_a alibi_bottom_right_options{.alibi_slope = 0.25f, .alignment = position_alignment::bottom_right};
constexpr auto alibi_bottom_right =
    qkv::scaled_dot_product_attention(ref::qa, ref::ka, ref::va, alibi_bottom_right_options);
static_assert(matches(alibi_bottom_right, ref::alibi_bottom_right_output, ref::alibi_bottom_right_lse));
static_assert(alibi_bottom_right.scores(0, 14) == plain.scores(0, 14));  // query 0 sits at key 0 + 17 - 3
// With causal bottom-right, the causal mode gives the alignment (and .alignment may repeat it).
constexpr options_a alibi_causal_options{.causal = causal_mode::bottom_right, .alibi_slope = 0.25f};
constexpr auto alibi_causal = qkv::scaled_dot_product_attention(ref::qa, ref::ka, ref::va, alibi_causal_options);
static_assert(matches(alibi_causal, ref::alibi_causal_output, ref::alibi_causal_lse));
static_assert(alibi_causal.scores == alibi_bottom_right.scores);
static_assert(qkv::scaled_dot_product_attention(ref::qa, ref::ka, ref::va,
                                                {.causal = causal_mode::bottom_right,
                                                 .alibi_slope = 0.25f,
                                                 .alignment = position_alignment::bottom_right}) == alibi_causal);

// ggml's slopes: qkv::alibi_slope against the reference, for 12 heads (n = 8: heads 8..11 take m1's
// odd powers) and 3 (n = 2).
static_assert([] {
    for (std::size_t h = 0; h < 12; ++h)
        if (qkv::abs(qkv::alibi_slope(8.0, h, 12) - ref::slopes_12(0, h)) > 1e-15 * ref::slopes_12(0, h) ||
            qkv::abs(static_cast<double>(qkv::alibi_slope(8.f, h, 12)) - ref::slopes_12(0, h)) >
                1e-7 * ref::slopes_12(0, h))
            return false;
    for (std::size_t h = 0; h < 3; ++h)
        if (qkv::abs(qkv::alibi_slope(4.0, h, 3) - ref::slopes_3(0, h)) > 1e-15 * ref::slopes_3(0, h)) return false;
    return true;
}());
static_assert(qkv::alibi_slope(8.f, 0, 8) == 0.5f && qkv::alibi_slope(8.f, 7, 8) == 0.00390625f);
static_assert(qkv::alibi_slope(8.f, 8, 12) == qkv::exp2(-0.5f) && qkv::alibi_slope(1.f, 0, 1) == 0.5f);

// ---- Sliding window ---------------------------------------------------------------------------------
// Top-left (no causal mode): query i attends keys i - 2 ... i + 1.
constexpr options_a window_options{.window = {2, 1}};
constexpr auto window = qkv::scaled_dot_product_attention(ref::qa, ref::ka, ref::va, window_options);
static_assert(matches(window, ref::window_top_left_output, ref::window_top_left_lse));
static_assert(max_error(window.weights, ref::window_top_left_weights) <= tolerance);
static_assert(window.weights(0, 1) > 0.f && window.weights(0, 2) == 0.f && window.weights(2, 0) > 0.f &&
              window.weights(2, 4) == 0.f && window.scores == plain.scores);
// Bottom-right alignment: query i sits at key i + 14 and attends keys i + 10 ... i + 14.
constexpr options_a window_bottom_right_options{.window = {4, 0}, .alignment = position_alignment::bottom_right};
constexpr auto window_bottom_right =
    qkv::scaled_dot_product_attention(ref::qa, ref::ka, ref::va, window_bottom_right_options);
static_assert(matches(window_bottom_right, ref::window_bottom_right_output, ref::window_bottom_right_lse));
static_assert(max_error(window_bottom_right.weights, ref::window_bottom_right_weights) <= tolerance);
static_assert(window_bottom_right.weights(0, 9) == 0.f && window_bottom_right.weights(0, 10) > 0.f &&
              window_bottom_right.weights(2, 16) > 0.f && window_bottom_right.weights(1, 16) == 0.f);
// The same as causal bottom-right with a left window of 4: the window and the causal mode AND.
static_assert(qkv::scaled_dot_product_attention(ref::qa, ref::ka, ref::va,
                                                {.causal = causal_mode::bottom_right, .window = {4, -1}}) ==
              window_bottom_right);
// L = 17 > S = 5, causal bottom-right and window (1, 0): query i sits at key i - 12, so queries
// 0..11 see nothing (zeros, lse -inf) and the others keys i - 13 and i - 12.
constexpr options_b window_causal_long_options{.causal = causal_mode::bottom_right, .window = {1, 0}};
constexpr auto window_causal_long =
    qkv::scaled_dot_product_attention(ref::qb, ref::kb, ref::vb, window_causal_long_options);
static_assert(matches(window_causal_long, ref::window_causal_long_output, ref::window_causal_long_lse));
static_assert(max_error(window_causal_long.weights, ref::window_causal_long_weights) <= tolerance);
static_assert(all_zero_row(window_causal_long.output, 11) && !all_zero_row(window_causal_long.output, 12) &&
              window_causal_long.weights(12, 0) == 1.f && window_causal_long.weights(16, 2) == 0.f);
// L > S, top-left, window (2, 2): queries 7..16 are beyond every key's window.
constexpr options_b window_long_options{.window = {2, 2}};
constexpr auto window_long = qkv::scaled_dot_product_attention(ref::qb, ref::kb, ref::vb, window_long_options);
static_assert(matches(window_long, ref::window_long_output, ref::window_long_lse));
static_assert(!all_zero_row(window_long.output, 6) && all_zero_row(window_long.output, 7));
// With causal top-left and a bool mask.
constexpr auto window_masked = qkv::scaled_dot_product_attention(
    ref::qa, ref::ka, ref::va, {.causal = causal_mode::top_left, .mask = ref::mask_a, .window = {3, 3}});
static_assert(matches(window_masked, ref::window_masked_output, ref::window_masked_lse));
// A window wider than the keys changes nothing.
static_assert(qkv::scaled_dot_product_attention(ref::qa, ref::ka, ref::va, {.window = {17, 17}}) == plain);

// ---- Sinks ------------------------------------------------------------------------------------------
constexpr options_a sink_options{.sinks = qkv::row_of<float>({0.5f})};
constexpr auto sink = qkv::scaled_dot_product_attention(ref::qa, ref::ka, ref::va, sink_options);
static_assert(matches(sink, ref::sink_output, ref::sink_lse));
static_assert(max_error(sink.weights, ref::sink_weights) <= tolerance);
// The weights sum to less than 1, by e^(σ - lse) relative; the scores and the lse are the plain ones.
static_assert(row_sum(sink.weights, 0) < 0.99f && sink.scores == plain.scores && sink.lse == plain.lse);
static_assert(qkv::abs(1.0 / static_cast<double>(row_sum(sink.weights, 2)) - 1.0 -
                       qkv::exp(0.5 - static_cast<double>(plain.lse(0, 2)))) < 1e-6);
// A fully masked row stays zero, with lse -inf.
constexpr options_a sink_masked_options{.mask = ref::mask_a, .sinks = qkv::row_of<float>({1.f})};
constexpr auto sink_masked = qkv::scaled_dot_product_attention(ref::qa, ref::ka, ref::va, sink_masked_options);
static_assert(matches(sink_masked, ref::sink_masked_output, ref::sink_masked_lse));
static_assert(max_error(sink_masked.weights, ref::sink_masked_weights) <= tolerance);
static_assert(all_zero_row(sink_masked.output, 1) && all_zero_row(sink_masked.weights, 1) &&
              sink_masked.lse(0, 1) == -qkv::infinity<float>());
// A sink above every score: the weights are about e^-11, and the lse stays the keys' own.
constexpr options_a sink_dominant_options{.sinks = qkv::row_of<float>({12.f})};
constexpr auto sink_dominant = qkv::scaled_dot_product_attention(ref::qa, ref::ka, ref::va, sink_dominant_options);
static_assert(max_error(sink_dominant.output, ref::sink_dominant_output) <= 1e-10);
static_assert(max_error(sink_dominant.weights, ref::sink_dominant_weights) <= 1e-10);
static_assert(lse_error(sink_dominant.lse, ref::sink_dominant_lse) <= lse_tolerance &&
              sink_dominant.lse(0, 0) == plain.lse(0, 0));
static_assert(!all_zero_row(sink_dominant.output, 0));
// A sink of -inf is no sink.
static_assert(qkv::scaled_dot_product_attention(ref::qa, ref::ka, ref::va,
                                                {.sinks = qkv::row_of<float>({-qkv::infinity<float>()})}) == plain);

// ---- Everything at once -------------------------------------------------------------------------------
// One decode row: causal bottom-right, window (4, 0), softcap, ALiBi, sink.
constexpr options_d decode_options{.causal = causal_mode::bottom_right,
                                   .softcap = 3.f,
                                   .alibi_slope = 0.5f,
                                   .window = {4, 0},
                                   .sinks = qkv::row_of<float>({0.25f})};
constexpr auto decode = qkv::scaled_dot_product_attention(ref::qd, ref::ka, ref::va, decode_options);
static_assert(matches(decode, ref::decode_output, ref::decode_lse));
static_assert(max_error(decode.weights, ref::decode_weights) <= tolerance);
// L = 17 > S = 5: scale, causal bottom-right, window, softcap, ALiBi, sink, bool and additive masks.
constexpr options_b combo_options{.scale = 0.75f,
                                  .causal = causal_mode::bottom_right,
                                  .mask = ref::mask_b,
                                  .additive_mask = ref::additive_b,
                                  .softcap = 4.f,
                                  .alibi_slope = 0.125f,
                                  .window = {2, 0},
                                  .sinks = qkv::row_of<float>({0.25f})};
constexpr auto combo = qkv::scaled_dot_product_attention(ref::qb, ref::kb, ref::vb, combo_options);
static_assert(matches(combo, ref::combo_long_output, ref::combo_long_lse));
static_assert(max_error(combo.weights, ref::combo_long_weights) <= tolerance);
// double: the same inputs, within float64 rounding of the reference.
constexpr auto combo_d = qkv::scaled_dot_product_attention(qkv::cast<double>(ref::qb), qkv::cast<double>(ref::kb),
                                                           qkv::cast<double>(ref::vb),
                                                           {.scale = 0.75,
                                                            .causal = causal_mode::bottom_right,
                                                            .mask = ref::mask_b,
                                                            .additive_mask = qkv::cast<double>(ref::additive_b),
                                                            .softcap = 4.0,
                                                            .alibi_slope = 0.125,
                                                            .window = {2, 0},
                                                            .sinks = qkv::row_of<double>({0.25})});
static_assert(max_error(combo_d.output, ref::combo_long_output) <= 1e-14 &&
              lse_error(combo_d.lse, ref::combo_long_lse) <= 1e-14);

// ---- Grouped-query: Hq = 12 over Hkv = 4, ALiBi from max_bias 8 (Hq not a power of two) ------------
constexpr auto gqa_alibi = qkv::scaled_dot_product_attention<12, 4>(ref::qg, ref::kg, ref::vg, {.alibi_max_bias = 8.f});
static_assert(matches(gqa_alibi, ref::gqa_alibi_output, ref::gqa_alibi_lse));
using gqa_options = qkv::sdpa_options_for<decltype(ref::qg), decltype(ref::kg), 12>;
constexpr gqa_options gqa_combo_options{.causal = causal_mode::bottom_right,
                                        .mask = ref::mask_g,
                                        .softcap = 5.f,
                                        .alibi_max_bias = 8.f,
                                        .window = {6, 1},
                                        .sinks = ref::sinks_g};
constexpr auto gqa_combo = qkv::scaled_dot_product_attention<12, 4>(ref::qg, ref::kg, ref::vg, gqa_combo_options);
static_assert(matches(gqa_combo, ref::gqa_combo_output, ref::gqa_combo_lse));
// Query head h is the single-head form on its columns, against K/V head h / 3, with slope
// qkv::alibi_slope(8, h, 12) and sink σ_h: bit for bit (heads 0 and 7 take m0's powers, 8 and 11
// m1's; head 5 has the sink -inf).
template <std::size_t H>
constexpr bool gqa_head_is_single_head() {
    constexpr std::size_t g = H / 3;
    constexpr auto one = qkv::scaled_dot_product_attention(
        qkv::columns<4>(ref::qg, H * 4), qkv::columns<4>(ref::kg, g * 4), qkv::columns<2>(ref::vg, g * 2),
        {.causal = causal_mode::bottom_right,
         .mask = ref::mask_g,
         .softcap = 5.f,
         .alibi_slope = qkv::alibi_slope(8.f, H, 12),
         .window = {6, 1},
         .sinks = qkv::row_of<float>({ref::sinks_g(0, H)})});
    bool lse_equal = true;
    for (std::size_t i = 0; i < 5; ++i) lse_equal = lse_equal && one.lse(0, i) == gqa_combo.lse(H, i);
    return one.scores == gqa_combo.scores[H] && one.weights == gqa_combo.weights[H] &&
           one.output == qkv::columns<2>(gqa_combo.output, H * 2) && lse_equal;
}
static_assert(gqa_head_is_single_head<0>() && gqa_head_is_single_head<5>() && gqa_head_is_single_head<7>() &&
              gqa_head_is_single_head<8>() && gqa_head_is_single_head<11>());
// Options for one head given to the multi-head form: one sink for every head.
constexpr auto gqa_one_sink =
    qkv::scaled_dot_product_attention<12, 4>(ref::qg, ref::kg, ref::vg,
                                             qkv::sdpa_options_for<decltype(ref::qg), decltype(ref::kg)>{
                                                 .alibi_max_bias = 8.f, .sinks = qkv::row_of<float>({0.5f})});
constexpr gqa_options all_half{
    .alibi_max_bias = 8.f,
    .sinks = qkv::row_of<float>({0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f})};
static_assert(gqa_one_sink == qkv::scaled_dot_product_attention<12, 4>(ref::qg, ref::kg, ref::vg, all_half));
static_assert(gqa_one_sink.output != gqa_alibi.output && gqa_one_sink.lse == gqa_alibi.lse);

// Hq = 3 over one K/V head, max_bias 4 (n = 2, head 2 takes m1), window (1, -1).
constexpr auto heads3 =
    qkv::scaled_dot_product_attention<3, 1>(ref::q3h, ref::k3h, ref::v3h, {.alibi_max_bias = 4.f, .window = {1, -1}});
static_assert(matches(heads3, ref::heads3_output, ref::heads3_lse));
// One head: the multi-head form with max_bias b is the single-head form with slope 2^-b.
static_assert(qkv::scaled_dot_product_attention<1, 1>(ref::qa, ref::ka, ref::va, {.alibi_max_bias = 2.f}).output ==
              alibi.output);

// ---- Merging partial results over disjoint key sets ----------------------------------------------
// Keys 0..8 and 9..16 computed apart (a bool mask each, no sink), then merged with the sink
// applied once: M = max(lse_1, lse_2, σ), w_p = e^(lse_p - M), o = Σ w_p o_p / (Σ w_p + e^(σ - M)),
// lse = M' + log Σ e^(lse_p - M') (M' = max lse_p) give the whole call's output and lse.
constexpr qkv::matrix<bool, 3, 17> first_keys = [] {
    qkv::matrix<bool, 3, 17> m{};
    for (std::size_t i = 0; i < 3; ++i)
        for (std::size_t j = 0; j < 17; ++j) m(i, j) = j < 9;
    return m;
}();
constexpr qkv::matrix<bool, 3, 17> last_keys = [] {
    qkv::matrix<bool, 3, 17> m{};
    for (std::size_t i = 0; i < 3; ++i)
        for (std::size_t j = 0; j < 17; ++j) m(i, j) = j >= 9;
    return m;
}();
constexpr auto part1 = qkv::scaled_dot_product_attention(ref::qa, ref::ka, ref::va,
                                                         {.mask = first_keys, .softcap = 3.f, .window = {10, 4}});
constexpr auto part2 = qkv::scaled_dot_product_attention(ref::qa, ref::ka, ref::va,
                                                         {.mask = last_keys, .softcap = 3.f, .window = {10, 4}});
constexpr auto whole = qkv::scaled_dot_product_attention(
    ref::qa, ref::ka, ref::va, {.softcap = 3.f, .window = {10, 4}, .sinks = qkv::row_of<float>({0.75f})});
static_assert([] {
    const double sigma = 0.75;
    for (std::size_t i = 0; i < 3; ++i) {
        const double l1 = part1.lse(0, i), l2 = part2.lse(0, i);
        const double top = l1 > l2 ? l1 : l2, m = top > sigma ? top : sigma;
        const double w1 = qkv::exp(l1 - m), w2 = qkv::exp(l2 - m);
        for (std::size_t c = 0; c < 3; ++c) {
            const double o = (w1 * part1.output(i, c) + w2 * part2.output(i, c)) / (w1 + w2 + qkv::exp(sigma - m));
            if (qkv::abs(o - static_cast<double>(whole.output(i, c))) > 1e-6) return false;
        }
        const double lse = top + qkv::log(qkv::exp(l1 - top) + qkv::exp(l2 - top));
        if (qkv::abs(lse - static_cast<double>(whole.lse(0, i))) > 1e-6) return false;
    }
    return true;
}());
// Query 0's window (keys 0..4) lies in the first part: the second is empty (lse -inf, zeros).
static_assert(part2.lse(0, 0) == -qkv::infinity<float>() && all_zero_row(part2.output, 0));

// ---- The staged form: the same bits ---------------------------------------------------------------
using qkv::staged::detail::sdpa_blocked;
static_assert(qkv::staged::scaled_dot_product_attention<ref::qa, ref::ka, ref::va, softcap_options> == softcap);
static_assert(qkv::staged::scaled_dot_product_attention<ref::qa, ref::ka, ref::va, softcap_masked_options> ==
              softcap_masked);
static_assert(qkv::staged::scaled_dot_product_attention<ref::qa, ref::ka, ref::va, alibi_bottom_right_options> ==
              alibi_bottom_right);
static_assert(qkv::staged::scaled_dot_product_attention<ref::qa, ref::ka, ref::va, window_bottom_right_options> ==
              window_bottom_right);
static_assert(qkv::staged::scaled_dot_product_attention<ref::qa, ref::ka, ref::va, sink_masked_options> == sink_masked);
static_assert(qkv::staged::scaled_dot_product_attention<ref::qd, ref::ka, ref::va, decode_options> == decode);
static_assert(qkv::staged::scaled_dot_product_attention<ref::qb, ref::kb, ref::vb, combo_options> == combo);
static_assert(qkv::staged::scaled_dot_product_attention<ref::qb, ref::kb, ref::vb, window_causal_long_options> ==
              window_causal_long);
// Cut into uneven blocks: 17 = 5 + 5 + 5 + 2 and one row per block; 3 = 2 + 1.
static_assert(sdpa_blocked<ref::qb, ref::kb, ref::vb, combo_options, 5> == combo);
static_assert(sdpa_blocked<ref::qb, ref::kb, ref::vb, combo_options, 1> == combo);
static_assert(sdpa_blocked<ref::qb, ref::kb, ref::vb, window_long_options, 4> == window_long);
static_assert(sdpa_blocked<ref::qa, ref::ka, ref::va, alibi_causal_options, 2> == alibi_causal);
static_assert(sdpa_blocked<ref::qa, ref::ka, ref::va, sink_dominant_options, 2> == sink_dominant);
// Not vacuous: the options change the bits.
static_assert(combo != qkv::scaled_dot_product_attention(ref::qb, ref::kb, ref::vb, {.scale = 0.75f}) &&
              softcap != plain_unscaled && alibi != plain && window != plain && sink != plain);

// ---- Shape rules: options for the multi-head form ---------------------------------------------------
template <std::size_t HQ, std::size_t HKV, class Q, class K, class V, class O>
concept can_gqa_with = requires(const Q& q, const K& k, const V& v, const O& o) {
    qkv::scaled_dot_product_attention<HQ, HKV>(q, k, v, o);
};
using Qg = decltype(ref::qg);
using Kg = decltype(ref::kg);
using Vg = decltype(ref::vg);
static_assert(can_gqa_with<12, 4, Qg, Kg, Vg, qkv::sdpa_options_for<Qg, Kg, 12>> &&
              can_gqa_with<12, 4, Qg, Kg, Vg, qkv::sdpa_options_for<Qg, Kg>>);
static_assert(!can_gqa_with<12, 4, Qg, Kg, Vg, qkv::sdpa_options_for<Qg, Kg, 4>>);  // sinks for 4 heads
static_assert(!qkv::sdpa_options_for_heads<qkv::sdpa_options_for<Qg, Kg, 6>, 12, Qg, Kg> &&
              qkv::sdpa_options_for_heads<qkv::sdpa_options_for<Qg, Kg, 12>, 12, Qg, Kg>);

}  // namespace
