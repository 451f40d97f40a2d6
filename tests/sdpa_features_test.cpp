// The attention options beyond PyTorch's SDPA on the float64 CPU backend (qkv/runtime/sdpa.hpp):
// sliding windows, sinks, softcap, ALiBi, K/V stored as f32/f16/q8_0/q4_0, log-sum-exp, and
// merge_attention. Against the NumPy fixtures of tests/data/sdpa/features
// (make_feature_fixtures.py), against a plain float64 reference written here from the header's
// formulas (over odd shapes, GQA and every combination), and every new rule of validate and
// validate_queries.
#include <qkv/runtime/cpu.hpp>
#include <qkv/runtime/error.hpp>
#include <qkv/runtime/sdpa.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "npy/npy.hpp"
#include "support/catch.hpp"
#include "support/expect.hpp"
#include "support/reference.hpp"
#include "support/sdpa_problems.hpp"

namespace {

namespace fs = std::filesystem;
using dims = std::vector<std::size_t>;
using sizes = std::initializer_list<std::size_t>;
using qkv::element_type;

constexpr double inf = std::numeric_limits<double>::infinity();

using qkv_test::sdpa_data;

template <class To, class From>
std::vector<To> convert(const std::vector<From>& v) {
    return std::vector<To>(v.begin(), v.end());
}

sdpa_data<double> widen(const sdpa_data<float>& o) {
    sdpa_data<double> d;
    d.shape = o.shape;
    d.q = convert<double>(o.q), d.k = convert<double>(o.k), d.v = convert<double>(o.v);
    d.additive = convert<double>(o.additive), d.sinks = convert<double>(o.sinks);
    d.alibi_slopes = convert<double>(o.alibi_slopes);
    d.mask = o.mask, d.mask_shape = o.mask_shape, d.options = o.options;
    return d;
}

// ---- A plain float64 reference, written from the header's formulas -------------------------------

struct reference_result {
    std::vector<double> output, weights, lse;
};

/// Straight loops over (b, h, i, j), each rule as the header states it. K and V are taken as given
/// (the caller round-trips them for a kv_type).
reference_result reference(const sdpa_data<double>& p) {
    const qkv::sdpa_shape& s = p.shape;
    const qkv::sdpa_options& o = p.options;
    const std::size_t B = s.batch, Hq = s.q_heads, Hkv = s.kv_heads, L = s.q_len, S = s.kv_len, E = s.d_qk, Ev = s.d_v;
    const double scale = o.scale ? static_cast<double>(*o.scale) : 1.0 / std::sqrt(static_cast<double>(E));
    const double off =
        o.alignment == qkv::causal_alignment::bottom_right ? static_cast<double>(S) - static_cast<double>(L) : 0.0;
    // ALiBi slopes: n = 2^floor(log2 Hq), m0 = 2^(-b/n), m1 = 2^(-b/(2n)).
    std::vector<double> slope(Hq, 0.0);
    if (!p.alibi_slopes.empty()) slope = p.alibi_slopes;  // given, one per query head
    if (o.alibi_max_bias > 0) {
        const double b = o.alibi_max_bias;
        const double n = std::exp2(std::floor(std::log2(static_cast<double>(Hq))));
        for (std::size_t h = 0; h < Hq; ++h) {
            const double hd = static_cast<double>(h);
            slope[h] = hd < n ? std::pow(std::pow(2.0, -b / n), hd + 1)
                              : std::pow(std::pow(2.0, -b / (2 * n)), 2 * (hd - n) + 1);
        }
    }
    const bool any_mask = !p.mask.empty() || !p.additive.empty();
    const qkv::mask_strides ms = any_mask ? qkv::broadcast_strides(p.mask_shape, s) : qkv::mask_strides{};
    reference_result r;
    r.output.assign(B * Hq * L * Ev, 0.0);
    r.weights.assign(B * Hq * L * S, 0.0);
    r.lse.assign(B * Hq * L, -inf);
    std::vector<double> score(S);
    std::vector<bool> ok(S);
    for (std::size_t b = 0; b < B; ++b)
        for (std::size_t h = 0; h < Hq; ++h)
            for (std::size_t i = 0; i < L; ++i) {
                const std::size_t g = h / (Hq / Hkv);
                const double pos = static_cast<double>(i) + off;
                double mx = -inf;
                bool poisoned = false;
                for (std::size_t j = 0; j < S; ++j) {
                    double dot = 0;
                    for (std::size_t c = 0; c < E; ++c)
                        dot += p.q[((b * Hq + h) * L + i) * E + c] * p.k[((b * Hkv + g) * S + j) * E + c];
                    double sc = scale * dot;
                    if (o.softcap > 0) sc = o.softcap * std::tanh(sc / o.softcap);
                    sc -= slope[h] * std::abs(pos - static_cast<double>(j));
                    const std::size_t m = b * ms.batch + h * ms.head + i * ms.row + j * ms.col;
                    if (!p.additive.empty()) sc += p.additive[m];
                    const double jd = static_cast<double>(j);
                    bool allowed = p.mask.empty() || p.mask[m] != 0;
                    if (o.causal && jd > pos) allowed = false;
                    if (o.window_left >= 0 && jd < pos - static_cast<double>(o.window_left)) allowed = false;
                    if (o.window_right >= 0 && jd > pos + static_cast<double>(o.window_right)) allowed = false;
                    if (sc == -inf) allowed = false;
                    ok[j] = allowed;
                    score[j] = sc;
                    if (!allowed) continue;
                    if (std::isnan(sc) || sc == inf) poisoned = true;
                    mx = std::max(mx, sc);
                }
                const std::size_t row = (b * Hq + h) * L + i;
                if (mx == -inf && !poisoned) continue;  // no key: zeros, lse -inf
                if (poisoned) {
                    std::fill(r.output.begin() + static_cast<std::ptrdiff_t>(row * Ev),
                              r.output.begin() + static_cast<std::ptrdiff_t>((row + 1) * Ev), NAN);
                    r.lse[row] = NAN;
                    continue;
                }
                const double sink = p.sinks.empty() ? -inf : p.sinks[h];
                const double top = std::max(mx, sink);
                double sum = 0, own = 0;
                for (std::size_t j = 0; j < S; ++j)
                    if (ok[j]) {
                        sum += std::exp(score[j] - top);
                        own += std::exp(score[j] - mx);
                    }
                const double denominator = sum + std::exp(sink - top);
                r.lse[row] = mx + std::log(own);
                for (std::size_t j = 0; j < S; ++j) {
                    if (!ok[j]) continue;
                    const double w = std::exp(score[j] - top) / denominator;
                    r.weights[row * S + j] = w;
                    for (std::size_t c = 0; c < Ev; ++c)
                        r.output[row * Ev + c] += w * p.v[((b * Hkv + g) * S + j) * Ev + c];
                }
            }
    return r;
}

/// Every element within `rel` of the expected value (relative, or absolute below 1); an expected
/// zero, -inf or NaN must be matched exactly.
template <class T>
void check_close(const std::vector<T>& got, const std::vector<double>& want, double rel, const std::string& what) {
    REQUIRE(got.size() == want.size());
    std::size_t bad = 0, first_bad = 0;
    for (std::size_t i = 0; i < want.size(); ++i) {
        const double g = static_cast<double>(got[i]), w = want[i];
        bool ok = false;
        if (std::isnan(w))
            ok = std::isnan(g);
        else if (w == 0.0 || std::isinf(w))
            ok = g == w;
        else
            ok = std::isfinite(g) && std::abs(g - w) <= rel * std::max(1.0, std::abs(w));
        if (!ok && bad++ == 0) first_bad = i;
    }
    INFO(what << ": " << bad << " of " << want.size() << " elements off; the first, " << first_bad << ", is "
              << static_cast<double>(got[first_bad]) << ", expected " << want[first_bad]);
    CHECK(bad == 0);
}

// ---- The NumPy fixtures -------------------------------------------------------------------------

struct fixture {
    sdpa_data<float> problem;
    std::vector<double> out, weights, lse;
};

fixture load(const std::string& name) {
    const fs::path dir = fs::path(QKV_TEST_DATA_DIR) / "sdpa" / "features" / name;
    fixture f;
    sdpa_data<float>& o = f.problem;
    const qkv::npy::array q = qkv::npy::read(dir / "q.npy"), k = qkv::npy::read(dir / "k.npy"),
                          v = qkv::npy::read(dir / "v.npy");
    const auto four = [](const dims& d) {
        dims out(4 - d.size(), 1);
        out.insert(out.end(), d.begin(), d.end());
        return out;
    };
    const dims qs = four(q.shape), ks = four(k.shape), vs = four(v.shape);
    o.shape = {.batch = qs[0],
               .q_heads = qs[1],
               .kv_heads = ks[1],
               .q_len = qs[2],
               .kv_len = ks[2],
               .d_qk = qs[3],
               .d_v = vs[3]};
    o.q = q.to_float(), o.k = k.to_float(), o.v = v.to_float();
    if (fs::exists(dir / "mask.npy")) {
        const qkv::npy::array m = qkv::npy::read(dir / "mask.npy");
        if (m.type == qkv::npy::dtype::b1)
            o.mask = m.to_bool();
        else
            o.additive = m.to_float();
        o.mask_shape = m.shape;
    }
    if (fs::exists(dir / "sinks.npy")) o.sinks = qkv::npy::read(dir / "sinks.npy").to_float();
    f.out = qkv::npy::read(dir / "expected_out.npy").to_double();
    f.lse = qkv::npy::read(dir / "expected_lse.npy").to_double();
    if (fs::exists(dir / "expected_weights.npy")) f.weights = qkv::npy::read(dir / "expected_weights.npy").to_double();
    o.options.return_weights = !f.weights.empty();
    o.options.return_lse = true;

    std::ifstream args(dir / "args.txt");
    REQUIRE(args);
    for (std::string flag; args >> flag;) {
        if (flag == "--causal") {
            o.options.causal = true;
        } else if (flag == "--causal-align") {
            std::string align;
            args >> align;
            REQUIRE((align == "top-left" || align == "bottom-right"));
            o.options.alignment =
                align == "top-left" ? qkv::causal_alignment::top_left : qkv::causal_alignment::bottom_right;
        } else if (flag == "--scale" || flag == "--softcap" || flag == "--alibi") {
            double value = 0;
            args >> value;
            if (flag == "--scale") o.options.scale = static_cast<float>(value);
            if (flag == "--softcap") o.options.softcap = static_cast<float>(value);
            if (flag == "--alibi") o.options.alibi_max_bias = static_cast<float>(value);
        } else if (flag == "--window") {
            std::string w;
            args >> w;
            const std::size_t comma = w.find(',');
            REQUIRE(comma != std::string::npos);
            o.options.window_left = std::stoll(w.substr(0, comma));
            o.options.window_right = std::stoll(w.substr(comma + 1));
        } else if (flag == "--kv-type") {
            std::string t;
            args >> t;
            o.options.kv_type = qkv::parse_element_type(t);
            REQUIRE(o.options.kv_type);
        } else {
            FAIL("unknown flag in " << name << "/args.txt: " << flag);
        }
    }
    return f;
}

const char* const feature_fixtures[] = {"window_top_left",
                                        "window_bottom_right_l_lt_s",
                                        "window_causal_bottom_right_l_gt_s",
                                        "window_causal_top_left_l_gt_s",
                                        "sinks_masked",
                                        "sinks_causal_bottom_right_l_gt_s",
                                        "softcap_masks",
                                        "softcap_bool_mask",
                                        "alibi_gqa_12",
                                        "alibi_gqa_20",
                                        "alibi_softcap_top_left",
                                        "kv_q8_0",
                                        "kv_q4_0",
                                        "kv_f16",
                                        "kv_f32",
                                        "everything",
                                        "single_lse",
                                        "tall_top_left"};

std::vector<float> random_floats(std::size_t n, std::mt19937_64& rng, double sigma = 1.0) {
    std::vector<float> f;
    f.reserve(n);
    for (double e : qkv_test::normal_values(n, rng, sigma)) f.push_back(static_cast<float>(e));
    return f;
}

void expect_invalid(const sdpa_data<float>& o, std::initializer_list<std::string> words) {
    const qkv::sdpa_problem p = o.view();
    qkv_test::expect_invalid([&] { qkv::validate(p); }, words);
    CHECK_THROWS_AS(qkv::validate(widen(o).view()), qkv::invalid_argument);
    CHECK_THROWS_AS(qkv::cpu::sdpa(p), qkv::invalid_argument);
    CHECK_THROWS_AS(qkv::cpu::sdpa_f64(p), qkv::invalid_argument);
}

sdpa_data<float> valid() {
    std::mt19937_64 rng(5);
    sdpa_data<float> o;
    o.shape = {.batch = 2, .q_heads = 4, .kv_heads = 2, .q_len = 3, .kv_len = 5, .d_qk = 32, .d_v = 64};
    o.q = random_floats(2 * 4 * 3 * 32, rng);
    o.k = random_floats(2 * 2 * 5 * 32, rng);
    o.v = random_floats(2 * 2 * 5 * 64, rng);
    return o;
}

}  // namespace

TEST_CASE("cpu sdpa: windows, sinks, softcap, ALiBi, K/V types and lse match the NumPy fixtures",
          "[cpu][sdpa][features]") {
    for (const char* name : feature_fixtures) {
        INFO("fixture " << name);
        const fixture f = load(name);
        const qkv::sdpa_problem p = f.problem.view();
        const qkv::sdpa_output_f64 got64 = qkv::cpu::sdpa_f64(p);
        check_close(got64.output, f.out, 1e-12, std::string(name) + " output (f64)");
        check_close(got64.lse, f.lse, 1e-12, std::string(name) + " lse (f64)");
        const qkv::sdpa_output got = qkv::cpu::sdpa(p);
        check_close(got.output, f.out, 2e-7, std::string(name) + " output (f32)");
        check_close(got.lse, f.lse, 2e-7, std::string(name) + " lse (f32)");
        if (!f.weights.empty()) {
            check_close(got64.weights, f.weights, 1e-12, std::string(name) + " weights (f64)");
            check_close(got.weights, f.weights, 2e-7, std::string(name) + " weights (f32)");
        }
        // The float64 problem of the same float32 values gives sdpa_f64's results exactly.
        const qkv::sdpa_output_f64 exact = qkv::cpu::sdpa(widen(f.problem).view());
        CHECK(exact.output == got64.output);
        CHECK(exact.weights == got64.weights);
        CHECK(exact.lse == got64.lse);
    }
}

TEST_CASE("cpu sdpa: every option over odd shapes, GQA and both alignments matches the plain reference",
          "[cpu][sdpa][features]") {
    std::mt19937_64 rng(20261125);
    std::bernoulli_distribution coin(0.5);
    std::uniform_int_distribution<int> window_side(-1, 20);
    std::size_t cases = 0;
    for (const std::size_t L : sizes{1, 3, 17, 113})
        for (const std::size_t S : sizes{1, 3, 17, 113})
            for (const std::size_t E : sizes{32, 64, 96}) {
                // Hq, Hkv: 1:1, 4:2, 12:4 (GQA, Hq not a power of two), 20:5.
                const std::size_t heads[4][2] = {{1, 1}, {4, 2}, {12, 4}, {20, 5}};
                const std::size_t* hh = heads[cases % 4];
                sdpa_data<double> o;
                o.shape = {.batch = 1 + cases % 2,
                           .q_heads = hh[0],
                           .kv_heads = hh[1],
                           .q_len = L,
                           .kv_len = S,
                           .d_qk = E,
                           .d_v = E == 96 ? 32 : E + 32};
                const qkv::sdpa_shape& s = o.shape;
                o.q = qkv_test::normal_values(s.batch * s.q_heads * L * E, rng);
                o.k = qkv_test::normal_values(s.batch * s.kv_heads * S * E, rng);
                o.v = qkv_test::normal_values(s.batch * s.kv_heads * S * s.d_v, rng);
                qkv::sdpa_options& opt = o.options;
                opt.causal = coin(rng);
                opt.alignment = coin(rng) ? qkv::causal_alignment::top_left : qkv::causal_alignment::bottom_right;
                opt.window_left = window_side(rng);
                opt.window_right = window_side(rng);
                opt.softcap = coin(rng) ? 0.f : 3.f;
                opt.alibi_max_bias = coin(rng) ? 0.f : 8.f;
                if (opt.alibi_max_bias > 0 && coin(rng)) {  // slopes given instead, as FlashAttention takes them
                    opt.alibi_max_bias = 0;
                    std::uniform_real_distribution<double> slope(0.0, 1.5);
                    for (std::size_t h = 0; h < s.q_heads; ++h) o.alibi_slopes.push_back(slope(rng));
                }
                opt.scale = coin(rng) ? std::optional<float>{} : std::optional<float>(-0.2f);
                opt.return_weights = true;
                opt.return_lse = true;
                if (coin(rng)) {  // a (B, 1, L, S) bool mask or an (L, S) additive one with -inf entries
                    std::bernoulli_distribution keep(0.7);
                    if (coin(rng)) {
                        o.mask.resize(s.batch * L * S);
                        for (auto& m : o.mask) m = keep(rng) ? 1 : 0;
                        o.mask_shape = {s.batch, 1, L, S};
                    } else {
                        o.additive = qkv_test::normal_values(L * S, rng);
                        for (double& a : o.additive)
                            if (!keep(rng)) a = -inf;
                        o.mask_shape = {L, S};
                    }
                }
                if (coin(rng)) {
                    o.sinks = qkv_test::normal_values(s.q_heads, rng, 2.0);
                    o.sinks[0] = -inf;
                }
                INFO("L " << L << ", S " << S << ", E " << E << ", Hq " << s.q_heads << ", causal " << opt.causal
                          << ", bottom-right " << (opt.alignment == qkv::causal_alignment::bottom_right) << ", window "
                          << opt.window_left << "," << opt.window_right << ", softcap " << opt.softcap << ", alibi "
                          << opt.alibi_max_bias << " slopes " << o.alibi_slopes.size() << ", sinks " << o.sinks.size()
                          << ", masks " << o.mask.size() << "/" << o.additive.size());
                const reference_result want = reference(o);
                const qkv::sdpa_output_f64 got = qkv::cpu::sdpa(o.view());
                check_close(got.output, want.output, 1e-12, "output");
                check_close(got.weights, want.weights, 1e-12, "weights");
                check_close(got.lse, want.lse, 1e-12, "lse");
                ++cases;
            }
    CHECK(cases == 48);
}

TEST_CASE("cpu sdpa: K/V stored as kv_type are round_trip(K), round_trip(V)", "[cpu][sdpa][features]") {
    std::mt19937_64 rng(24);
    sdpa_data<float> o;
    o.shape = {.batch = 2, .q_heads = 4, .kv_heads = 2, .q_len = 17, .kv_len = 113, .d_qk = 64, .d_v = 32};
    o.q = random_floats(2 * 4 * 17 * 64, rng);
    o.k = random_floats(2 * 2 * 113 * 64, rng);
    o.v = random_floats(2 * 2 * 113 * 32, rng);
    o.options.causal = true;
    o.options.alignment = qkv::causal_alignment::bottom_right;
    o.options.return_weights = true;
    o.options.return_lse = true;
    const qkv::sdpa_output_f64 plain = qkv::cpu::sdpa_f64(o.view());
    // Unset kv_type: K and V as given, whatever the precision says (the CPU backend ignores it).
    o.options.precision = qkv::precision::fp16;
    CHECK(qkv::cpu::sdpa_f64(o.view()).output == plain.output);
    CHECK(qkv::stored_kv_type(o.options) == element_type::f16);
    o.options.precision = qkv::precision::fp32;
    CHECK(qkv::stored_kv_type(o.options) == element_type::f32);
    o.options.kv_type = element_type::f32;
    CHECK(qkv::cpu::sdpa_f64(o.view()).output == plain.output);
    for (const element_type t : {element_type::f16, element_type::q8_0, element_type::q4_0}) {
        INFO(qkv::to_string(t));
        o.options.kv_type = t;
        CHECK(qkv::stored_kv_type(o.options) == t);
        const qkv::sdpa_output_f64 got = qkv::cpu::sdpa_f64(o.view());
        sdpa_data<float> manual = o;
        manual.options.kv_type.reset();
        manual.k = qkv::round_trip(t, o.k);
        manual.v = qkv::round_trip(t, o.v);
        const qkv::sdpa_output_f64 want = qkv::cpu::sdpa_f64(manual.view());
        CHECK(got.output == want.output);
        CHECK(got.weights == want.weights);
        CHECK(got.lse == want.lse);
        CHECK(got.output != plain.output);
        // The same through a float64 problem (its K and V narrowed to float32 first).
        CHECK(qkv::cpu::sdpa(widen(o).view()).output == want.output);
        // The error against full-precision K/V is what the format allows.
        const double err = qkv_test::nmse(got.output, plain.output);
        CHECK(err < (t == element_type::f16 ? 1e-6 : t == element_type::q8_0 ? 1e-3 : 2e-2));
    }
    // A float64 K beyond float32 cannot be stored as any kv_type; a NaN cannot be quantized.
    sdpa_data<double> big = widen(o);
    big.k[5] = 1e300;
    for (const element_type t : {element_type::f32, element_type::q8_0}) {
        big.options.kv_type = t;
        CHECK_THROWS_WITH(qkv::cpu::sdpa(big.view()),
                          Catch::Matchers::Contains("k: element 5 is beyond the float32 range"));
    }
    o.options.kv_type = element_type::q4_0;
    o.v[40] = std::numeric_limits<float>::quiet_NaN();
    CHECK_THROWS_WITH(qkv::cpu::sdpa(o.view()),
                      Catch::Matchers::Contains("v stored as kv_type q4_0") && Catch::Matchers::Contains("element 40"));
    // f16 stores the NaN as NaN: it reaches column 8 (v[40] is key 1, column 8 of K/V head 0) of
    // the rows that attend key 1, and no other column.
    o.options.kv_type = element_type::f16;
    const qkv::sdpa_output with_nan = qkv::cpu::sdpa(o.view());
    CHECK(std::isnan(with_nan.output[8]));
    CHECK(std::isfinite(with_nan.output[0]));
}

TEST_CASE("cpu sdpa: sinks, softcap and ALiBi switched off give exactly the plain call", "[cpu][sdpa][features]") {
    std::mt19937_64 rng(8);
    sdpa_data<float> o = valid();
    o.options.return_weights = true;
    o.options.return_lse = true;
    o.options.causal = true;
    const qkv::sdpa_output_f64 plain = qkv::cpu::sdpa_f64(o.view());
    o.sinks.assign(4, -std::numeric_limits<float>::infinity());        // -inf: no sink
    o.options.window_left = std::numeric_limits<std::int64_t>::max();  // no overflow, no effect
    o.options.window_right = std::numeric_limits<std::int64_t>::max();
    const qkv::sdpa_output_f64 same = qkv::cpu::sdpa_f64(o.view());
    CHECK(same.output == plain.output);
    CHECK(same.weights == plain.weights);
    CHECK(same.lse == plain.lse);
    // The lse is the log of the softmax denominator: the weights are e^(s_j - lse).
    o.sinks.clear();
    o.options.window_left = o.options.window_right = -1;
    o.options.scale = 0.5f;
    const qkv::sdpa_output_f64 r = qkv::cpu::sdpa_f64(o.view());
    for (std::size_t row = 0; row < 2 * 4 * 3; ++row) {
        const std::size_t b = row / 12, h = (row / 3) % 4, i = row % 3;
        for (std::size_t j = 0; j < 5; ++j) {
            double dot = 0;
            for (std::size_t c = 0; c < 32; ++c)
                dot += static_cast<double>(o.q[row * 32 + c]) *
                       static_cast<double>(o.k[((b * 2 + h / 2) * 5 + j) * 32 + c]);
            const double want = j <= i ? std::exp(0.5 * dot - r.lse[row]) : 0.0;
            CHECK(std::abs(r.weights[row * 5 + j] - want) <= 1e-14);
        }
    }
}

TEST_CASE("cpu sdpa: a row with no key gets zeros and lse -inf, sinks or not; a NaN row gets NaN lse",
          "[cpu][sdpa][features]") {
    sdpa_data<float> o = valid();
    o.options.return_lse = true;
    o.options.return_weights = true;
    o.sinks = {1.f, 2.f, 3.f, 4.f};
    o.options.window_left = 0;
    o.options.window_right = 0;  // only key i (top-left) ...
    o.mask.assign(3 * 5, 1);
    o.mask[1 * 5 + 1] = 0;  // ... and row 1 may not attend key 1: nothing left
    o.mask_shape = {3, 5};
    const qkv::sdpa_output r = qkv::cpu::sdpa(o.view());
    for (std::size_t bh = 0; bh < 8; ++bh) {
        CHECK(r.lse[bh * 3 + 1] == -std::numeric_limits<float>::infinity());
        for (std::size_t c = 0; c < 64; ++c) CHECK(r.output[(bh * 3 + 1) * 64 + c] == 0.f);
        for (std::size_t j = 0; j < 5; ++j) CHECK(r.weights[(bh * 3 + 1) * 5 + j] == 0.f);
        // A row with its one key: the weight is e^s / (e^s + e^σ) < 1, the lse is that key's score.
        CHECK(r.weights[(bh * 3 + 0) * 5 + 0] > 0.f);
        CHECK(r.weights[(bh * 3 + 0) * 5 + 0] < 1.f);
    }
    o.q[0] = std::numeric_limits<float>::quiet_NaN();  // batch 0, head 0, row 0
    const qkv::sdpa_output n = qkv::cpu::sdpa(o.view());
    CHECK(std::isnan(n.lse[0]));
    CHECK(std::isnan(n.output[0]));
    CHECK(std::isfinite(n.lse[2]));
}

TEST_CASE("visible_keys and alibi_slope", "[cpu][sdpa][features]") {
    const qkv::sdpa_shape s{.batch = 1, .q_heads = 1, .kv_heads = 1, .q_len = 3, .kv_len = 10, .d_qk = 1, .d_v = 1};
    const auto keys = [&](qkv::sdpa_options o, std::size_t i) {
        const qkv::key_range r = qkv::visible_keys(s, o, i);
        return std::vector<std::size_t>{r.first, r.end};
    };
    using v = std::vector<std::size_t>;
    CHECK(keys({}, 0) == v{0, 10});
    CHECK(keys({.causal = true}, 1) == v{0, 2});
    CHECK(keys({.causal = true, .alignment = qkv::causal_alignment::bottom_right}, 1) == v{0, 9});
    CHECK(keys({.window_left = 2, .window_right = 1}, 1) == v{0, 3});
    CHECK(keys({.alignment = qkv::causal_alignment::bottom_right, .window_left = 2, .window_right = 0}, 1) == v{6, 9});
    CHECK(keys({.causal = true, .window_left = 0}, 2) == v{2, 3});
    CHECK(keys({.window_left = -1, .window_right = std::numeric_limits<std::int64_t>::max()}, 0) == v{0, 10});
    CHECK(keys({.window_left = std::numeric_limits<std::int64_t>::max(), .window_right = 0}, 2) == v{0, 3});
    const qkv::sdpa_shape tall{.batch = 1, .q_heads = 1, .kv_heads = 1, .q_len = 10, .kv_len = 3, .d_qk = 1, .d_v = 1};
    const qkv::key_range none = qkv::visible_keys(
        tall, {.causal = true, .alignment = qkv::causal_alignment::bottom_right}, 6);  // 6 + 3 - 10 < 0
    CHECK(none.first >= none.end);

    // ggml's slopes: 8 heads, b = 8: 2^-1 ... 2^-8. 12 heads: n = 8, then m1 = 2^-0.5 to odd powers.
    for (std::size_t h = 0; h < 8; ++h) CHECK(qkv::alibi_slope(8.f, 8, h) == std::ldexp(1.0, -static_cast<int>(h + 1)));
    const auto close = [](double got, double want) { return std::abs(got - want) <= 1e-14 * want; };
    CHECK(close(qkv::alibi_slope(8.f, 12, 8), std::pow(2.0, -0.5)));  // n = 8, m1 = 2^(-8/16)
    CHECK(close(qkv::alibi_slope(8.f, 12, 11), std::pow(2.0, -3.5)));
    CHECK(close(qkv::alibi_slope(8.f, 20, 16), std::pow(2.0, -0.25)));  // n = 16, m1 = 2^(-8/32)
    CHECK(close(qkv::alibi_slope(8.f, 20, 19), std::pow(2.0, -1.75)));
    CHECK(close(qkv::alibi_slope(8.f, 20, 15), std::pow(2.0, -8.0)));
    CHECK(qkv::alibi_slope(0.f, 12, 3) == 0.0);
    CHECK_THROWS_AS((void)qkv::alibi_slope(8.f, 12, 12), qkv::invalid_argument);
    CHECK_THROWS_AS((void)qkv::alibi_slope(-1.f, 12, 0), qkv::invalid_argument);
}

// ---- validate and validate_queries ----------------------------------------------------------------

TEST_CASE("validate(sdpa): the new options, named", "[cpu][sdpa][validate][features]") {
    CHECK_NOTHROW(qkv::validate(valid().view()));
    sdpa_data<float> o = valid();
    o.options.window_left = -2;
    expect_invalid(o, {"window_left must be -1 (unbounded) or at least 0", "-2"});
    o = valid();
    o.options.window_right = std::numeric_limits<std::int64_t>::min();
    expect_invalid(o, {"window_right"});
    for (const float bad : {-1.f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
        o = valid();
        o.options.softcap = bad;
        expect_invalid(o, {"softcap must be finite and at least 0"});
        o = valid();
        o.options.alibi_max_bias = bad;
        expect_invalid(o, {"alibi_max_bias must be finite and at least 0"});
    }
    o = valid();
    o.sinks = {1.f, 2.f, 3.f};
    expect_invalid(o, {"sinks has 3 elements", "q_heads = 4"});
    o.sinks = {1.f, std::numeric_limits<float>::quiet_NaN(), 3.f, 4.f};
    expect_invalid(o, {"sinks[1] is nan", "finite, or -inf"});
    o.sinks = {1.f, 2.f, std::numeric_limits<float>::infinity(), 4.f};
    expect_invalid(o, {"sinks[2] is inf"});
    o.sinks = {1.f, 2.f, -std::numeric_limits<float>::infinity(), 4.f};
    CHECK_NOTHROW(qkv::validate(o.view()));
    o = valid();
    o.alibi_slopes = {0.5f, 0.25f};
    expect_invalid(o, {"alibi_slopes has 2 elements", "q_heads = 4"});
    for (const float bad : {-0.5f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
        o.alibi_slopes = {0.5f, bad, 0.f, 1.f};
        expect_invalid(o, {"alibi_slopes[1] is", "finite and at least 0"});
    }
    o.alibi_slopes = {0.5f, 0.25f, 0.f, 1.f};
    CHECK_NOTHROW(qkv::validate(o.view()));
    o.options.alibi_max_bias = 8.f;
    expect_invalid(o, {"alibi_slopes and alibi_max_bias are both given"});
    o = valid();
    o.shape.d_v = 48;
    o.v.resize(2 * 2 * 5 * 48);
    CHECK_NOTHROW(qkv::validate(o.view()));
    o.options.kv_type = element_type::f16;
    CHECK_NOTHROW(qkv::validate(o.view()));
    for (const element_type t : {element_type::q8_0, element_type::q4_0}) {
        o.options.kv_type = t;
        expect_invalid(o, {"kv_type " + std::string(qkv::to_string(t)), "d_v (48)", "multiples of 32"});
    }
    o = valid();
    o.options.kv_type = static_cast<element_type>(11);
    expect_invalid(o, {"unknown kv_type (11)"});
    o = valid();
    o.options.return_lse = true;
    o.shape.q_len = std::size_t{1} << 62;
    expect_invalid(o, {"shape too large"});
}

TEST_CASE("validate_queries: every check of validate but K and V, which must be empty", "[cpu][sdpa][validate]") {
    sdpa_data<float> o = valid();
    CHECK_THROWS_WITH(qkv::validate_queries(o.view()), Catch::Matchers::Contains("k and v must be empty"));
    o.k.clear();
    CHECK_THROWS_WITH(qkv::validate_queries(o.view()), Catch::Matchers::Contains("v 1280"));
    o.v.clear();
    CHECK_NOTHROW(qkv::validate_queries(o.view()));
    CHECK_NOTHROW(qkv::validate_queries(widen(o).view()));
    CHECK_THROWS_AS(qkv::validate(o.view()), qkv::invalid_argument);  // validate wants K and V
    // The same checks as validate, on q, the masks and the options.
    const auto refused = [&](sdpa_data<float> bad, const std::string& words) {
        INFO(words);
        CHECK_THROWS_WITH(qkv::validate_queries(bad.view()), Catch::Matchers::Contains(words));
        CHECK_THROWS_WITH(qkv::validate_queries(widen(bad).view()), Catch::Matchers::Contains(words));
    };
    sdpa_data<float> bad = o;
    bad.q.pop_back();
    refused(bad, "q has 767 elements");
    bad = o;
    bad.shape.kv_len = 0;
    refused(bad, "kv_len must be at least 1");
    bad = o;
    bad.shape.kv_heads = 3;
    refused(bad, "kv_heads (3) must divide q_heads (4)");
    bad = o;
    bad.mask.assign(4, 1);
    bad.mask_shape = {4};
    refused(bad, "does not broadcast");
    bad = o;
    bad.mask.assign(5, 2);
    bad.mask_shape = {5};
    refused(bad, "mask values must be 0 or 1");
    bad = o;
    bad.options.scale = std::numeric_limits<float>::infinity();
    refused(bad, "scale must be finite");
    bad = o;
    bad.options.alignment = static_cast<qkv::causal_alignment>(qkv::causal_mode::none);
    refused(bad, "unknown alignment (0)");
    bad = o;
    bad.options.window_left = -3;
    refused(bad, "window_left");
    bad = o;
    bad.sinks = {1.f};
    refused(bad, "sinks has 1 elements");
    bad = o;
    bad.shape.d_qk = 40;
    bad.q.resize(2 * 4 * 3 * 40);
    bad.options.kv_type = element_type::q8_0;
    refused(bad, "d_qk (40)");
    bad = o;
    bad.shape.kv_len = std::size_t{1} << 60;  // the K/V store's size overflows
    refused(bad, "shape too large");
    // Any finite scale here too.
    o.options.scale = -0.f;
    CHECK_NOTHROW(qkv::validate_queries(o.view()));
}

// ---- merge_attention ---------------------------------------------------------------------------------

namespace {

/// Every element within `rel` of the expected, relative to the largest magnitude of its row of
/// `width` elements (at least `floor`); the same NaN, -inf and zeros exactly.
void check_merged(const std::vector<double>& got, const std::vector<double>& want, std::size_t width, double floor,
                  double rel, const char* what) {
    REQUIRE(got.size() == want.size());
    double worst = 0;
    std::size_t bad = 0;
    for (std::size_t row = 0; row < want.size() / width; ++row) {
        double scale = floor;
        for (std::size_t c = 0; c < width; ++c)
            if (std::isfinite(want[row * width + c])) scale = std::max(scale, std::abs(want[row * width + c]));
        for (std::size_t c = 0; c < width; ++c) {
            const std::size_t i = row * width + c;
            if (std::isnan(want[i]) || std::isinf(want[i]) || want[i] == 0.0) {
                if (!(std::isnan(want[i]) ? std::isnan(got[i]) : got[i] == want[i])) ++bad;
                continue;
            }
            worst = std::max(worst, std::abs(got[i] - want[i]) / scale);
        }
    }
    INFO(what << ": worst error " << worst << " of the row's largest value, " << bad << " special values differ");
    CHECK(bad == 0);
    CHECK(worst <= rel);
}

}  // namespace

TEST_CASE("merge_attention: parts over disjoint key sets merge into the whole call", "[cpu][sdpa][merge]") {
    std::mt19937_64 rng(77);
    std::size_t checked = 0;
    for (const bool interleaved : {false, true})
        for (const std::size_t n_parts : sizes{1, 2, 3, 4})
            for (const bool sinks : {false, true}) {
                sdpa_data<double> o;
                o.shape = {.batch = 2, .q_heads = 6, .kv_heads = 3, .q_len = 17, .kv_len = 113, .d_qk = 32, .d_v = 24};
                const qkv::sdpa_shape& s = o.shape;
                o.q = qkv_test::normal_values(2 * 6 * 17 * 32, rng);
                o.k = qkv_test::normal_values(2 * 3 * 113 * 32, rng);
                o.v = qkv_test::normal_values(2 * 3 * 113 * 24, rng);
                o.options.causal = true;
                o.options.alignment = qkv::causal_alignment::bottom_right;
                o.options.window_left = 60;
                o.options.alibi_max_bias = 4.f;
                o.options.softcap = 5.f;
                o.options.return_lse = true;
                o.mask.resize(2 * 17 * 113);
                std::bernoulli_distribution keep(0.8);
                for (auto& m : o.mask) m = keep(rng) ? 1 : 0;
                for (std::size_t j = 0; j < 113; ++j) o.mask[5 * 113 + j] = 0;  // batch 0, row 5: no key at all
                o.mask_shape = {2, 1, 17, 113};
                std::vector<double> sink_values;
                if (sinks) {
                    sink_values = qkv_test::normal_values(6, rng, 2.0);
                    sink_values[1] = -inf;
                    sink_values[4] = 40.0;  // far above every score
                }
                sdpa_data<double> whole = o;
                whole.sinks = sink_values;
                const qkv::sdpa_output_f64 want = qkv::cpu::sdpa(whole.view());

                // Part p: the keys j with part(j) == p, as a bool mask ANDed with the call's (the
                // positions, and so causal, the window and ALiBi, are unchanged).
                const auto part_of = [&](std::size_t j) { return interleaved ? j % n_parts : j * n_parts / s.kv_len; };
                std::vector<qkv::sdpa_output_f64> outs;
                for (std::size_t p = 0; p < n_parts; ++p) {
                    sdpa_data<double> part = o;
                    for (std::size_t b = 0; b < 2; ++b)
                        for (std::size_t i = 0; i < 17; ++i)
                            for (std::size_t j = 0; j < 113; ++j)
                                if (part_of(j) != p) part.mask[(b * 17 + i) * 113 + j] = 0;
                    outs.push_back(qkv::cpu::sdpa(part.view()));
                }
                std::vector<qkv::attention_part_f64> parts;
                for (const auto& out : outs) parts.push_back({out.output, out.lse});
                const qkv::merge_shape ms{.batch = 2, .q_heads = 6, .q_len = 17, .d_v = 24};
                const qkv::merged_attention_f64 merged = qkv::merge_attention(parts, ms, sink_values);
                INFO("interleaved " << interleaved << ", parts " << n_parts << ", sinks " << sinks);
                check_merged(merged.out, want.output, 24, 1e-300, 1e-14, "out");
                check_merged(merged.lse, want.lse, 1, 1.0, 1e-15, "lse");  // absolute below 1
                // Row 5 of batch 0 had no key: zeros and -inf, sinks or not.
                for (std::size_t h = 0; h < 6; ++h) {
                    CHECK(merged.lse[h * 17 + 5] == -inf);
                    CHECK(merged.out[(h * 17 + 5) * 24] == 0.0);
                }
                // The float32 merge of the float32-rounded parts is as close as float32 allows.
                std::vector<std::vector<float>> out32, lse32;
                for (const auto& out : outs) {
                    out32.push_back(convert<float>(out.output));
                    lse32.push_back(convert<float>(out.lse));
                }
                std::vector<qkv::attention_part> parts32;
                for (std::size_t p = 0; p < n_parts; ++p) parts32.push_back({out32[p], lse32[p]});
                const std::vector<float> sinks32 = convert<float>(sink_values);
                const qkv::merged_attention m32 = qkv::merge_attention(parts32, ms, sinks32);
                CHECK(qkv_test::nmse(m32.out, want.output) < 1e-12);
                ++checked;
            }
    CHECK(checked == 16);
}

TEST_CASE("merge_attention: one part is the part; sinks are applied once; refusals", "[cpu][sdpa][merge]") {
    const std::vector<double> out = {1, 2, 3, 4, 5, 6}, lse = {0.5, -inf, 2};  // (1, 1, 3, 2)
    const qkv::merge_shape s{.batch = 1, .q_heads = 1, .q_len = 3, .d_v = 2};
    const qkv::attention_part_f64 one{out, lse};
    const qkv::merged_attention_f64 m = qkv::merge_attention(std::span(&one, 1), s);
    CHECK(m.out == std::vector<double>{1, 2, 0, 0, 5, 6});  // the row without keys: zeros
    CHECK(m.lse == lse);
    // A sink σ scales a row by e^lse / (e^lse + e^σ): with σ = lse, by exactly one half.
    const std::vector<double> sink = {2.0};
    const qkv::merged_attention_f64 h = qkv::merge_attention(std::span(&one, 1), s, std::span(sink));
    CHECK(h.out[4] == 2.5);
    CHECK(h.out[5] == 3.0);
    CHECK(h.out[2] == 0.0);  // no key: zeros, sink or not
    CHECK(h.lse == lse);     // the lse never includes the sink
    // Two equal parts: the same rows, the lse plus log 2.
    const std::vector<qkv::attention_part_f64> two = {one, one};
    const qkv::merged_attention_f64 t = qkv::merge_attention(two, s);
    CHECK(t.out == std::vector<double>{1, 2, 0, 0, 5, 6});
    CHECK(t.lse[0] == 0.5 + std::log(2.0));
    CHECK(t.lse[1] == -inf);
    // A NaN lse poisons its row only.
    std::vector<double> nan_lse = lse;
    nan_lse[0] = NAN;
    const std::vector<qkv::attention_part_f64> poisoned = {one, {out, nan_lse}};
    const qkv::merged_attention_f64 p = qkv::merge_attention(poisoned, s);
    CHECK(std::isnan(p.out[0]));
    CHECK(std::isnan(p.lse[0]));
    CHECK(p.out[4] == 5.0);

    const auto refused = [&](auto call, const char* words) {
        INFO(words);
        CHECK_THROWS_WITH(call(), Catch::Matchers::Contains(words));
    };
    refused([&] { return qkv::merge_attention(std::span<const qkv::attention_part_f64>{}, s); }, "no parts");
    refused([&] { return qkv::merge_attention(std::span(&one, 1), {.batch = 1, .q_heads = 1, .q_len = 2, .d_v = 2}); },
            "part 0 out has 6 elements");
    const std::vector<double> short_lse = {0.5, 1};
    const qkv::attention_part_f64 bad_lse{out, short_lse};
    refused([&] { return qkv::merge_attention(std::span(&bad_lse, 1), s); }, "part 0 lse has 2 elements");
    std::vector<double> inf_lse = lse;
    inf_lse[2] = inf;
    const qkv::attention_part_f64 big{out, inf_lse};
    refused([&] { return qkv::merge_attention(std::span(&big, 1), s); }, "lse element 2 is +inf");
    const std::vector<double> two_sinks = {1, 2}, nan_sink = {NAN};
    refused([&] { return qkv::merge_attention(std::span(&one, 1), s, std::span(two_sinks)); }, "sinks has 2 elements");
    refused([&] { return qkv::merge_attention(std::span(&one, 1), s, std::span(nan_sink)); }, "sinks[0] is nan");
    refused([&] { return qkv::merge_attention(std::span(&one, 1), {.batch = 1, .q_heads = 1, .q_len = 3, .d_v = 0}); },
            "d_v must be at least 1");
}
