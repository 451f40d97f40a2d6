// The constexpr core run at run time, on random inputs, against the float64 reference.
#include <qkv/qkv.hpp>
#include <qkv/tutorial.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "support/catch.hpp"
#include "support/reference.hpp"

namespace {

template <std::size_t R, std::size_t C>
qkv::matrix<float, R, C> random_matrix(std::mt19937_64& rng, std::vector<double>& as_double, double sigma = 1.0) {
    qkv::matrix<float, R, C> m{};
    std::normal_distribution<double> dist(0.0, sigma);
    as_double.resize(R * C);
    for (std::size_t r = 0; r < R; ++r)
        for (std::size_t c = 0; c < C; ++c) {
            m(r, c) = static_cast<float>(dist(rng));
            as_double[r * C + c] = m(r, c);  // the reference sees exactly the float inputs
        }
    return m;
}

template <class T, std::size_t R, std::size_t C>
std::vector<T> flatten(const qkv::matrix<T, R, C>& m) {
    std::vector<T> v;
    for (std::size_t r = 0; r < R; ++r)
        for (std::size_t c = 0; c < C; ++c) v.push_back(m(r, c));
    return v;
}

enum class masking { none, causal, random_mask, both };

template <std::size_t H, std::size_t N, std::size_t D, std::size_t DK, std::size_t DV, std::size_t DO>
void check_case(std::uint64_t seed, bool biases, masking mk) {
    std::mt19937_64 rng(seed);
    qkv_test::ref_problem p;
    p.n = N, p.d_in = D, p.d_k = DK, p.d_v = DV, p.heads = H, p.d_out = DO;
    const double w_sigma = 1.0 / std::sqrt(static_cast<double>(D));  // keeps scores O(1), like trained weights
    const auto x = random_matrix<N, D>(rng, p.x);
    const auto wq = random_matrix<D, DK>(rng, p.wq, w_sigma);
    const auto wk = random_matrix<D, DK>(rng, p.wk, w_sigma);
    const auto wv = random_matrix<D, DV>(rng, p.wv, w_sigma);

    qkv::attention_options<float, N, DK, DV> opt{};
    if (biases) {
        opt.bias_q = random_matrix<1, DK>(rng, p.bq);
        opt.bias_k = random_matrix<1, DK>(rng, p.bk);
        opt.bias_v = random_matrix<1, DV>(rng, p.bv);
    }
    if (mk == masking::causal || mk == masking::both) opt.causal = p.causal = true;
    if (mk == masking::random_mask || mk == masking::both) {
        qkv::matrix<bool, N, N> mask{};
        std::bernoulli_distribution keep(0.6);
        p.allowed.resize(N * N);
        for (std::size_t i = 0; i < N; ++i)
            for (std::size_t j = 0; j < N; ++j) p.allowed[i * N + j] = mask(i, j) = keep(rng);
        if constexpr (N > 1)  // one fully masked row, to exercise the zero-row policy
            for (std::size_t j = 0; j < N; ++j) {
                p.allowed[(N - 1) * N + j] = 0;
                mask(N - 1, j) = false;
            }
        opt.mask = mask;
    }

    std::vector<float> got_out;
    std::vector<float> got_w;
    if constexpr (DO > 0) {
        const auto wo = random_matrix<DV, DO>(rng, p.wo, 1.0 / std::sqrt(static_cast<double>(DV)));
        const auto bo = random_matrix<1, DO>(rng, p.bo);
        const auto r = qkv::multi_head_attention<H>(x, wq, wk, wv, qkv::output_projection{wo, bo}, opt);
        got_out = flatten(r.output);
        for (std::size_t h = 0; h < H; ++h) {
            auto wh = flatten(r.weights[h]);
            got_w.insert(got_w.end(), wh.begin(), wh.end());
        }
    } else if constexpr (H == 1) {
        const auto r = qkv::self_attention(x, wq, wk, wv, opt);
        got_out = flatten(r.output);
        got_w = flatten(r.weights);
    } else {
        const auto r = qkv::multi_head_attention<H>(x, wq, wk, wv, opt);
        got_out = flatten(r.output);
        for (std::size_t h = 0; h < H; ++h) {
            auto wh = flatten(r.weights[h]);
            got_w.insert(got_w.end(), wh.begin(), wh.end());
        }
    }
    const auto want = qkv_test::reference_attention(p);
    INFO("H=" << H << " N=" << N << " d_in=" << D << " d_k=" << DK << " d_v=" << DV << " d_out=" << DO
              << " biases=" << biases << " masking=" << static_cast<int>(mk));
    const double e_out = qkv_test::nmse(got_out, want.output);
    const double e_w = qkv_test::nmse(got_w, want.weights);
    CHECK(e_out <= 1e-10);
    CHECK(e_w <= 1e-10);
}

template <std::size_t H, std::size_t N, std::size_t D, std::size_t DK, std::size_t DV, std::size_t DO = 0>
void sweep(std::uint64_t seed) {
    for (int b = 0; b < 2; ++b)
        for (auto mk : {masking::none, masking::causal, masking::random_mask, masking::both})
            check_case<H, N, D, DK, DV, DO>(seed++ * 7919u, b == 1, mk);
}

}  // namespace

TEST_CASE("constexpr self_attention at run time matches the float64 reference", "[core]") {
    sweep<1, 1, 1, 1, 1>(1);
    sweep<1, 3, 4, 3, 3>(2);
    sweep<1, 17, 5, 8, 3>(3);  // d_v != d_k, odd N
    sweep<1, 33, 16, 16, 24>(4);
}

TEST_CASE("constexpr multi_head_attention at run time matches the float64 reference", "[core]") {
    sweep<2, 3, 4, 4, 4>(10);
    sweep<2, 17, 6, 8, 6>(11);
    sweep<4, 13, 16, 16, 12>(12);
    sweep<2, 9, 8, 8, 4, 5>(13);  // with output projection to d_out = 5
    sweep<3, 5, 3, 6, 9, 2>(14);
}

TEST_CASE("the tutorial computed at run time equals the compile-time result", "[core][tutorial]") {
    namespace tut = qkv::tutorial;
    // Volatile copies force the run-time path through the same functions.
    volatile float one = 1.f;
    const auto run = qkv::self_attention(tut::inputs, tut::w_query, tut::w_key, tut::w_value, {.scale = one});
    CHECK(run == tut::plain);
    const auto run_scaled = qkv::self_attention(tut::inputs, tut::w_query, tut::w_key, tut::w_value);
    CHECK(run_scaled == tut::scaled);
}

TEST_CASE("softmax keeps large scores finite and propagates NaN like PyTorch", "[core][softmax]") {
    const auto big = qkv::matrix_of<float>({{1e4f, 1e4f - 1.f, -1e4f}});
    const auto w = qkv::softmax_rows(big);
    CHECK(std::abs(w(0, 0) - 0.7310586f) < 1e-6f);
    CHECK(std::abs(w(0, 1) - 0.2689414f) < 1e-6f);
    CHECK(w(0, 2) == 0.f);
    const auto with_nan = qkv::matrix_of<float>({{1.f, std::numeric_limits<float>::quiet_NaN(), 2.f}, {1.f, 2.f, 3.f}});
    const auto wn = qkv::softmax_rows(with_nan);
    CHECK(std::isnan(wn(0, 0)));
    CHECK(std::isnan(wn(0, 2)));
    CHECK(std::isfinite(wn(1, 0)));
}

TEST_CASE("scaled_dot_product_attention's issue-24 options at run time: the compile-time bits, option_error",
          "[core][sdpa]") {
    static constexpr auto q = qkv::matrix_of<float>({{0.5f, -1.f, 0.25f}, {1.5f, 0.75f, -0.5f}, {-1.f, 0.5f, 1.f}});
    static constexpr auto k = qkv::matrix_of<float>(
        {{1.f, 0.5f, -0.5f}, {-0.25f, 1.f, 0.75f}, {0.5f, -1.5f, 1.f}, {1.25f, 0.25f, 0.5f}, {-1.f, -0.5f, 0.25f}});
    static constexpr auto v =
        qkv::matrix_of<float>({{1.f, -1.f}, {0.5f, 2.f}, {-1.5f, 0.25f}, {2.f, 1.f}, {0.f, -0.5f}});
    static constexpr qkv::sdpa_options_for<decltype(q), decltype(k)> opt{.causal = qkv::causal_mode::bottom_right,
                                                                         .softcap = 2.f,
                                                                         .alibi_slope = 0.25f,
                                                                         .window = {2, 0},
                                                                         .sinks = qkv::row_of<float>({0.5f})};
    constexpr auto at_compile_time = qkv::scaled_dot_product_attention(q, k, v, opt);
    volatile float cap = 2.f;  // volatile: the run-time path through the same functions
    auto o = opt;
    o.softcap = cap;
    CHECK(qkv::scaled_dot_product_attention(q, k, v, o) == at_compile_time);
    CHECK(qkv::staged::scaled_dot_product_attention<q, k, v, opt> == at_compile_time);
    o.window = {-2, 0};
    CHECK_THROWS_AS(qkv::scaled_dot_product_attention(q, k, v, o), qkv::option_error);
    o.window = {2, 0};
    o.alibi_max_bias = 1.f;  // next to alibi_slope
    CHECK_THROWS_AS(qkv::scaled_dot_product_attention(q, k, v, o), qkv::option_error);
    o.alibi_max_bias = 0.f;
    o.alignment = qkv::position_alignment::top_left;  // contradicts causal bottom-right
    CHECK_THROWS_AS(qkv::scaled_dot_product_attention(q, k, v, o), qkv::option_error);
    o.alignment.reset();
    o.softcap = -cap;
    CHECK_THROWS_AS(qkv::scaled_dot_product_attention(q, k, v, o), qkv::option_error);
    o.softcap = cap;
    o.sinks = qkv::row_of<float>({std::numeric_limits<float>::quiet_NaN()});
    CHECK_THROWS_AS(qkv::scaled_dot_product_attention(q, k, v, o), qkv::option_error);
    CHECK_THROWS_AS(qkv::alibi_slope(8.f, 12, 12), qkv::option_error);
    CHECK_THROWS_AS(qkv::alibi_slope(-1.0, 0, 12), qkv::option_error);
    CHECK(qkv::alibi_slope(8.0, 0, ~std::size_t{0}) == 1.0);  // n = 2^63: the slope rounds to 1, no overflow
}
