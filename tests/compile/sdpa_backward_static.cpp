// Compile-time proofs of qkv::sdpa_backward (qkv/sdpa_backward.hpp) and of attention dropout's
// forward pass: the gradients of every option (causal in both alignments, L > S with rows that see
// nothing, bool and additive masks, windows, softcap, ALiBi, sinks, dropout, everything at once),
// single-head, grouped-query and with one shared sink, against float64 references from
// torch.autograd (tests/compile/gen_sdpa_backward_reference.py); the worked example's gradients
// through its projections (qkv::self_attention_backward); properties that hold whatever the data
// (shift invariance of the logits, masked keys without gradient); the staged form bit-equal to the
// one evaluation.
#include <qkv/qkv.hpp>
#include <qkv/tutorial.hpp>

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "sdpa_backward_reference.hpp"

namespace {

using qkv::causal_mode;
namespace ref = qkv_test::sdpa_backward;
namespace tut = qkv::tutorial;

/// max |got - want| / max |want| (NaN-propagating: a NaN makes the comparisons below fail).
template <class T, std::size_t R, std::size_t C>
constexpr double relative_error(const qkv::matrix<T, R, C>& got, const qkv::matrix<double, R, C>& want) {
    double scale = 0.0;
    for (std::size_t r = 0; r < R; ++r)
        for (std::size_t c = 0; c < C; ++c) scale = qkv::abs(want(r, c)) > scale ? qkv::abs(want(r, c)) : scale;
    const double d = qkv::max_abs_diff(qkv::cast<double>(got), want);
    return scale > 0.0 ? d / scale : d;
}

/// float32 gradients against the float64 references, relative to each matrix's largest entry: the
/// script reports the float32 error of each case (at most 2e-7 of the case's largest gradient), so
/// this keeps a margin of 10x and still catches a wrong term (errors of 1e-3 and more).
constexpr double tolerance = 2e-6;
static_assert(ref::float32_error * 10 <= tolerance);

template <class G, class DQ, class DK, class DV>
constexpr bool matches(const G& g, const DQ& dq, const DK& dk, const DV& dv) {
    return relative_error(g.dq, dq) <= tolerance && relative_error(g.dk, dk) <= tolerance &&
           relative_error(g.dv, dv) <= tolerance;
}

/// Σ_j d_scores(i, j) + the row's sink term is 0 for every row: adding a constant to every logit of
/// a row (the sink's included) changes nothing, so the gradients along that direction cancel.
template <class T, std::size_t L, std::size_t S>
constexpr T logit_sum(const qkv::matrix<T, L, S>& d_scores) {
    T sum{};
    for (std::size_t i = 0; i < L; ++i)
        for (std::size_t j = 0; j < S; ++j) sum += d_scores(i, j);
    return sum;
}

template <class T, std::size_t R, std::size_t C>
constexpr bool zero_where_masked(const qkv::matrix<T, R, C>& m, const qkv::matrix<bool, R, C>& allowed) {
    for (std::size_t r = 0; r < R; ++r)
        for (std::size_t c = 0; c < C; ++c)
            if (!allowed(r, c) && m(r, c) != T{}) return false;
    return true;
}

template <class T, std::size_t R, std::size_t C>
constexpr bool zero_row(const qkv::matrix<T, R, C>& m, std::size_t row) {
    for (std::size_t c = 0; c < C; ++c)
        if (m(row, c) != T{}) return false;
    return true;
}

using options = qkv::sdpa_options_for<decltype(ref::q), decltype(ref::k)>;
using options17 = qkv::sdpa_options_for<decltype(ref::q17), decltype(ref::k)>;

// ---- One head: L = 3, S = 5, E = 4, Ev = 2 ---------------------------------------------------------
constexpr auto plain_f = qkv::scaled_dot_product_attention(ref::q, ref::k, ref::v);
constexpr auto plain = qkv::sdpa_backward(ref::q, ref::k, ref::v, plain_f, ref::d_out);
static_assert(matches(plain, ref::plain_dq, ref::plain_dk, ref::plain_dv));
static_assert(relative_error(plain.d_scores, ref::plain_d_scores) <= tolerance);
static_assert(qkv::abs(logit_sum(plain.d_scores)) < 1e-6f && plain.d_sinks(0, 0) == 0.f);
static_assert(qkv::max_abs_diff(qkv::cast<double>(plain.dq), qkv::filled<double, 3, 4>(0.0)) > 0.1);  // not trivial
// double: the same inputs, within float64 rounding of the reference.
constexpr auto qd = qkv::cast<double>(ref::q);
constexpr auto kd = qkv::cast<double>(ref::k);
constexpr auto vd = qkv::cast<double>(ref::v);
constexpr auto plain_d =
    qkv::sdpa_backward(qd, kd, vd, qkv::scaled_dot_product_attention(qd, kd, vd), qkv::cast<double>(ref::d_out));
static_assert(relative_error(plain_d.dq, ref::plain_dq) <= 1e-14 &&
              relative_error(plain_d.dk, ref::plain_dk) <= 1e-14 &&
              relative_error(plain_d.dv, ref::plain_dv) <= 1e-14 &&
              relative_error(plain_d.d_scores, ref::plain_d_scores) <= 1e-14);

constexpr options scaled_o{.scale = -0.75f};
static_assert(matches(qkv::sdpa_backward(ref::q, ref::k, ref::v,
                                         qkv::scaled_dot_product_attention(ref::q, ref::k, ref::v, scaled_o),
                                         ref::d_out, scaled_o),
                      ref::scaled_dq, ref::scaled_dk, ref::scaled_dv));

// Causal, both alignments; L = 17 > S = 5 bottom-right: rows 0-11 see no key and get no gradient.
constexpr options top_left_o{.causal = causal_mode::top_left};
constexpr auto top_left =
    qkv::sdpa_backward(ref::q, ref::k, ref::v, qkv::scaled_dot_product_attention(ref::q, ref::k, ref::v, top_left_o),
                       ref::d_out, top_left_o);
static_assert(matches(top_left, ref::top_left_dq, ref::top_left_dk, ref::top_left_dv));
// Query 0 sees key 0 alone: its weight is 1 whatever the score, so no gradient reaches q_0.
static_assert(zero_row(top_left.dq, 0) && zero_row(top_left.dk, 3) && zero_row(top_left.dv, 4));
constexpr options bottom_right_o{.causal = causal_mode::bottom_right};
static_assert(matches(qkv::sdpa_backward(ref::q, ref::k, ref::v,
                                         qkv::scaled_dot_product_attention(ref::q, ref::k, ref::v, bottom_right_o),
                                         ref::d_out, bottom_right_o),
                      ref::bottom_right_dq, ref::bottom_right_dk, ref::bottom_right_dv));
constexpr options17 long_o{.causal = causal_mode::bottom_right};
constexpr auto long_br =
    qkv::sdpa_backward(ref::q17, ref::k, ref::v, qkv::scaled_dot_product_attention(ref::q17, ref::k, ref::v, long_o),
                       ref::d_out17, long_o);
static_assert(matches(long_br, ref::long_bottom_right_dq, ref::long_bottom_right_dk, ref::long_bottom_right_dv));
static_assert(zero_row(long_br.dq, 0) && zero_row(long_br.dq, 11) && !zero_row(long_br.dq, 13));

// Bool and additive masks: d_scores is the additive mask's gradient, 0 wherever a key is masked.
constexpr options masks_o{.mask = ref::mask, .additive_mask = ref::additive};
constexpr auto masks = qkv::sdpa_backward(
    ref::q, ref::k, ref::v, qkv::scaled_dot_product_attention(ref::q, ref::k, ref::v, masks_o), ref::d_out, masks_o);
static_assert(matches(masks, ref::masks_dq, ref::masks_dk, ref::masks_dv));
static_assert(relative_error(masks.d_scores, ref::masks_d_scores) <= tolerance);
static_assert(zero_where_masked(masks.d_scores, ref::mask) && masks.d_scores(0, 3) == 0.f &&
              masks.d_scores(2, 1) == 0.f);
static_assert(zero_row(masks.dq, 1));  // row 1 attends to nothing

constexpr options window_o{.window = {2, 1}, .alignment = qkv::position_alignment::bottom_right};
static_assert(matches(qkv::sdpa_backward(ref::q, ref::k, ref::v,
                                         qkv::scaled_dot_product_attention(ref::q, ref::k, ref::v, window_o),
                                         ref::d_out, window_o),
                      ref::window_dq, ref::window_dk, ref::window_dv));

// Softcap: dS through the chain rule 1 - tanh²; d_scores is still the logits' gradient.
constexpr options softcap_o{.scale = 1.f, .softcap = 2.f};
constexpr auto softcap =
    qkv::sdpa_backward(ref::q, ref::k, ref::v, qkv::scaled_dot_product_attention(ref::q, ref::k, ref::v, softcap_o),
                       ref::d_out, softcap_o);
static_assert(matches(softcap, ref::softcap_dq, ref::softcap_dk, ref::softcap_dv));
static_assert(relative_error(softcap.d_scores, ref::softcap_d_scores) <= tolerance);

constexpr options alibi_o{.alibi_slope = 0.25f, .alignment = qkv::position_alignment::bottom_right};
static_assert(matches(qkv::sdpa_backward(ref::q, ref::k, ref::v,
                                         qkv::scaled_dot_product_attention(ref::q, ref::k, ref::v, alibi_o), ref::d_out,
                                         alibi_o),
                      ref::alibi_dq, ref::alibi_dk, ref::alibi_dv));

// Sinks: dσ = -Σ_i P_σ,i·D_i.
constexpr options sink_o{.sinks = qkv::row_of<float>({0.5f})};
constexpr auto sink = qkv::sdpa_backward(
    ref::q, ref::k, ref::v, qkv::scaled_dot_product_attention(ref::q, ref::k, ref::v, sink_o), ref::d_out, sink_o);
static_assert(matches(sink, ref::sink_dq, ref::sink_dk, ref::sink_dv));
static_assert(relative_error(sink.d_sinks, ref::sink_d_sinks) <= tolerance);
static_assert(qkv::abs(logit_sum(sink.d_scores) + sink.d_sinks(0, 0)) < 1e-6f && sink.d_sinks(0, 0) != 0.f);
constexpr options sink_dominant_o{.sinks = qkv::row_of<float>({12.f})};
constexpr auto sink_dominant = qkv::sdpa_backward(
    ref::q, ref::k, ref::v, qkv::scaled_dot_product_attention(ref::q, ref::k, ref::v, sink_dominant_o), ref::d_out,
    sink_dominant_o);
static_assert(matches(sink_dominant, ref::sink_dominant_dq, ref::sink_dominant_dk, ref::sink_dominant_dv));
static_assert(relative_error(sink_dominant.d_sinks, ref::sink_dominant_d_sinks) <= tolerance);
constexpr options sink_masked_o{.mask = ref::mask, .sinks = qkv::row_of<float>({1.f})};
constexpr auto sink_masked =
    qkv::sdpa_backward(ref::q, ref::k, ref::v, qkv::scaled_dot_product_attention(ref::q, ref::k, ref::v, sink_masked_o),
                       ref::d_out, sink_masked_o);
static_assert(matches(sink_masked, ref::sink_masked_dq, ref::sink_masked_dk, ref::sink_masked_dv));
static_assert(relative_error(sink_masked.d_sinks, ref::sink_masked_d_sinks) <= tolerance);
// A sink of -inf is no sink: the same gradients, and none for it.
constexpr options no_sink_o{.sinks = qkv::row_of<float>({-qkv::infinity<float>()})};
constexpr auto no_sink =
    qkv::sdpa_backward(ref::q, ref::k, ref::v, qkv::scaled_dot_product_attention(ref::q, ref::k, ref::v, no_sink_o),
                       ref::d_out, no_sink_o);
static_assert(no_sink.dq == plain.dq && no_sink.dk == plain.dk && no_sink.dv == plain.dv &&
              no_sink.d_sinks(0, 0) == 0.f);

// ---- Dropout ------------------------------------------------------------------------------------------
// The forward pass: the output of the kept weights over 1 - p; the weights returned are the
// probabilities, each dropped one negated (FlashAttention's encoding), matching qkv::dropout_stream.
constexpr options dropout_o{.dropout = {.p = 0.25f, .seed = 1234, .offset = 3}};
constexpr auto dropout_f = qkv::scaled_dot_product_attention(ref::q, ref::k, ref::v, dropout_o);
static_assert(relative_error(dropout_f.output, ref::dropout_output) <= tolerance);
static_assert(relative_error(dropout_f.weights, ref::dropout_weights) <= tolerance);
static_assert(dropout_f.lse == plain_f.lse);  // the softmax itself is not changed
static_assert([] {
    const qkv::dropout_stream d{1234, 3, qkv::dropout_threshold(0.25)};
    bool dropped_some = false;
    for (std::size_t i = 0; i < 3; ++i)
        for (std::size_t j = 0; j < 5; ++j) {
            if (qkv::abs(dropout_f.weights(i, j)) != plain_f.weights(i, j)) return false;
            if (qkv::signbit(dropout_f.weights(i, j)) == d.keeps(i, j)) return false;
            dropped_some = dropped_some || !d.keeps(i, j);
        }
    return dropped_some;
}());
constexpr auto dropout = qkv::sdpa_backward(ref::q, ref::k, ref::v, dropout_f, ref::d_out, dropout_o);
static_assert(matches(dropout, ref::dropout_dq, ref::dropout_dk, ref::dropout_dv));
static_assert(relative_error(dropout.d_scores, ref::dropout_d_scores) <= tolerance);
// p = 0 is no dropout, bit for bit; another seed is another mask.
constexpr options no_dropout_o{.dropout = {.p = 0.f, .seed = 1234, .offset = 3}};
static_assert(qkv::scaled_dot_product_attention(ref::q, ref::k, ref::v, no_dropout_o) == plain_f);
constexpr options other_seed_o{.dropout = {.p = 0.25f, .seed = 1235, .offset = 3}};
static_assert(qkv::scaled_dot_product_attention(ref::q, ref::k, ref::v, other_seed_o).weights != dropout_f.weights);

// One decode row with every rule, and L = 17 > S = 5 with everything.
using options1 = qkv::sdpa_options_for<decltype(ref::q1), decltype(ref::k)>;
constexpr options1 decode_o{.causal = causal_mode::bottom_right,
                            .softcap = 3.f,
                            .alibi_slope = 0.5f,
                            .window = {2, 0},
                            .sinks = qkv::row_of<float>({0.25f}),
                            .dropout = {.p = 0.5f, .seed = 99}};
constexpr auto decode_f = qkv::scaled_dot_product_attention(ref::q1, ref::k, ref::v, decode_o);
static_assert(relative_error(decode_f.output, ref::decode_output) <= tolerance &&
              relative_error(decode_f.weights, ref::decode_weights) <= tolerance);
constexpr auto decode = qkv::sdpa_backward(ref::q1, ref::k, ref::v, decode_f, ref::d_out1, decode_o);
static_assert(matches(decode, ref::decode_dq, ref::decode_dk, ref::decode_dv));
static_assert(relative_error(decode.d_sinks, ref::decode_d_sinks) <= tolerance);
static_assert(zero_row(decode.dk, 0) && zero_row(decode.dk, 1));  // outside the window

constexpr options17 combo_o{
    .scale = 0.75f,
    .causal = causal_mode::bottom_right,
    .mask = ref::mask17,
    .additive_mask = ref::additive17,
    .softcap = 4.f,
    .alibi_slope = 0.125f,
    .window = {2, 0},
    .sinks = qkv::row_of<float>({0.25f}),
    .dropout = {.p = 0.125f, .seed = (std::uint64_t{1} << 40) + 5, .offset = std::uint64_t{1} << 33}};
constexpr auto combo_f = qkv::scaled_dot_product_attention(ref::q17, ref::k, ref::v, combo_o);
static_assert(relative_error(combo_f.output, ref::combo_output) <= tolerance &&
              relative_error(combo_f.weights, ref::combo_weights) <= tolerance);
constexpr auto combo = qkv::sdpa_backward(ref::q17, ref::k, ref::v, combo_f, ref::d_out17, combo_o);
static_assert(matches(combo, ref::combo_dq, ref::combo_dk, ref::combo_dv));
static_assert(relative_error(combo.d_scores, ref::combo_d_scores) <= tolerance &&
              relative_error(combo.d_sinks, ref::combo_d_sinks) <= tolerance);
// Rows 0-11 see no key (bottom-right, L > S), row 14 is masked out, row 15's additive mask is -inf.
static_assert(zero_where_masked(combo.d_scores, ref::mask17) && zero_row(combo.dq, 11) && zero_row(combo.dq, 14) &&
              zero_row(combo.dq, 15) && !zero_row(combo.dq, 16));

// ---- Grouped-query: Hq = 4 over Hkv = 2 ----------------------------------------------------------------
constexpr auto gqa_f = qkv::scaled_dot_product_attention<4, 2>(ref::q_gqa, ref::k_gqa, ref::v_gqa);
constexpr auto gqa = qkv::sdpa_backward<4, 2>(ref::q_gqa, ref::k_gqa, ref::v_gqa, gqa_f, ref::d_out_gqa);
static_assert(matches(gqa, ref::gqa_dq, ref::gqa_dk, ref::gqa_dv));
static_assert(relative_error(gqa.d_scores[0], ref::gqa_d_scores_0) <= tolerance &&
              relative_error(gqa.d_scores[3], ref::gqa_d_scores_3) <= tolerance);
// K/V head 1's gradients are the sums of query heads 2 and 3's, each a one-head backward.
constexpr auto head_grad(std::size_t h) {
    const auto q = qkv::columns<2>(ref::q_gqa, 2 * h);
    const auto k = qkv::columns<2>(ref::k_gqa, 2 * (h / 2));
    const auto v = qkv::columns<3>(ref::v_gqa, 3 * (h / 2));
    const auto d_out = qkv::columns<3>(ref::d_out_gqa, 3 * h);
    return qkv::sdpa_backward(q, k, v, qkv::scaled_dot_product_attention(q, k, v), d_out);
}
static_assert(qkv::columns<2>(gqa.dk, 2) == qkv::filled<float, 5, 2>(0.f) + head_grad(2).dk + head_grad(3).dk);
static_assert(qkv::columns<3>(gqa.dv, 3) == qkv::filled<float, 5, 3>(0.f) + head_grad(2).dv + head_grad(3).dv);
static_assert(qkv::columns<2>(gqa.dq, 4) == head_grad(2).dq);

using options_gqa = qkv::sdpa_options_for<decltype(ref::q_gqa), decltype(ref::k_gqa), 4>;
constexpr options_gqa gqa_combo_o{.causal = causal_mode::bottom_right,
                                  .mask = ref::mask,
                                  .additive_mask = ref::additive,
                                  .softcap = 3.f,
                                  .alibi_max_bias = 8.f,
                                  .sinks = ref::sinks_gqa,
                                  .dropout = {.p = 0.25f, .seed = 77}};
constexpr auto gqa_combo_f = qkv::scaled_dot_product_attention<4, 2>(ref::q_gqa, ref::k_gqa, ref::v_gqa, gqa_combo_o);
static_assert(relative_error(gqa_combo_f.output, ref::gqa_combo_output) <= tolerance &&
              relative_error(gqa_combo_f.weights[1], ref::gqa_combo_weights_1) <= tolerance &&
              relative_error(gqa_combo_f.weights[3], ref::gqa_combo_weights_3) <= tolerance);
constexpr auto gqa_combo =
    qkv::sdpa_backward<4, 2>(ref::q_gqa, ref::k_gqa, ref::v_gqa, gqa_combo_f, ref::d_out_gqa, gqa_combo_o);
static_assert(matches(gqa_combo, ref::gqa_combo_dq, ref::gqa_combo_dk, ref::gqa_combo_dv));
static_assert(relative_error(gqa_combo.d_scores[2], ref::gqa_combo_d_scores_2) <= tolerance &&
              relative_error(gqa_combo.d_additive_mask, ref::gqa_combo_d_additive) <= tolerance &&
              relative_error(gqa_combo.d_sinks, ref::gqa_combo_d_sinks) <= tolerance);
static_assert(gqa_combo.d_sinks(0, 2) == 0.f);  // head 2's sink is -inf: none

// Hq = 3 over Hkv = 1, one sink for every head: its gradient is the sum over the heads.
constexpr qkv::sdpa_options_for<decltype(ref::q3h), decltype(ref::k)> shared_o{.window = {1, -1},
                                                                               .sinks = qkv::row_of<float>({0.75f})};
constexpr auto shared_f = qkv::scaled_dot_product_attention<3, 1>(ref::q3h, ref::k, ref::v, shared_o);
constexpr auto shared = qkv::sdpa_backward<3, 1>(ref::q3h, ref::k, ref::v, shared_f, ref::d_out3h, shared_o);
static_assert(matches(shared, ref::shared_sink_dq, ref::shared_sink_dk, ref::shared_sink_dv));
static_assert(relative_error(shared.d_sinks, ref::shared_sink_d_sinks) <= tolerance);

// ---- The worked example: the gradients of X, Wq, Wk and Wv ---------------------------------------------
// Its softmax is nearly saturated (scores up to 16), so its gradients are small differences of large
// terms: float32 lands up to 1.7e-6 of the largest gradient off (the script's float32 evaluation),
// which this tolerance exceeds tenfold.
constexpr double tutorial_tolerance = 2e-5;
static_assert(ref::tutorial_float32_error * 10 <= tutorial_tolerance);

/// The largest error of the four gradients, relative to the largest reference gradient among them.
template <class G>
constexpr bool tutorial_matches(const G& g, const qkv::matrix<double, 3, 4>& dx, const qkv::matrix<double, 4, 3>& dwq,
                                const qkv::matrix<double, 4, 3>& dwk, const qkv::matrix<double, 4, 3>& dwv) {
    const auto largest = [](const auto& m) { return qkv::max_abs_diff(m, m * 0.0); };
    double scale = largest(dx);
    for (const double s : {largest(dwq), largest(dwk), largest(dwv)}) scale = s > scale ? s : scale;
    double error = qkv::max_abs_diff(qkv::cast<double>(g.dx), dx);
    for (const double e :
         {qkv::max_abs_diff(qkv::cast<double>(g.dwq), dwq), qkv::max_abs_diff(qkv::cast<double>(g.dwk), dwk),
          qkv::max_abs_diff(qkv::cast<double>(g.dwv), dwv)})
        error = e > error ? e : error;
    return error <= tutorial_tolerance * scale;
}
constexpr auto tutorial = qkv::self_attention_backward(tut::inputs, tut::w_query, tut::w_key, tut::w_value,
                                                       ref::d_out_tutorial, {.scale = 1.f});
static_assert(tutorial_matches(tutorial, ref::tutorial_dx, ref::tutorial_dwq, ref::tutorial_dwk, ref::tutorial_dwv));
// dWq = Xᵀ·dQ with dQ the attention's gradient of the tutorial's Q, K, V.
constexpr auto tutorial_sdpa = qkv::sdpa_backward(
    tut::plain.queries, tut::plain.keys, tut::plain.values,
    qkv::scaled_dot_product_attention(tut::plain.queries, tut::plain.keys, tut::plain.values, {.scale = 1.f}),
    ref::d_out_tutorial, {.scale = 1.f});
static_assert(tutorial.dq == tutorial_sdpa.dq && tutorial.dk == tutorial_sdpa.dk && tutorial.dv == tutorial_sdpa.dv);
static_assert(tutorial.dwq == qkv::transpose(tut::inputs) * tutorial_sdpa.dq);
static_assert(tutorial_matches(qkv::self_attention_backward(tut::inputs, tut::w_query, tut::w_key, tut::w_value,
                                                            ref::d_out_tutorial),
                               ref::tutorial_scaled_dx, ref::tutorial_scaled_dwq, ref::tutorial_scaled_dwk,
                               ref::tutorial_scaled_dwv));
static_assert(tutorial_matches(qkv::self_attention_backward(tut::inputs, tut::w_query, tut::w_key, tut::w_value,
                                                            ref::d_out_tutorial, {.scale = 1.f, .causal = true}),
                               ref::tutorial_causal_dx, ref::tutorial_causal_dwq, ref::tutorial_causal_dwk,
                               ref::tutorial_causal_dwv));

// ---- The staged form: the same bits, in uneven blocks too -----------------------------------------------
using qkv::staged::detail::sdpa_backward_blocked;
static_assert(qkv::staged::sdpa_backward<ref::q, ref::k, ref::v, plain_f, ref::d_out> == plain);
static_assert(qkv::staged::sdpa_backward<ref::q, ref::k, ref::v, dropout_f, ref::d_out, dropout_o> == dropout);
static_assert(sdpa_backward_blocked<ref::q, ref::k, ref::v, dropout_f, ref::d_out, dropout_o, 2> == dropout);
static_assert(qkv::staged::sdpa_backward<ref::q17, ref::k, ref::v, combo_f, ref::d_out17, combo_o> == combo);
static_assert(sdpa_backward_blocked<ref::q17, ref::k, ref::v, combo_f, ref::d_out17, combo_o, 4> == combo);
static_assert(sdpa_backward_blocked<ref::q17, ref::k, ref::v, combo_f, ref::d_out17, combo_o, 1> == combo);
// The staged forward's result serves as well (the same bits as the one evaluation's).
constexpr auto combo_staged_f = qkv::staged::scaled_dot_product_attention<ref::q17, ref::k, ref::v, combo_o>;
static_assert(qkv::staged::sdpa_backward<ref::q17, ref::k, ref::v, combo_staged_f, ref::d_out17, combo_o> == combo);

}  // namespace
