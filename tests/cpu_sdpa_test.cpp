// qkv::cpu::sdpa — scaled dot-product attention on the float64 CPU backend — against float64 NumPy
// references that follow PyTorch's documented semantics (tests/data/sdpa, make_sdpa_fixtures.py),
// against qkv::cpu::attention (projection + sdpa), and every rule of validate(sdpa_problem) and
// broadcast_strides.
#include <qkv/runtime/cpu.hpp>
#include <qkv/runtime/problem.hpp>
#include <qkv/vulkan/error.hpp>

#include <qkv/runtime/sdpa.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "npy/npy.hpp"
#include "support/catch.hpp"
#include "support/expect.hpp"
#include "support/reference.hpp"
#include "support/sdpa_problems.hpp"
#include "support/sdpa_reference.hpp"

namespace {

namespace fs = std::filesystem;
using dims = std::vector<std::size_t>;

constexpr double inf = std::numeric_limits<double>::infinity();

/// One fixture of tests/data/sdpa: the inputs as read, the flags of args.txt, the expected values.
struct fixture {
    std::string name;
    qkv::npy::array q, k, v, mask, expected_out, expected_weights;
    bool has_mask = false, has_weights = false;
    qkv::sdpa_options options{};
};

fixture load(const std::string& name) {
    const fs::path dir = fs::path(QKV_TEST_DATA_DIR) / "sdpa" / name;
    fixture f;
    f.name = name;
    f.q = qkv::npy::read(dir / "q.npy");
    f.k = qkv::npy::read(dir / "k.npy");
    f.v = qkv::npy::read(dir / "v.npy");
    f.expected_out = qkv::npy::read(dir / "expected_out.npy");
    if ((f.has_mask = fs::exists(dir / "mask.npy"))) f.mask = qkv::npy::read(dir / "mask.npy");
    if ((f.has_weights = fs::exists(dir / "expected_weights.npy")))
        f.expected_weights = qkv::npy::read(dir / "expected_weights.npy");
    std::ifstream args(dir / "args.txt");
    REQUIRE(args);
    for (std::string flag; args >> flag;) {
        if (flag == "--causal") {
            f.options.causal = true;
        } else if (flag == "--causal-align") {
            std::string align;
            args >> align;
            REQUIRE((align == "top-left" || align == "bottom-right"));
            f.options.alignment =
                align == "top-left" ? qkv::causal_alignment::top_left : qkv::causal_alignment::bottom_right;
        } else if (flag == "--scale") {
            double scale = 0;
            args >> scale;
            f.options.scale = static_cast<float>(scale);
        } else {
            FAIL("unknown flag in " << name << "/args.txt: " << flag);
        }
    }
    f.options.return_weights = f.has_weights;
    return f;
}

/// The 2-, 3- or 4-D form of q, k, v: the shape with missing leading dimensions 1.
qkv::sdpa_shape shape_of(const fixture& f) {
    const auto four = [](const dims& d) {
        dims out(4 - d.size(), 1);
        out.insert(out.end(), d.begin(), d.end());
        return out;
    };
    const dims q = four(f.q.shape), k = four(f.k.shape), v = four(f.v.shape);
    qkv::sdpa_shape s;
    s.batch = q[0], s.q_heads = q[1], s.kv_heads = k[1];
    s.q_len = q[2], s.kv_len = k[2], s.d_qk = q[3], s.d_v = v[3];
    return s;
}

using qkv_test::sdpa_data;

template <class T>
std::vector<T> values(const qkv::npy::array& a) {
    if constexpr (std::is_same_v<T, float>)
        return a.to_float();
    else
        return a.to_double();
}

template <class T>
sdpa_data<T> problem_of(const fixture& f) {
    sdpa_data<T> o;
    o.shape = shape_of(f);
    o.q = values<T>(f.q), o.k = values<T>(f.k), o.v = values<T>(f.v);
    if (f.has_mask) {
        if (f.mask.type == qkv::npy::dtype::b1)
            o.mask = f.mask.to_bool();
        else
            o.additive = values<T>(f.mask);
        o.mask_shape = f.mask.shape;
    }
    o.options = f.options;
    return o;
}

/// Every element within `rel` of the expected value (relative, or absolute below 1), exact zeros
/// where the expected value is exactly zero (a masked weight, a fully masked row).
template <class T>
void check_close(const std::vector<T>& got, const qkv::npy::array& expected, double rel, const std::string& what) {
    const std::vector<double> want = expected.to_double();
    REQUIRE(got.size() == want.size());
    std::size_t bad = 0, first_bad = 0;
    for (std::size_t i = 0; i < want.size(); ++i) {
        const double g = static_cast<double>(got[i]), w = want[i];
        const bool ok = w == 0.0 ? g == 0.0 : std::isfinite(g) && std::abs(g - w) <= rel * std::max(1.0, std::abs(w));
        if (!ok && bad++ == 0) first_bad = i;
    }
    INFO(what << ": " << bad << " of " << want.size() << " elements off; the first, " << first_bad << ", is "
              << static_cast<double>(got[first_bad]) << ", expected " << want[first_bad]);
    CHECK(bad == 0);
}

const char* const float32_fixtures[] = {"plain_2d",
                                        "gqa_4d_scale",
                                        "causal_top_left_3d",
                                        "causal_bottom_right_gqa",
                                        "causal_top_left_s1",
                                        "causal_bottom_right_s1",
                                        "bool_mask_key_padding",
                                        "bool_mask_empty_row",
                                        "additive_mask_causal",
                                        "decode_5000",
                                        "single",
                                        "scale_negative",
                                        "scale_zero"};

}  // namespace

TEST_CASE("cpu sdpa matches the float64 NumPy reference on every fixture", "[cpu][sdpa]") {
    for (const char* name : float32_fixtures) {
        INFO("fixture " << name);
        const fixture f = load(name);
        REQUIRE(f.q.type == qkv::npy::dtype::f32);
        const sdpa_data<float> o = problem_of<float>(f);
        const qkv::sdpa_problem p = o.view();

        const qkv::sdpa_output_f64 got64 = qkv::cpu::sdpa_f64(p);
        check_close(got64.output, f.expected_out, 1e-12, std::string(name) + " output (f64)");
        const qkv::sdpa_output got = qkv::cpu::sdpa(p);
        check_close(got.output, f.expected_out, 2e-7, std::string(name) + " output (f32)");
        CHECK(got.shape == o.shape);
        if (f.has_weights) {
            check_close(got64.weights, f.expected_weights, 1e-12, std::string(name) + " weights (f64)");
            check_close(got.weights, f.expected_weights, 2e-7, std::string(name) + " weights (f32)");
        } else {
            CHECK(got.weights.empty());
            CHECK(got64.weights.empty());
        }
        // The float64 problem of the same float32 values gives sdpa_f64's results exactly.
        const sdpa_data<double> o64 = problem_of<double>(f);
        const qkv::sdpa_output_f64 exact = qkv::cpu::sdpa(o64.view());
        CHECK(exact.output == got64.output);
        CHECK(exact.weights == got64.weights);
    }
}

TEST_CASE("cpu sdpa: any finite scale, negative and zero included, matches the float64 reference", "[cpu][sdpa]") {
    std::mt19937_64 rng(20261124);
    for (const float scale : {-0.35f, -2.f, 0.f, -0.f}) {
        INFO("scale " << scale);
        sdpa_data<float> o;
        o.shape = {.batch = 2, .q_heads = 4, .kv_heads = 2, .q_len = 17, .kv_len = 113, .d_qk = 32, .d_v = 24};
        const auto floats = [&](std::size_t n) {
            std::vector<float> f;
            for (double e : qkv_test::normal_values(n, rng)) f.push_back(static_cast<float>(e));
            return f;
        };
        o.q = floats(2 * 4 * 17 * 32), o.k = floats(2 * 2 * 113 * 32), o.v = floats(2 * 2 * 113 * 24);
        o.additive = floats(17 * 113);
        o.mask_shape = {17, 113};
        o.options.scale = scale;
        o.options.causal = true;
        o.options.alignment = qkv::causal_alignment::bottom_right;
        o.options.return_weights = true;
        const qkv::sdpa_problem p = o.view();
        const qkv_test::sdpa_ref_result want = qkv_test::sdpa_reference(p);
        const qkv::sdpa_output_f64 got = qkv::cpu::sdpa_f64(p);
        CHECK(qkv_test::nmse(got.output, want.output) <= 1e-26);
        CHECK(qkv_test::nmse(got.weights, want.weights) <= 1e-26);
        const qkv::sdpa_output got32 = qkv::cpu::sdpa(p);
        CHECK(qkv_test::nmse(got32.output, want.output) <= 1e-13);
    }
}

TEST_CASE("cpu sdpa: float64 inputs beyond float32 are computed in float64", "[cpu][sdpa][f64]") {
    const fixture f = load("float64");
    REQUIRE(f.q.type == qkv::npy::dtype::f64);
    const sdpa_data<double> o = problem_of<double>(f);
    const qkv::sdpa_output_f64 got = qkv::cpu::sdpa(o.view());
    check_close(got.output, f.expected_out, 1e-12, "float64 output");
    check_close(got.weights, f.expected_weights, 1e-12, "float64 weights");
    // An additive -1e300 is a very negative score, not a mask: its weight is tiny but the row's
    // other keys still sum to one.
    double sum = 0;
    for (std::size_t j = 0; j < o.shape.kv_len; ++j) sum += got.weights[j];
    CHECK(std::abs(sum - 1.0) < 1e-12);
}

TEST_CASE("cpu sdpa: fully masked rows give zeros; the causal rule counts from the alignment", "[cpu][sdpa]") {
    // q_len 3, kv_len 5: bottom-right lets row i see j <= i + 2; top-left, j <= i.
    sdpa_data<double> o;
    o.shape = {.batch = 1, .q_heads = 1, .kv_heads = 1, .q_len = 3, .kv_len = 5, .d_qk = 2, .d_v = 1};
    o.q = {1, 0, 0, 1, 1, 1};
    o.k = {1, 0, 0, 1, 1, 1, -1, 0, 0, -1};
    o.v = {1, 2, 3, 4, 5};
    o.options.causal = true;
    o.options.return_weights = true;
    for (const auto align : {qkv::causal_alignment::top_left, qkv::causal_alignment::bottom_right}) {
        o.options.alignment = align;
        const qkv::sdpa_output_f64 r = qkv::cpu::sdpa(o.view());
        const std::size_t offset = align == qkv::causal_alignment::top_left ? 0 : 2;
        for (std::size_t i = 0; i < 3; ++i) {
            double sum = 0;
            for (std::size_t j = 0; j < 5; ++j) {
                const double w = r.weights[i * 5 + j];
                if (j > i + offset)
                    CHECK(w == 0.0);
                else
                    CHECK(w > 0.0);
                sum += w;
            }
            CHECK(std::abs(sum - 1.0) < 1e-15);
        }
    }
    // A bool mask that leaves row 1 nothing, and an additive -inf that leaves row 2 nothing.
    o.options.causal = false;
    o.mask = {1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1};
    o.additive = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, -inf, -inf, -inf, -inf, -inf};
    o.mask_shape = {3, 5};
    const qkv::sdpa_output_f64 r = qkv::cpu::sdpa(o.view());
    CHECK(r.output[0] != 0.0);
    CHECK(r.output[1] == 0.0);
    CHECK(r.output[2] == 0.0);
    for (std::size_t j = 0; j < 5; ++j) CHECK(r.weights[5 + j] == 0.0);
    for (std::size_t j = 0; j < 5; ++j) CHECK(r.weights[10 + j] == 0.0);
}

TEST_CASE("cpu sdpa: GQA query head h reads K/V head h / (Hq / Hkv)", "[cpu][sdpa]") {
    // Hq 6, Hkv 2: heads 0-2 read K/V head 0, heads 3-5 read head 1. Each head alone, as a 2-D
    // problem over its K/V head, must give the same rows.
    std::mt19937_64 rng(7);
    sdpa_data<double> o;
    o.shape = {.batch = 2, .q_heads = 6, .kv_heads = 2, .q_len = 3, .kv_len = 17, .d_qk = 5, .d_v = 3};
    o.q = qkv_test::normal_values(2 * 6 * 3 * 5, rng);
    o.k = qkv_test::normal_values(2 * 2 * 17 * 5, rng);
    o.v = qkv_test::normal_values(2 * 2 * 17 * 3, rng);
    const qkv::sdpa_output_f64 all = qkv::cpu::sdpa(o.view());
    for (std::size_t b = 0; b < 2; ++b)
        for (std::size_t h = 0; h < 6; ++h) {
            sdpa_data<double> one;
            one.shape = {.batch = 1, .q_heads = 1, .kv_heads = 1, .q_len = 3, .kv_len = 17, .d_qk = 5, .d_v = 3};
            const std::size_t kvh = h / 3;
            const auto slice = [](const std::vector<double>& v, std::size_t first, std::size_t n) {
                return std::vector<double>(v.begin() + static_cast<std::ptrdiff_t>(first),
                                           v.begin() + static_cast<std::ptrdiff_t>(first + n));
            };
            one.q = slice(o.q, (b * 6 + h) * 15, 15);
            one.k = slice(o.k, (b * 2 + kvh) * 85, 85);
            one.v = slice(o.v, (b * 2 + kvh) * 51, 51);
            const qkv::sdpa_output_f64 r = qkv::cpu::sdpa(one.view());
            CHECK(r.output == slice(all.output, (b * 6 + h) * 9, 9));
        }
}

TEST_CASE("cpu attention equals projection + cpu sdpa", "[cpu][sdpa]") {
    // attention(X, Wq, Wk, Wv) with H heads is SDPA over Q = X·Wq + bq, ... split into heads
    // (B, H, N, d/H), the head outputs side by side: same arithmetic, bit for bit.
    std::mt19937_64 rng(11);
    const std::size_t B = 2, N = 37, d_in = 7, dk = 12, dv = 9, H = 3;
    const std::vector<double> x = qkv_test::normal_values(B * N * d_in, rng);
    const std::vector<double> wq = qkv_test::normal_values(d_in * dk, rng, 0.4);
    const std::vector<double> wk = qkv_test::normal_values(d_in * dk, rng, 0.4);
    const std::vector<double> wv = qkv_test::normal_values(d_in * dv, rng, 0.4);
    const std::vector<double> bq = qkv_test::normal_values(dk, rng, 0.5);
    const std::vector<double> bk = qkv_test::normal_values(dk, rng, 0.5);
    const std::vector<double> bv = qkv_test::normal_values(dv, rng, 0.5);
    std::vector<std::uint8_t> mask(N * N);
    std::bernoulli_distribution keep(0.8);
    for (auto& m : mask) m = keep(rng) ? 1 : 0;
    std::vector<double> additive = qkv_test::normal_values(B * N * N, rng);

    for (const bool causal : {false, true}) {
        INFO("causal " << causal);
        qkv::cpu::attention_problem_f64 a;
        a.shape = {.batch = B, .seq = N, .d_in = d_in, .d_k = dk, .d_v = dv, .heads = H, .d_out = 0};
        a.x = x, a.wq = wq, a.wk = wk, a.wv = wv, a.bq = bq, a.bk = bk, a.bv = bv;
        a.mask = mask, a.additive_mask = additive;
        a.options.causal = causal;
        a.options.return_weights = true;
        a.options.scale = 0.3f;
        const qkv::cpu::attention_output_f64 want = qkv::cpu::attention(a);

        // The projections, in the backend's order: the bias, then k = 0, 1, ... .
        const auto project = [&](const std::vector<double>& w, const std::vector<double>& b, std::size_t d) {
            std::vector<double> out(B * N * d);
            for (std::size_t r = 0; r < B * N; ++r)
                for (std::size_t c = 0; c < d; ++c) {
                    double acc = b[c];
                    for (std::size_t i = 0; i < d_in; ++i) acc += x[r * d_in + i] * w[i * d + c];
                    out[r * d + c] = acc;
                }
            return out;
        };
        // (B, N, H·w) -> (B, H, N, w)
        const auto heads = [&](const std::vector<double>& m, std::size_t d) {
            const std::size_t w = d / H;
            std::vector<double> out(m.size());
            for (std::size_t b = 0; b < B; ++b)
                for (std::size_t h = 0; h < H; ++h)
                    for (std::size_t n = 0; n < N; ++n)
                        for (std::size_t c = 0; c < w; ++c)
                            out[((b * H + h) * N + n) * w + c] = m[(b * N + n) * d + h * w + c];
            return out;
        };
        sdpa_data<double> o;
        o.shape = {.batch = B, .q_heads = H, .kv_heads = H, .q_len = N, .kv_len = N, .d_qk = dk / H, .d_v = dv / H};
        o.q = heads(project(wq, bq, dk), dk);
        o.k = heads(project(wk, bk, dk), dk);
        o.v = heads(project(wv, bv, dv), dv);
        qkv::sdpa_problem_f64 p = o.view();
        // One mask_shape, (B, 1, N, N), serves both masks: the bool one gets its batch copies.
        std::vector<std::uint8_t> mask_b;
        for (std::size_t b = 0; b < B; ++b) mask_b.insert(mask_b.end(), mask.begin(), mask.end());
        p.mask = mask_b;
        p.additive_mask = additive;
        p.mask_shape = {B, 1, N, N};
        p.options.causal = causal;
        p.options.return_weights = true;
        p.options.scale = 0.3f;
        const qkv::sdpa_output_f64 got = qkv::cpu::sdpa(p);

        // (B, H, N, dv/H) -> (B, N, dv)
        std::vector<double> concat(B * N * dv);
        const std::size_t w = dv / H;
        for (std::size_t b = 0; b < B; ++b)
            for (std::size_t h = 0; h < H; ++h)
                for (std::size_t n = 0; n < N; ++n)
                    for (std::size_t c = 0; c < w; ++c)
                        concat[(b * N + n) * dv + h * w + c] = got.output[((b * H + h) * N + n) * w + c];
        CHECK(concat == want.output);
        CHECK(got.weights == want.weights);  // both (B, H, N, N)
    }
}

TEST_CASE("cpu sdpa: NaN among the allowed scores poisons only its row", "[cpu][sdpa]") {
    sdpa_data<float> o;
    o.shape = {.batch = 1, .q_heads = 1, .kv_heads = 1, .q_len = 2, .kv_len = 3, .d_qk = 1, .d_v = 1};
    o.q = {std::numeric_limits<float>::quiet_NaN(), 1.f};
    o.k = {1.f, 2.f, 3.f};
    o.v = {1.f, 2.f, 3.f};
    const qkv::sdpa_output r = qkv::cpu::sdpa(o.view());
    CHECK(std::isnan(r.output[0]));
    CHECK(std::isfinite(r.output[1]));
    // A NaN value behind a masked key does not reach the output.
    o.q = {1.f, 1.f};
    o.v = {1.f, 2.f, std::numeric_limits<float>::quiet_NaN()};
    o.mask = {1, 1, 0};
    o.mask_shape = {3};
    const qkv::sdpa_output m = qkv::cpu::sdpa(o.view());
    CHECK(std::isfinite(m.output[0]));
    CHECK(std::isfinite(m.output[1]));
}

// ---- validate and broadcast_strides --------------------------------------------------------------

namespace {

sdpa_data<float> valid_sdpa() {
    sdpa_data<float> o;
    o.shape = {.batch = 2, .q_heads = 4, .kv_heads = 2, .q_len = 3, .kv_len = 5, .d_qk = 2, .d_v = 3};
    o.q.assign(2 * 4 * 3 * 2, 0.5f);
    o.k.assign(2 * 2 * 5 * 2, 0.25f);
    o.v.assign(2 * 2 * 5 * 3, 1.f);
    return o;
}

void expect_invalid(const sdpa_data<float>& o, std::initializer_list<std::string> words) {
    const qkv::sdpa_problem p = o.view();
    qkv_test::expect_invalid([&] { qkv::validate(p); }, words);
    CHECK_THROWS_AS(qkv::cpu::sdpa(p), qkv::invalid_argument);
    CHECK_THROWS_AS(qkv::cpu::sdpa_f64(p), qkv::invalid_argument);
}

}  // namespace

TEST_CASE("validate(sdpa): valid problems pass", "[cpu][sdpa][validate]") {
    sdpa_data<float> o = valid_sdpa();
    CHECK_NOTHROW(qkv::validate(o.view()));
    o.mask.assign(5, 1);
    o.mask_shape = {5};
    CHECK_NOTHROW(qkv::validate(o.view()));
    o.mask.assign(3 * 5, 1);
    o.mask_shape = {};  // empty: L x S
    CHECK_NOTHROW(qkv::validate(o.view()));
    o.additive.assign(3 * 5, -1.f);  // both masks share the shape
    CHECK_NOTHROW(qkv::validate(o.view()));
    o.options.scale = 0.1f;
    o.options.causal = true;
    o.options.alignment = qkv::causal_alignment::bottom_right;
    CHECK_NOTHROW(qkv::validate(o.view()));
}

TEST_CASE("validate(sdpa): zero dimensions", "[cpu][sdpa][validate]") {
    for (auto [member, name] :
         {std::pair{&qkv::sdpa_shape::batch, "batch"}, std::pair{&qkv::sdpa_shape::q_heads, "q_heads"},
          std::pair{&qkv::sdpa_shape::kv_heads, "kv_heads"}, std::pair{&qkv::sdpa_shape::q_len, "q_len"},
          std::pair{&qkv::sdpa_shape::kv_len, "kv_len"}, std::pair{&qkv::sdpa_shape::d_qk, "d_qk"},
          std::pair{&qkv::sdpa_shape::d_v, "d_v"}}) {
        INFO(name);
        sdpa_data<float> o = valid_sdpa();
        o.shape.*member = 0;
        expect_invalid(o, {name, "at least 1"});
    }
}

TEST_CASE("validate(sdpa): kv_heads must divide q_heads, naming q and k", "[cpu][sdpa][validate]") {
    sdpa_data<float> o = valid_sdpa();
    o.shape.kv_heads = 3;
    o.k.assign(2 * 3 * 5 * 2, 0.f), o.v.assign(2 * 3 * 5 * 3, 0.f);
    expect_invalid(o, {"kv_heads (3) must divide q_heads (4)", "q is (2, 4, 3, 2)", "k is (2, 3, 5, 2)"});
}

TEST_CASE("validate(sdpa): spans must fit the shape", "[cpu][sdpa][validate]") {
    SECTION("q") {
        sdpa_data<float> o = valid_sdpa();
        o.q.pop_back();
        expect_invalid(o, {"q has 47 elements", "batch x q_heads x q_len x d_qk = 2 x 4 x 3 x 2 = 48"});
    }
    SECTION("k: a width other than q's") {
        sdpa_data<float> o = valid_sdpa();
        o.k.assign(2 * 2 * 5 * 3, 0.f);
        expect_invalid(o, {"k has 60 elements", "batch x kv_heads x kv_len x d_qk = 2 x 2 x 5 x 2 = 40"});
    }
    SECTION("v: a length other than k's") {
        sdpa_data<float> o = valid_sdpa();
        o.v.assign(2 * 2 * 4 * 3, 0.f);
        expect_invalid(o, {"v has 48 elements", "batch x kv_heads x kv_len x d_v = 2 x 2 x 5 x 3 = 60"});
    }
    SECTION("a mask with more elements than its shape") {
        sdpa_data<float> o = valid_sdpa();
        o.mask.assign(6, 1);
        o.mask_shape = {5};
        expect_invalid(o, {"mask has 6 elements", "(5,) = 5"});
    }
    SECTION("an additive mask with fewer elements than L x S") {
        sdpa_data<float> o = valid_sdpa();
        o.additive.assign(14, 0.f);
        expect_invalid(o, {"additive_mask has 14 elements", "(3, 5) = 15"});
    }
    SECTION("a mask shape without a mask") {
        sdpa_data<float> o = valid_sdpa();
        o.mask_shape = {3, 5};
        expect_invalid(o, {"mask_shape (3, 5) given without a mask"});
    }
}

TEST_CASE("validate(sdpa): masks must broadcast to (B, Hq, L, S)", "[cpu][sdpa][validate]") {
    sdpa_data<float> o = valid_sdpa();
    o.mask.assign(4, 1);
    o.mask_shape = {4};
    expect_invalid(o, {"mask shape (4,) does not broadcast to (batch, q_heads, q_len, kv_len) = (2, 4, 3, 5)",
                       "dimension 0 is 4, expected 1 or kv_len = 5"});
    // A K/V head count is not a query head count: (B, Hkv, L, S) does not broadcast under GQA.
    o.mask.assign(2 * 2 * 3 * 5, 1);
    o.mask_shape = {2, 2, 3, 5};
    expect_invalid(o, {"mask shape (2, 2, 3, 5)", "dimension 1 is 2, expected 1 or q_heads = 4"});
    o.additive.assign(2 * 2 * 3 * 5, 0.f);
    o.mask.clear();
    expect_invalid(o, {"mask shape (2, 2, 3, 5)"});
    o.additive.assign(2 * 3 * 5, 0.f);
    o.mask_shape = {1, 2, 1, 3, 5};
    expect_invalid(o, {"has 5 dimensions; at most 4"});
}

TEST_CASE("validate(sdpa): mask values and scale", "[cpu][sdpa][validate]") {
    sdpa_data<float> o = valid_sdpa();
    o.mask = {1, 0, 2, 1, 1};
    o.mask_shape = {5};
    expect_invalid(o, {"mask values must be 0 or 1", "element 2 is 2"});
    for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                      std::numeric_limits<float>::quiet_NaN()}) {
        sdpa_data<float> s = valid_sdpa();
        s.options.scale = bad;
        expect_invalid(s, {"scale must be finite"});
    }
    // Any finite scale is valid, negative and zero included (PyTorch's scale= takes them).
    for (float good : {0.f, -0.f, -1.f, -3.4e38f, 1e-45f, 3.4e38f}) {
        sdpa_data<float> s = valid_sdpa();
        s.options.scale = good;
        CHECK_NOTHROW(qkv::validate(s.view()));
        sdpa_data<double> d;
        d.shape = s.shape;
        d.q.assign(s.q.begin(), s.q.end()), d.k.assign(s.k.begin(), s.k.end()), d.v.assign(s.v.begin(), s.v.end());
        d.options = s.options;
        CHECK_NOTHROW(qkv::validate(d.view()));
    }
    sdpa_data<float> a = valid_sdpa();
    a.options.alignment = static_cast<qkv::causal_alignment>(7);
    expect_invalid(a, {"unknown alignment (7)"});
}

// One alignment enum: the run-time API's causal_alignment is the core's position_alignment, whose
// two values are causal_mode's alike-named ones; "no causal mask" is causal = false, not an
// alignment.
static_assert(std::is_same_v<qkv::causal_alignment, qkv::position_alignment>);
static_assert(static_cast<int>(qkv::causal_alignment::bottom_right) ==
              static_cast<int>(qkv::causal_mode::bottom_right));

TEST_CASE("validate(sdpa): the alignment is top_left or bottom_right, nothing else", "[cpu][sdpa][validate]") {
    sdpa_data<float> o = valid_sdpa();
    o.options = {.causal = true, .alignment = qkv::causal_alignment::bottom_right};
    CHECK_NOTHROW(qkv::validate(o.view()));
    for (const bool causal : {true, false}) {
        o.options.causal = causal;
        o.options.alignment = static_cast<qkv::causal_alignment>(qkv::causal_mode::none);
        expect_invalid(o, {"unknown alignment (0)"});
    }
    qkv::sdpa_shape s{.batch = 1, .q_heads = 1, .kv_heads = 1, .q_len = 3, .kv_len = 7, .d_qk = 1, .d_v = 1};
    CHECK(qkv::causal_offset(s, {.alignment = qkv::causal_alignment::top_left}) == 0);
}

TEST_CASE("validate(sdpa): size products must not overflow", "[cpu][sdpa][validate]") {
    sdpa_data<float> o = valid_sdpa();
    o.shape.q_len = std::size_t{1} << 62;
    expect_invalid(o, {"shape too large"});
}

TEST_CASE("broadcast_strides: NumPy broadcasting to (B, Hq, L, S)", "[cpu][sdpa][broadcast]") {
    const qkv::sdpa_shape s{.batch = 2, .q_heads = 4, .kv_heads = 2, .q_len = 3, .kv_len = 5, .d_qk = 2, .d_v = 3};
    const auto strides = [&](const dims& d) {
        const qkv::mask_strides m = qkv::broadcast_strides(d, s);
        return dims{m.batch, m.head, m.row, m.col};
    };
    CHECK(strides({}) == dims{0, 0, 5, 1});  // empty: L x S
    CHECK(strides({3, 5}) == dims{0, 0, 5, 1});
    CHECK(strides({5}) == dims{0, 0, 0, 1});
    CHECK(strides({1}) == dims{0, 0, 0, 0});
    CHECK(strides({3, 1}) == dims{0, 0, 1, 0});
    CHECK(strides({2, 4, 3, 5}) == dims{60, 15, 5, 1});
    CHECK(strides({2, 1, 1, 5}) == dims{5, 0, 0, 1});
    CHECK(strides({4, 1, 5}) == dims{0, 5, 0, 1});
    CHECK(strides({1, 1, 1, 1}) == dims{0, 0, 0, 0});
    CHECK_THROWS_AS(strides({3}), qkv::invalid_argument);
    CHECK_THROWS_AS(strides({2, 3, 5}), qkv::invalid_argument);  // 2 is not q_heads
    CHECK_THROWS_AS(strides({1, 1, 1, 1, 1}), qkv::invalid_argument);
    CHECK_THROWS_WITH(strides({5, 3}), Catch::Matchers::Contains("dimension 1 is 3, expected 1 or kv_len = 5"));
}

TEST_CASE("default_scale and causal_offset for sdpa shapes", "[cpu][sdpa]") {
    qkv::sdpa_shape s{.batch = 1, .q_heads = 1, .kv_heads = 1, .q_len = 3, .kv_len = 300, .d_qk = 64, .d_v = 8};
    CHECK(qkv::default_scale(s) == 0.125f);
    CHECK(qkv::causal_offset(s, {.alignment = qkv::causal_alignment::top_left}) == 0);
    CHECK(qkv::causal_offset(s, {.alignment = qkv::causal_alignment::bottom_right}) == 297);
    // An explicit position_offset wins over either alignment.
    CHECK(qkv::causal_offset(s, {.alignment = qkv::causal_alignment::bottom_right, .position_offset = -5}) == -5);
    CHECK(qkv::causal_offset(s, {.position_offset = 1000}) == 1000);
    s.q_len = 37, s.kv_len = 1;
    CHECK(qkv::causal_offset(s, {.alignment = qkv::causal_alignment::bottom_right}) == -36);
    s.d_qk = 0;
    CHECK_THROWS_AS(qkv::default_scale(s), qkv::invalid_argument);
}
