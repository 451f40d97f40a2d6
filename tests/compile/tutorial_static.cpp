// Compile-time proofs: the worked example of the seeds (../shared/seeds), checked by the compiler.
// Expected values are the tutorial's printed numbers, or PyTorch's (tests/reference/expected_values.py),
// never values produced by qkv itself. A wrong expected value breaks the build.
#include <qkv/qkv.hpp>
#include <qkv/tutorial.hpp>

namespace {

using qkv::approx_equal;
using qkv::matrix_of;
namespace tut = qkv::tutorial;

// ---- Step 3: keys, queries and values, exactly as printed ------------------------------------
static_assert(tut::plain.keys == matrix_of<float>({{0, 1, 1}, {4, 4, 0}, {2, 3, 1}}));
static_assert(tut::plain.queries == matrix_of<float>({{1, 0, 2}, {2, 2, 2}, {2, 1, 3}}));
static_assert(tut::plain.values == matrix_of<float>({{1, 2, 3}, {2, 8, 0}, {2, 6, 3}}));

// ---- Step 4: attention scores (plain dot product), exactly ------------------------------------
static_assert(tut::plain.scores == matrix_of<float>({{2, 4, 4}, {4, 16, 12}, {4, 12, 10}}));

// ---- Step 5: softmax, within 1e-4 of the printed values ---------------------------------------
static_assert(approx_equal(tut::plain.weights,
                           matrix_of<float>({{6.3379e-02f, 4.6831e-01f, 4.6831e-01f},
                                             {6.0337e-06f, 9.8201e-01f, 1.7986e-02f},
                                             {2.9539e-04f, 8.8054e-01f, 1.1917e-01f}}),
                           1e-4f));
// Each row of weights sums to one.
static_assert(approx_equal(tut::plain.weights * qkv::filled<float, 3, 1>(1.f), qkv::filled<float, 3, 1>(1.f), 1e-6f));

// ---- Steps 6-7: output with the exact softmax --------------------------------------------------
static_assert(approx_equal(tut::plain.output,
                           matrix_of<float>({{1.9366f, 6.6831f, 1.5951f},
                                             {1.99999397f, 7.96399160f, 0.05397641f},
                                             {1.99970461f, 7.75989225f, 0.35838929f}}),
                           1e-3f));
// Step 6: the weighted values of input 1 sum (step 7) to output 1.
static_assert(approx_equal(qkv::filled<float, 1, 3>(1.f) * qkv::weighted_values(tut::plain, 0),
                           qkv::row_of<float>({1.9366f, 6.6831f, 1.5951f}), 1e-3f));

// Scaled by 1/sqrt(3) ("Attention Is All You Need"), the default scale.
static_assert(approx_equal(tut::scaled.output,
                           matrix_of<float>({{1.8639f, 6.3194f, 1.7042f},
                                             {1.99910955f, 7.81412350f, 0.27347206f},
                                             {1.99255511f, 7.47963559f, 0.73587726f}}),
                           1e-3f));
static_assert(tut::scaled.scores(1, 1) == 16.f / qkv::sqrt(3.f));

// ---- The tutorial's rounded weights times V ----------------------------------------------------
constexpr auto rounded_weights = matrix_of<float>({{0, .5f, .5f}, {0, 1, 0}, {0, .9f, .1f}});
static_assert(approx_equal(rounded_weights * tut::plain.values,
                           matrix_of<float>({{2, 7, 1.5f}, {2, 8, 0}, {2, 7.8f, 0.3f}}), 1e-6f));

// ---- Seed 001: random inputs printed to 4 decimals, d_k = d_v = 2 ------------------------------
constexpr auto i001 = matrix_of<float>({{0.4313f, 1.3749f, -0.2489f, 1.3275f},
                                        {-0.6467f, 1.6335f, 2.8923f, 0.9124f},
                                        {0.2326f, -0.2314f, 0.3554f, 0.0892f}});
constexpr auto wq001 =
    matrix_of<float>({{0.3673f, -0.8505f}, {-0.3559f, -0.3708f}, {-1.2093f, 0.6634f}, {0.4042f, 0.8015f}});
constexpr auto wk001 =
    matrix_of<float>({{-1.1617f, 0.4023f}, {-0.1249f, -0.1605f}, {-0.8427f, 1.1002f}, {-1.1320f, 0.4611f}});
constexpr auto wv001 =
    matrix_of<float>({{-0.7675f, -0.3179f}, {-1.1910f, -0.6937f}, {-1.4809f, -1.5502f}, {-0.7373f, 1.0511f}});
constexpr auto r001 = qkv::self_attention(i001, wq001, wk001, wv001, {.scale = 1.f});
static_assert(approx_equal(r001.queries,
                           matrix_of<float>({{0.5066f, 0.0223f}, {-3.9478f, 2.5946f}, {-0.2259f, 0.1952f}}), 1e-3f));
static_assert(approx_equal(
    r001.scores,
    matrix_of<float>({{-0.9893f, -1.4121f, -0.3126f}, {8.5152f, 19.5319f, 3.9940f}, {0.5009f, 1.2617f, 0.2549f}}),
    2e-3f));
static_assert(approx_equal(r001.output,
                           matrix_of<float>({{-2.1390f, -0.8160f}, {-6.4048f, -4.4521f}, {-4.2510f, -2.3272f}}),
                           1e-3f));

// ---- Causal: input i attends to inputs 1..i (PyTorch, float64) --------------------------------
constexpr auto causal =
    qkv::self_attention(tut::inputs, tut::w_query, tut::w_key, tut::w_value, {.scale = 1.f, .causal = true});
static_assert(causal.weights(0, 0) == 1.f && causal.weights(0, 1) == 0.f && causal.weights(1, 2) == 0.f);
static_assert(approx_equal(causal.output,
                           matrix_of<float>({{1, 2, 3},
                                             {1.99999386f, 7.99996313f, 1.84325238e-05f},
                                             {1.99970461f, 7.75989225f, 0.358389295f}}),
                           1e-4f));

// ---- Boolean mask: the same causal pattern spelled as a mask gives the same result -------------
constexpr auto masked = qkv::self_attention(tut::inputs, tut::w_query, tut::w_key, tut::w_value,
                                            {.scale = 1.f, .mask = qkv::causal_mask<3>()});
static_assert(masked == causal);

// A fully masked row: zero weights and a zero output row (qkv's documented policy).
constexpr auto no_row0 = qkv::self_attention(
    tut::inputs, tut::w_query, tut::w_key, tut::w_value,
    {.mask = qkv::matrix<bool, 3, 3>{{{false, false, false}, {true, true, true}, {true, true, true}}}});
static_assert(no_row0.output(0, 0) == 0.f && no_row0.output(0, 1) == 0.f && no_row0.output(0, 2) == 0.f);
static_assert(no_row0.weights(0, 0) == 0.f && no_row0.weights(0, 1) == 0.f && no_row0.weights(0, 2) == 0.f);
// The other rows are untouched: row 2 equals the unmasked, scaled result (PyTorch).
static_assert(qkv::abs(no_row0.output(1, 1) - 7.81412350f) < 1e-4f);

// ---- Multi-head: torch.nn.MultiheadAttention(4, 2) with biases and output projection -----------
constexpr auto wq4 = matrix_of<float>({{1, 0, 1, 0}, {1, 0, 0, 1}, {0, 0, 1, 1}, {0, 1, 1, 0}}) * 0.5f;
constexpr auto wk4 = matrix_of<float>({{0, 0, 1, 1}, {1, 1, 0, 0}, {0, 1, 0, 1}, {1, 1, 0, 0}}) * 0.5f;
constexpr auto wv4 = matrix_of<float>({{0, 2, 0, 1}, {0, 3, 0, 0}, {1, 0, 3, 1}, {1, 1, 0, 2}}) * 0.5f;
constexpr auto wo4 = matrix_of<float>({{1, 0, 0, 1}, {0, 1, 0, 0}, {0, 0, 1, 0}, {1, 0, 0, -1}});
constexpr auto proj = qkv::output_projection{wo4, qkv::row_of<float>({0.5f, 0.25f, 0.f, -0.5f})};
constexpr qkv::attention_options_for<decltype(tut::inputs), decltype(wk4), decltype(wv4)> mh_opts{
    .bias_q = qkv::row_of<float>({0.1f, -0.2f, 0.3f, 0.f}),
    .bias_k = qkv::row_of<float>({0.f, 0.5f, -0.5f, 0.25f}),
    .bias_v = qkv::row_of<float>({1.f, 0.f, -1.f, 0.5f})};
constexpr auto mh = qkv::multi_head_attention<2>(tut::inputs, wq4, wk4, wv4, proj, mh_opts);
static_assert(approx_equal(mh.output,
                           matrix_of<float>({{4.47216219f, 3.22383135f, 0.22777278f, -0.70932262f},
                                             {4.53591554f, 3.82032992f, 0.29792328f, -0.59880227f},
                                             {4.50870525f, 3.69228494f, 0.32688757f, -0.60670304f}}),
                           1e-4f));
static_assert(approx_equal(mh.weights[1],
                           matrix_of<float>({{0.40925759f, 0.18148481f, 0.40925759f},
                                             {0.43264109f, 0.13471781f, 0.43264109f},
                                             {0.44229586f, 0.11540828f, 0.44229586f}}),
                           1e-5f));
constexpr auto mh_causal_opts = [] {
    auto o = mh_opts;
    o.causal = true;
    return o;
}();
constexpr auto mh_causal = qkv::multi_head_attention<2>(tut::inputs, wq4, wk4, wv4, proj, mh_causal_opts);
static_assert(approx_equal(mh_causal.output,
                           matrix_of<float>({{3.5f, 1.25f, 0.5f, -0.5f},
                                             {4.19601935f, 4.00143262f, 0.14382912f, -0.27887515f},
                                             {4.50870525f, 3.69228494f, 0.32688757f, -0.60670304f}}),
                           1e-4f));

// One head is plain self-attention with the same default scale.
constexpr auto one_head = qkv::multi_head_attention<1>(tut::inputs, tut::w_query, tut::w_key, tut::w_value);
static_assert(one_head.output == tut::scaled.output && one_head.weights[0] == tut::scaled.weights);

// double works the same way.
constexpr auto plain_d =
    qkv::self_attention(qkv::cast<double>(tut::inputs), qkv::cast<double>(tut::w_query), qkv::cast<double>(tut::w_key),
                        qkv::cast<double>(tut::w_value), {.scale = 1.0});
static_assert(approx_equal(plain_d.output,
                           matrix_of<double>({{1.93662106, 6.68310531, 1.59506841},
                                              {1.99999397, 7.96399160, 0.05397641},
                                              {1.99970461, 7.75989225, 0.35838929}}),
                           1e-8));

}  // namespace
