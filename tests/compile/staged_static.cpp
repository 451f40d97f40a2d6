// Compile-time proofs: qkv::staged::self_attention gives the same attention_result as
// qkv::self_attention, bit for bit (operator== compares every entry of every step exactly), for
// every option and with the problem cut into uneven blocks of rows. The float64 checks of the
// values themselves are in tutorial_static.cpp (plain form) and reach_static.cpp (both forms).
#include <qkv/qkv.hpp>
#include <qkv/tutorial.hpp>

#include "random_inputs.hpp"

namespace {

namespace tut = qkv::tutorial;
using qkv::staged::detail::self_attention_blocked;

// ---- The tutorial's example ---------------------------------------------------------------------
constexpr qkv::attention_options_for<decltype(tut::inputs), decltype(tut::w_key), decltype(tut::w_value)> unscaled{
    .scale = 1.f};
static_assert(qkv::staged::self_attention<tut::inputs, tut::w_query, tut::w_key, tut::w_value> == tut::scaled);
static_assert(qkv::staged::self_attention<tut::inputs, tut::w_query, tut::w_key, tut::w_value, unscaled> == tut::plain);
// One row per block, two per block (blocks of 2 and 1).
static_assert(self_attention_blocked<tut::inputs, tut::w_query, tut::w_key, tut::w_value, unscaled, 1> == tut::plain);
static_assert(self_attention_blocked<tut::inputs, tut::w_query, tut::w_key, tut::w_value, unscaled, 2> == tut::plain);
// Not vacuous: a different scale gives different bits.
static_assert(qkv::staged::self_attention<tut::inputs, tut::w_query, tut::w_key, tut::w_value> != tut::plain);

// ---- N = 17, d_in = 12, d_k = 8, d_v = 5: every option --------------------------------------------
constexpr std::size_t N = 17;
constexpr auto x = qkv_test::random_matrix<N, 12>(11, 22);
constexpr auto wq = qkv_test::random_matrix<12, 8>(12, 24);
constexpr auto wk = qkv_test::random_matrix<12, 8>(13, 24);
constexpr auto wv = qkv_test::random_matrix<12, 5>(14, 24);
using options = qkv::attention_options_for<decltype(x), decltype(wk), decltype(wv)>;

// A mask with a pattern in every row, row 4 fully masked (all-zero weights by the policy).
constexpr qkv::matrix<bool, N, N> pattern = [] {
    qkv::matrix<bool, N, N> m{};
    for (std::size_t i = 0; i < N; ++i)
        for (std::size_t j = 0; j < N; ++j) m.elems[i][j] = i != 4 && (i * 5 + j * 3) % 7 != 2;
    return m;
}();

constexpr options defaults{};
constexpr options causal{.causal = true};
constexpr options masked{.mask = pattern};
constexpr options everything{.scale = 0.5f,
                             .causal = true,
                             .mask = pattern,
                             .bias_q = qkv_test::random_matrix<1, 8>(15, 23),
                             .bias_k = qkv_test::random_matrix<1, 8>(16, 23),
                             .bias_v = qkv_test::random_matrix<1, 5>(17, 23)};

constexpr auto plain_defaults = qkv::self_attention(x, wq, wk, wv);
constexpr auto plain_causal = qkv::self_attention(x, wq, wk, wv, causal);
constexpr auto plain_masked = qkv::self_attention(x, wq, wk, wv, masked);
constexpr auto plain_everything = qkv::self_attention(x, wq, wk, wv, everything);

static_assert(qkv::staged::self_attention<x, wq, wk, wv> == plain_defaults);
static_assert(qkv::staged::self_attention<x, wq, wk, wv, defaults> == plain_defaults);
static_assert(qkv::staged::self_attention<x, wq, wk, wv, causal> == plain_causal);
static_assert(qkv::staged::self_attention<x, wq, wk, wv, masked> == plain_masked);
static_assert(qkv::staged::self_attention<x, wq, wk, wv, everything> == plain_everything);
// Uneven blocks: 17 = 5 + 5 + 5 + 2 = 3 · 5 + 2, and one row per block.
static_assert(self_attention_blocked<x, wq, wk, wv, everything, 5> == plain_everything);
static_assert(self_attention_blocked<x, wq, wk, wv, everything, 3> == plain_everything);
static_assert(self_attention_blocked<x, wq, wk, wv, everything, 1> == plain_everything);
static_assert(self_attention_blocked<x, wq, wk, wv, masked, 4> == plain_masked);
// The options matter (so the equalities above are not vacuous), and the masked row is zero.
static_assert(plain_everything != plain_defaults && plain_causal != plain_masked);
static_assert(plain_masked.weights(4, 0) == 0.f && plain_masked.output(4, 4) == 0.f);

// ---- double ------------------------------------------------------------------------------------------
constexpr auto xd = qkv::cast<double>(qkv_test::random_matrix<9, 6>(21, 22));
constexpr auto wqd = qkv::cast<double>(qkv_test::random_matrix<6, 6>(22, 24));
constexpr auto wkd = qkv::cast<double>(qkv_test::random_matrix<6, 6>(23, 24));
constexpr auto wvd = qkv::cast<double>(qkv_test::random_matrix<6, 6>(24, 24));
constexpr qkv::attention_options_for<decltype(xd), decltype(wkd), decltype(wvd)> causal_d{.causal = true};
static_assert(qkv::staged::self_attention<xd, wqd, wkd, wvd> == qkv::self_attention(xd, wqd, wkd, wvd));
static_assert(self_attention_blocked<xd, wqd, wkd, wvd, causal_d, 2> ==
              qkv::self_attention(xd, wqd, wkd, wvd, causal_d));

// ---- Shape rules: the same concepts as qkv::self_attention ------------------------------------------
template <const auto& X, const auto& WQ, const auto& WK, const auto& WV>
concept can_stage = requires {
    qkv::staged::self_attention<X, WQ, WK, WV>;
};
template <const auto& X, const auto& WQ, const auto& WK, const auto& WV, const auto& O>
concept can_stage_with = requires {
    qkv::staged::self_attention<X, WQ, WK, WV, O>;
};

constexpr qkv::matrix<float, 12, 7> wk7{};
constexpr qkv::matrix<float, 11, 8> wq11{};
constexpr qkv::matrix<int, N, 12> xi{};
constexpr qkv::attention_options_for<decltype(tut::inputs), decltype(tut::w_key), decltype(tut::w_value)> other{};
static_assert(can_stage<x, wq, wk, wv> && can_stage_with<x, wq, wk, wv, causal>);
static_assert(!can_stage<x, wq, wk7, wv>);             // d_q != d_k: query_key_widths_match
static_assert(!can_stage<x, wq11, wk, wv>);            // d_in mismatch: projects (inner_dimensions_match)
static_assert(!can_stage<xi, wq, wk, wv>);             // not floating point: projects
static_assert(!can_stage_with<x, wq, wk, wv, other>);  // options of another shape: options_for

}  // namespace
