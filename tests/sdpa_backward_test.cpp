// The backward pass of scaled dot-product attention on the float64 CPU reference
// (qkv::cpu::sdpa_backward, qkv/runtime/sdpa_backward.hpp) and dropout's forward pass
// (qkv::cpu::sdpa with dropout_p, qkv/dropout.hpp): against the torch.autograd fixtures of
// tests/data/sdpa/backward (make_backward_fixtures.py) over odd shapes and every option, alone and
// combined; against central finite differences in float64; the saved tensors' checks, validation
// and the rule for non-finite values; determinism; the dropout generator's known answers and keep
// rate.
#include <qkv/dropout.hpp>
#include <qkv/philox.hpp>
#include <qkv/runtime/cpu.hpp>
#include <qkv/runtime/error.hpp>
#include <qkv/runtime/sdpa.hpp>
#include <qkv/runtime/sdpa_backward.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "npy/npy.hpp"
#include "support/catch.hpp"

namespace {

namespace fs = std::filesystem;
using dims = std::vector<std::size_t>;

constexpr double inf = std::numeric_limits<double>::infinity();

/// A backward problem over data it owns, element type T.
template <class T>
struct owned {
    qkv::sdpa_shape shape{};
    std::vector<T> q, k, v, d_out, additive, sinks, out, lse;
    std::vector<std::uint8_t> mask;
    dims mask_shape;
    qkv::sdpa_options options{};
    bool want_d_additive = false;

    [[nodiscard]] qkv::basic_sdpa_problem<T> forward() const {
        qkv::basic_sdpa_problem<T> p;
        p.shape = shape;
        p.q = q, p.k = k, p.v = v;
        p.mask = mask, p.additive_mask = additive;
        p.mask_shape = mask_shape;
        p.options = options;
        p.sinks = sinks;
        return p;
    }
    [[nodiscard]] qkv::basic_sdpa_backward_problem<T> backward() const {
        qkv::basic_sdpa_backward_problem<T> b;
        b.forward = forward();
        b.out = out, b.lse = lse, b.d_out = d_out;
        b.return_d_additive_mask = want_d_additive;
        return b;
    }
};

template <class To, class From>
std::vector<To> convert(const std::vector<From>& v) {
    return std::vector<To>(v.begin(), v.end());
}

owned<double> widen(const owned<float>& o) {
    owned<double> d;
    d.shape = o.shape;
    d.q = convert<double>(o.q), d.k = convert<double>(o.k), d.v = convert<double>(o.v);
    d.d_out = convert<double>(o.d_out), d.additive = convert<double>(o.additive), d.sinks = convert<double>(o.sinks);
    d.out = convert<double>(o.out), d.lse = convert<double>(o.lse);
    d.mask = o.mask, d.mask_shape = o.mask_shape, d.options = o.options, d.want_d_additive = o.want_d_additive;
    return d;
}

/// Normalised MSE Σ(got - want)² / Σ want², after checking the special values: where the reference
/// is 0, -inf or NaN, the result must be exactly that (a masked key's gradient is 0, not small).
template <class T>
double nmse(const std::vector<T>& got, const std::vector<double>& want, const std::string& what) {
    INFO(what);
    REQUIRE(got.size() == want.size());
    if (want.empty()) return 0;
    double err = 0, norm = 0;
    std::size_t special = 0, first = 0;
    for (std::size_t n = 0; n < want.size(); ++n) {
        const double g = static_cast<double>(got[n]), w = want[n];
        if (w == 0 || std::isinf(w) || std::isnan(w)) {
            const bool same = std::isnan(w) ? std::isnan(g) : g == w;
            if (!same && special++ == 0) first = n;
            continue;
        }
        if (!std::isfinite(g)) return inf;
        err += (g - w) * (g - w);
        norm += w * w;
    }
    INFO("element " << first << " is " << static_cast<double>(got[first]) << ", expected " << want[first]);
    CHECK(special == 0);
    return norm == 0 ? err : err / norm;
}

// ---- The fixtures ---------------------------------------------------------------------------------

struct fixture {
    std::string name;
    owned<float> problem;
    std::vector<double> out, lse, weights, dq, dk, dv, d_sinks, d_additive;
};

const fs::path fixtures_dir = fs::path(QKV_TEST_DATA_DIR) / "sdpa" / "backward";

fixture load(const std::string& name) {
    const fs::path dir = fixtures_dir / name;
    fixture f;
    f.name = name;
    owned<float>& o = f.problem;
    const qkv::npy::array q = qkv::npy::read(dir / "q.npy"), k = qkv::npy::read(dir / "k.npy"),
                          v = qkv::npy::read(dir / "v.npy");
    REQUIRE((q.shape.size() == 4 && k.shape.size() == 4 && v.shape.size() == 4));
    o.shape = {.batch = q.shape[0],
               .q_heads = q.shape[1],
               .kv_heads = k.shape[1],
               .q_len = q.shape[2],
               .kv_len = k.shape[2],
               .d_qk = q.shape[3],
               .d_v = v.shape[3]};
    o.q = q.to_float(), o.k = k.to_float(), o.v = v.to_float();
    o.d_out = qkv::npy::read(dir / "d_out.npy").to_float();
    if (fs::exists(dir / "mask.npy")) {
        const qkv::npy::array m = qkv::npy::read(dir / "mask.npy");
        o.mask = m.to_bool(), o.mask_shape = m.shape;
    }
    if (fs::exists(dir / "additive.npy")) {
        const qkv::npy::array m = qkv::npy::read(dir / "additive.npy");
        o.additive = m.to_float(), o.mask_shape = m.shape;
        o.want_d_additive = true;
    }
    if (fs::exists(dir / "sinks.npy")) o.sinks = qkv::npy::read(dir / "sinks.npy").to_float();
    std::ifstream options(dir / "options.txt");
    for (std::string line; std::getline(options, line);) {
        std::istringstream in(line);
        std::string key;
        in >> key;
        qkv::sdpa_options& opt = o.options;
        if (key == "scale") {
            float s = 0;
            in >> s;
            opt.scale = s;
        } else if (key == "causal") {
            opt.causal = true;
        } else if (key == "alignment") {
            std::string a;
            in >> a;
            opt.alignment = a == "bottom_right" ? qkv::causal_alignment::bottom_right : qkv::causal_alignment::top_left;
        } else if (key == "position_offset") {
            std::int64_t off = 0;
            in >> off;
            opt.position_offset = off;
        } else if (key == "window") {
            in >> opt.window_left >> opt.window_right;
        } else if (key == "softcap") {
            in >> opt.softcap;
        } else if (key == "alibi") {
            in >> opt.alibi_max_bias;
        } else if (key == "dropout") {
            in >> opt.dropout_p >> opt.dropout_seed >> opt.dropout_offset;
        } else if (key == "kv_type") {
            opt.kv_type = qkv::element_type::f16;
        } else {
            FAIL("unknown option line in " << name << ": " << line);
        }
        REQUIRE(!in.fail());
    }
    const auto expected = [&](const char* file) {
        const fs::path path = dir / (std::string("expected_") + file + ".npy");
        return fs::exists(path) ? qkv::npy::read(path).to_double() : std::vector<double>{};
    };
    f.out = expected("out"), f.lse = expected("lse"), f.weights = expected("weights");
    f.dq = expected("dq"), f.dk = expected("dk"), f.dv = expected("dv");
    f.d_sinks = expected("d_sinks"), f.d_additive = expected("d_additive");
    return f;
}

std::vector<std::string> fixture_names() {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(fixtures_dir))
        if (entry.is_directory()) names.push_back(entry.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
}

template <class T>
void check_gradients(const qkv::basic_sdpa_gradients<T>& g, const fixture& f, double limit, const std::string& how) {
    CHECK(nmse(g.dq, f.dq, how + ": dq") <= limit);
    CHECK(nmse(g.dk, f.dk, how + ": dk") <= limit);
    CHECK(nmse(g.dv, f.dv, how + ": dv") <= limit);
    CHECK(nmse(g.d_sinks, f.d_sinks, how + ": d_sinks") <= limit);
    CHECK(nmse(g.d_additive_mask, f.d_additive, how + ": d_additive_mask") <= limit);
}

// float64 against torch's float64: rounding only (1e-15 relative and less); float32 results
// rounded once: 6e-8 relative, an nmse near 1e-15.
constexpr double f64_limit = 1e-24;
constexpr double f32_limit = 1e-13;

TEST_CASE("sdpa_backward: every fixture, against torch.autograd in float64", "[sdpa_backward]") {
    const std::vector<std::string> names = fixture_names();
    REQUIRE(names.size() >= 19);
    for (const std::string& name : names) {
        INFO("fixture " << name);
        const fixture f = load(name);
        owned<float> o = f.problem;

        // The forward pass (dropout included): output, lse and, where kept, the weights with the
        // dropped ones negated.
        qkv::sdpa_problem fp = o.forward();
        fp.options.return_lse = true;
        fp.options.return_weights = !f.weights.empty();
        const qkv::sdpa_output_f64 fwd = qkv::cpu::sdpa_f64(fp);
        CHECK(nmse(fwd.output, f.out, "output") <= f64_limit);
        CHECK(nmse(fwd.lse, f.lse, "lse") <= f64_limit);
        if (!f.weights.empty()) {
            CHECK(nmse(fwd.weights, f.weights, "weights") <= f64_limit);
            for (std::size_t n = 0; n < f.weights.size(); ++n)
                if (std::signbit(fwd.weights[n]) != std::signbit(f.weights[n])) FAIL_CHECK("weight " << n << "'s sign");
        }

        // Everything recomputed from the problem: the exact reference.
        const qkv::sdpa_gradients_f64 exact = qkv::cpu::sdpa_backward_f64(o.backward());
        check_gradients(exact, f, f64_limit, "recomputed");
        // From the saved float64 forward (FlashAttention-2's D = rowsum(dO ∘ O)): the same to rounding.
        owned<double> d = widen(o);
        d.out = fwd.output, d.lse = fwd.lse;
        const qkv::sdpa_gradients_f64 saved = qkv::cpu::sdpa_backward(d.backward());
        check_gradients(saved, f, f64_limit, "saved float64 out and lse");
        // A float64 problem of the same values: the same bits as the float problem recomputed.
        d.out.clear(), d.lse.clear();
        const qkv::sdpa_gradients_f64 same = qkv::cpu::sdpa_backward(d.backward());
        CHECK((same.dq == exact.dq && same.dk == exact.dk && same.dv == exact.dv && same.d_sinks == exact.d_sinks &&
               same.d_additive_mask == exact.d_additive_mask));
        // float32 all the way: the forward's float32 out and lse, float32 gradients.
        const qkv::sdpa_output fwd32 = qkv::cpu::sdpa(fp);
        o.out = fwd32.output, o.lse = fwd32.lse;
        const qkv::sdpa_gradients g32 = qkv::cpu::sdpa_backward(o.backward());
        check_gradients(g32, f, f32_limit, "float32");
        CHECK(g32.device == "CPU reference (float64)");
        CHECK(g32.shape == o.shape);
    }
}

TEST_CASE("sdpa_backward: the same inputs give the same bits", "[sdpa_backward]") {
    // B 2, Hq 4 over Hkv 2, L = S = 113, E = Ev = 64 with every option: far above parallel_for's
    // threshold, so every pass runs on every thread.
    owned<float> o;
    o.shape = {.batch = 2, .q_heads = 4, .kv_heads = 2, .q_len = 113, .kv_len = 113, .d_qk = 64, .d_v = 64};
    std::mt19937 rng(11);
    std::normal_distribution<float> normal;
    const auto fill = [&](std::size_t n) {
        std::vector<float> v(n);
        for (float& x : v) x = normal(rng);
        return v;
    };
    o.q = fill(2 * 4 * 113 * 64), o.k = fill(2 * 2 * 113 * 64), o.v = fill(2 * 2 * 113 * 64);
    o.d_out = fill(2 * 4 * 113 * 64), o.additive = fill(113 * 113), o.sinks = {0.5f, -1.f, 1.f, 0.f};
    o.mask_shape = {113, 113};
    o.want_d_additive = true;
    o.options = {.causal = true,
                 .alignment = qkv::causal_alignment::bottom_right,
                 .window_left = 50,
                 .window_right = 0,
                 .softcap = 5.f,
                 .alibi_max_bias = 8.f,
                 .dropout_p = 0.1f,
                 .dropout_seed = 5};
    const qkv::sdpa_gradients first = qkv::cpu::sdpa_backward(o.backward());
    for (int run = 0; run < 2; ++run) {
        const qkv::sdpa_gradients again = qkv::cpu::sdpa_backward(o.backward());
        CHECK((again.dq == first.dq && again.dk == first.dk && again.dv == first.dv && again.d_sinks == first.d_sinks &&
               again.d_additive_mask == first.d_additive_mask));
    }
    // Batch element 0 alone (its dropout rows are the same) cuts the work differently among the
    // threads, and gives the same bits for everything of its own.
    owned<float> alone = o;
    alone.shape.batch = 1;
    for (std::vector<float>* t : {&alone.q, &alone.k, &alone.v, &alone.d_out}) t->resize(t->size() / 2);
    const qkv::sdpa_gradients part = qkv::cpu::sdpa_backward(alone.backward());
    CHECK(std::equal(part.dq.begin(), part.dq.end(), first.dq.begin()));
    CHECK(std::equal(part.dk.begin(), part.dk.end(), first.dk.begin()));
    CHECK(std::equal(part.dv.begin(), part.dv.end(), first.dv.begin()));
}

// ---- Finite differences ------------------------------------------------------------------------------

/// loss(x) = Σ out(x) · d_out in float64.
double loss(const owned<double>& o) {
    const qkv::sdpa_output_f64 r = qkv::cpu::sdpa(o.forward());
    double sum = 0;
    for (std::size_t n = 0; n < r.output.size(); ++n) sum += r.output[n] * o.d_out[n];
    return sum;
}

/// Central differences of loss along a few elements of `input`, against `grad`.
void finite_differences(owned<double>& o, std::vector<double> owned<double>::*input, const std::vector<double>& grad,
                        const char* what) {
    std::vector<double>& x = o.*input;
    REQUIRE(grad.size() == x.size());
    std::mt19937 rng(7);
    double worst = 0, largest = 0;
    for (int pick = 0; pick < 24; ++pick) {
        const std::size_t n = rng() % x.size();
        const double keep = x[n];
        if (std::isinf(keep)) continue;  // a masked entry
        const double h = 1e-6 * std::max(1.0, std::abs(keep));
        x[n] = keep + h;
        const double up = loss(o);
        x[n] = keep - h;
        const double down = loss(o);
        x[n] = keep;
        const double numeric = (up - down) / (2 * h);
        worst = std::max(worst, std::abs(numeric - grad[n]));
        largest = std::max(largest, std::abs(grad[n]));
    }
    INFO(what << ": largest gradient " << largest << ", largest difference " << worst);
    CHECK(largest > 0);
    CHECK(worst <= 1e-7 * std::max(1.0, largest));
}

TEST_CASE("sdpa_backward: central finite differences in float64", "[sdpa_backward]") {
    for (const char* name : {"everything", "sinks", "softcap", "additive_per_row", "position_offset", "alibi"}) {
        INFO("fixture " << name);
        fixture f = load(name);
        owned<double> o = widen(f.problem);
        const qkv::sdpa_gradients_f64 g = qkv::cpu::sdpa_backward(o.backward());
        finite_differences(o, &owned<double>::q, g.dq, "dq");
        finite_differences(o, &owned<double>::k, g.dk, "dk");
        finite_differences(o, &owned<double>::v, g.dv, "dv");
        if (!o.sinks.empty()) finite_differences(o, &owned<double>::sinks, g.d_sinks, "d_sinks");
        if (!o.additive.empty()) finite_differences(o, &owned<double>::additive, g.d_additive_mask, "d_additive");
    }
}

// ---- The saved tensors, validation and non-finite values ------------------------------------------------

/// A small valid problem with every input used: B 1, Hq 2, Hkv 1, L 3, S 5, E 4, Ev 2.
owned<float> small() {
    owned<float> o;
    o.shape = {.batch = 1, .q_heads = 2, .kv_heads = 1, .q_len = 3, .kv_len = 5, .d_qk = 4, .d_v = 2};
    std::mt19937 rng(3);
    std::normal_distribution<float> normal;
    const auto fill = [&](std::size_t n) {
        std::vector<float> v(n);
        for (float& x : v) x = normal(rng);
        return v;
    };
    o.q = fill(24), o.k = fill(20), o.v = fill(10), o.d_out = fill(12);
    o.additive = fill(15);
    o.mask_shape = {3, 5};
    o.sinks = {0.5f, -1.f};
    return o;
}

void expect_invalid(const owned<float>& o, std::initializer_list<std::string> words) {
    bool thrown = false;
    try {
        (void)qkv::cpu::sdpa_backward(o.backward());
    } catch (const qkv::invalid_argument& e) {
        thrown = true;
        const std::string message = e.what();
        INFO("message: " << message);
        for (const std::string& w : words) CHECK(message.find(w) != std::string::npos);
    }
    CHECK(thrown);
}

TEST_CASE("sdpa_backward: validation names what is wrong", "[sdpa_backward]") {
    const owned<float> valid = small();
    CHECK_NOTHROW(qkv::validate(valid.backward()));
    CHECK_NOTHROW(qkv::validate(widen(valid).backward()));

    owned<float> o = valid;
    o.d_out.pop_back();
    expect_invalid(o, {"d_out has 11 elements", "batch x q_heads x q_len x d_v = 1 x 2 x 3 x 2 = 12"});
    o = valid;
    o.out.assign(11, 0.f);
    expect_invalid(o, {"out has 11 elements"});
    o = valid;
    o.lse.assign(5, 0.f);
    expect_invalid(o, {"lse has 5 elements", "batch x q_heads x q_len = 1 x 2 x 3 = 6"});
    o = valid;
    o.lse.assign(6, 0.f);
    o.lse[4] = std::numeric_limits<float>::infinity();
    expect_invalid(o, {"lse element 4 is +inf"});
    o = valid;
    o.want_d_additive = true;
    o.additive.clear(), o.mask_shape.clear();
    expect_invalid(o, {"return_d_additive_mask", "no additive_mask"});
    // The forward problem's own checks, dropout_p's range among them.
    for (const float p : {1.f, -0.25f, 1.5f, std::numeric_limits<float>::quiet_NaN()}) {
        o = valid;
        o.options.dropout_p = p;
        expect_invalid(o, {"dropout_p must be at least 0 and below 1"});
        CHECK_THROWS_AS(qkv::cpu::sdpa(o.forward()), qkv::invalid_argument);
    }
    o = valid;
    o.k.pop_back();
    expect_invalid(o, {"k has 19 elements"});
}

TEST_CASE("sdpa_backward: saved tensors that are not the forward's are refused", "[sdpa_backward]") {
    owned<float> o = small();
    qkv::sdpa_problem fp = o.forward();
    fp.options.return_lse = true;
    const qkv::sdpa_output fwd = qkv::cpu::sdpa(fp);
    o.out = fwd.output, o.lse = fwd.lse;
    CHECK_NOTHROW(qkv::cpu::sdpa_backward(o.backward()));

    owned<float> bad = o;
    bad.lse[2] += 0.5f;  // its probabilities sum to e^-0.5
    expect_invalid(bad, {"lse of row 2", "sum to 0.6", "must be this problem's forward results"});
    bad = o;
    std::swap(bad.lse[0], bad.lse[5]);
    expect_invalid(bad, {"lse of row"});
    bad = o;
    bad.out[3] *= 1.5f;  // row 1's D
    expect_invalid(bad, {"out of row 1", "rowsum(d_out * out)"});
    bad = o;
    bad.lse[1] = -std::numeric_limits<float>::infinity();
    expect_invalid(bad, {"lse of row 1", "is -inf (no key), but the row attends to keys"});
    // A row with no key (its mask all -inf) must have lse -inf.
    bad = o;
    for (std::size_t j = 0; j < 5; ++j) bad.additive[5 + j] = -std::numeric_limits<float>::infinity();
    qkv::sdpa_problem fp_masked = bad.forward();
    fp_masked.options.return_lse = true;
    const qkv::sdpa_output masked = qkv::cpu::sdpa(fp_masked);
    bad.out = masked.output, bad.lse = masked.lse;
    CHECK_NOTHROW(qkv::cpu::sdpa_backward(bad.backward()));
    bad.lse[1] = 0.25f;
    expect_invalid(bad, {"lse of row 1", "attends to no key"});
    // Within 1 %: a float32 forward's rounding passes, by far.
    owned<float> close = o;
    close.lse[3] += 0.001f;
    CHECK_NOTHROW(qkv::cpu::sdpa_backward(close.backward()));
}

TEST_CASE("sdpa_backward: rows without keys, masked keys and non-finite values", "[sdpa_backward]") {
    owned<float> o = small();
    // Row 1 of every head sees no key, key 3 is masked for every row (the bool mask), key 4 for
    // row 0 (the additive mask's -inf).
    o.mask.assign(15, 1);
    for (std::size_t j = 0; j < 5; ++j) o.mask[5 + j] = 0;
    for (std::size_t i = 0; i < 3; ++i) o.mask[i * 5 + 3] = 0;
    o.additive[4] = -std::numeric_limits<float>::infinity();
    o.want_d_additive = true;
    // A NaN in a masked key's value or key, and in the query of the row without keys, reaches
    // nothing (the bool mask keeps them out of the scores; an additive -inf would not: NaN + -inf
    // is NaN, in the forward pass as here).
    o.v[3 * 2 + 1] = std::numeric_limits<float>::quiet_NaN();
    o.k[3 * 4 + 2] = std::numeric_limits<float>::quiet_NaN();
    o.q[1 * 4] = std::numeric_limits<float>::quiet_NaN();
    const qkv::sdpa_gradients_f64 g = qkv::cpu::sdpa_backward_f64(o.backward());
    for (const double x : g.dk) CHECK(std::isfinite(x));
    for (std::size_t h = 0; h < 2; ++h)
        for (std::size_t c = 0; c < 4; ++c) CHECK(g.dq[(h * 3 + 1) * 4 + c] == 0.0);  // no key: no gradient
    for (std::size_t c = 0; c < 4; ++c) CHECK(g.dk[3 * 4 + c] == 0.0);                // masked for everyone
    for (std::size_t c = 0; c < 2; ++c) CHECK(g.dv[3 * 2 + c] == 0.0);
    for (std::size_t j = 0; j < 5; ++j) CHECK(g.d_additive_mask[5 + j] == 0.0);
    for (std::size_t i = 0; i < 3; ++i) CHECK(g.d_additive_mask[i * 5 + 3] == 0.0);
    CHECK(g.d_additive_mask[4] == 0.0);
    CHECK(g.d_additive_mask[0] != 0.0);

    // A NaN the forward reads poisons what it reaches, as the forward (and torch.autograd): query
    // row 0 of head 0 here; nothing is refused, the rest stays finite.
    owned<float> poisoned = small();
    poisoned.q[0] = std::numeric_limits<float>::quiet_NaN();
    const qkv::sdpa_gradients_f64 p = qkv::cpu::sdpa_backward_f64(poisoned.backward());
    for (std::size_t c = 0; c < 4; ++c) CHECK(std::isnan(p.dq[c]));
    for (std::size_t c = 0; c < 4; ++c) CHECK(std::isfinite(p.dq[4 + c]));
    CHECK(std::isnan(p.dk[0]));
    CHECK(std::isnan(p.d_sinks[0]));
    CHECK(std::isfinite(p.d_sinks[1]));

    // A NaN or infinite d_out (a scaled fp16 loss that overflowed) is taken and reaches what its row
    // reaches: the row's dq, the dk and dv of the keys it attends, its head's sink; nothing else.
    for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity()}) {
        owned<float> scaled = small();
        scaled.d_out[7] = bad;  // row 3: head 1, query 0
        qkv::sdpa_gradients r{};
        REQUIRE_NOTHROW(r = qkv::cpu::sdpa_backward(scaled.backward()));
        for (std::size_t c = 0; c < 4; ++c) CHECK(!std::isfinite(r.dq[3 * 4 + c]));
        for (std::size_t n = 0; n < 3 * 4; ++n) CHECK(std::isfinite(r.dq[n]));  // head 0
        for (std::size_t c = 0; c < 4; ++c) CHECK(!std::isfinite(r.dk[c]));     // through D
        CHECK(!std::isfinite(r.dv[1]));                                         // dv's column of the element
        CHECK(std::isfinite(r.dv[0]));
        CHECK(std::isfinite(r.d_sinks[0]));
        CHECK(!std::isfinite(r.d_sinks[1]));
    }

    // Finite inputs whose gradients leave float32's range: refused by the float32 variant, given
    // by the float64 one; beyond float64's range: refused by both.
    owned<float> big = small();
    for (float& x : big.v) x *= 1e36f;
    for (float& x : big.d_out) x *= 1e30f;
    CHECK_THROWS_WITH(qkv::cpu::sdpa_backward(big.backward()),
                      Catch::Matchers::Contains("beyond the range of the result type") &&
                          Catch::Matchers::Contains("every input is finite"));
    const qkv::sdpa_gradients_f64 wide = qkv::cpu::sdpa_backward_f64(big.backward());
    for (const double x : wide.dq) CHECK(std::isfinite(x));
    owned<double> huge = widen(small());
    for (double& x : huge.v) x *= 1e300;
    for (double& x : huge.d_out) x *= 1e300;
    CHECK_THROWS_WITH(qkv::cpu::sdpa_backward(huge.backward()), Catch::Matchers::Contains("every input is finite"));
}

TEST_CASE("sdpa_backward: the one-head formulas by hand", "[sdpa_backward]") {
    // One query, two keys, E = Ev = 1, scale 1: s = (q k0, q k1), P = softmax(s) with a sink σ,
    // out = P0 v0 + P1 v1; d_out = 1. dv_j = P_j, dS_j = P_j (v_j - out), dq = Σ dS_j k_j,
    // dk_j = dS_j q, dσ = -P_σ out.
    owned<double> o;
    o.shape = {.batch = 1, .q_heads = 1, .kv_heads = 1, .q_len = 1, .kv_len = 2, .d_qk = 1, .d_v = 1};
    o.q = {0.5}, o.k = {1.0, -2.0}, o.v = {3.0, -1.0}, o.d_out = {1.0}, o.sinks = {0.25};
    o.options.scale = 1.f;
    const double e0 = std::exp(0.5), e1 = std::exp(-1.0), es = std::exp(0.25), z = e0 + e1 + es;
    const double p0 = e0 / z, p1 = e1 / z, ps = es / z, out = p0 * 3.0 - p1 * 1.0;
    const double ds0 = p0 * (3.0 - out), ds1 = p1 * (-1.0 - out);
    const qkv::sdpa_gradients_f64 g = qkv::cpu::sdpa_backward(o.backward());
    CHECK(g.dv[0] == Approx(p0).epsilon(1e-14));
    CHECK(g.dv[1] == Approx(p1).epsilon(1e-14));
    CHECK(g.dq[0] == Approx(ds0 * 1.0 + ds1 * -2.0).epsilon(1e-14));
    CHECK(g.dk[0] == Approx(ds0 * 0.5).epsilon(1e-14));
    CHECK(g.dk[1] == Approx(ds1 * 0.5).epsilon(1e-14));
    CHECK(g.d_sinks[0] == Approx(-ps * out).epsilon(1e-14));
}

// ---- The dropout generator --------------------------------------------------------------------------

TEST_CASE("dropout: Philox4x32-10's known answers at run time", "[dropout]") {
    // Random123's kat_vectors (as tests/compile/dropout_static.cpp proves at compile time).
    volatile std::uint32_t ones = 0xffffffffu;  // computed at run time
    const qkv::philox_block all{ones, ones, ones, ones};
    CHECK(qkv::philox4x32(all, {ones, ones}) == qkv::philox_block{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu});
    const qkv::philox_block pi{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, ones & 0x03707344u};
    CHECK(qkv::philox4x32(pi, {0xa4093822u, 0x299f31d0u}) ==
          qkv::philox_block{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u});
}

TEST_CASE("dropout: the keep rate is 1 - p, and streams do not overlap", "[dropout]") {
    constexpr std::uint64_t rows = 512, keys = 1024;  // 2^19 draws
    for (const double p : {0.05, 0.1, 0.5, 0.9}) {
        const qkv::dropout_stream d{.seed = 0x1234abcdull, .offset = 99, .threshold = qkv::dropout_threshold(p)};
        std::uint64_t kept = 0;
        for (std::uint64_t r = 0; r < rows; ++r)
            d.for_each_key(r, 0, keys, [&](std::uint64_t, bool k) { kept += k ? 1 : 0; });
        const double n = static_cast<double>(rows * keys), rate = static_cast<double>(kept) / n;
        const double sigma = std::sqrt(p * (1 - p) / n);
        INFO("p " << p << ": keep rate " << rate << ", sigma " << sigma);
        CHECK(std::abs(rate - (1 - p)) <= 5 * sigma);
    }
    // The same row and key give the same draw; offset + 1 is the next four keys' counter.
    const qkv::dropout_stream a{.seed = 42, .offset = 10, .threshold = qkv::dropout_threshold(0.5)};
    const qkv::dropout_stream b{.seed = 42, .offset = 11, .threshold = qkv::dropout_threshold(0.5)};
    for (std::uint64_t j = 0; j < 64; ++j) CHECK(a.draw(3, j + 4) == b.draw(3, j));
    // Other seeds, rows and offsets give other masks (nearly independent: half the draws differ in
    // their top bit).
    const qkv::dropout_stream c{.seed = 43, .offset = 10, .threshold = qkv::dropout_threshold(0.5)};
    int differ_seed = 0, differ_row = 0;
    for (std::uint64_t j = 0; j < 4096; ++j) {
        differ_seed += a.keeps(3, j) != c.keeps(3, j) ? 1 : 0;
        differ_row += a.keeps(3, j) != a.keeps(4, j) ? 1 : 0;
    }
    CHECK(std::abs(differ_seed - 2048) < 5 * 32);  // sigma = sqrt(4096 / 4) = 32
    CHECK(std::abs(differ_row - 2048) < 5 * 32);
}

TEST_CASE("dropout: cpu::sdpa's mask is the generator's, and p = 0 is no dropout", "[dropout]") {
    owned<float> o = small();
    o.additive.clear(), o.mask_shape.clear(), o.sinks.clear();
    qkv::sdpa_problem plain = o.forward();
    plain.options.return_weights = true;
    plain.options.return_lse = true;
    qkv::sdpa_problem dropped = plain;
    dropped.options.dropout_p = 0.5f;
    dropped.options.dropout_seed = 7;
    dropped.options.dropout_offset = 3;
    const qkv::sdpa_output_f64 a = qkv::cpu::sdpa_f64(plain), b = qkv::cpu::sdpa_f64(dropped);
    CHECK(a.lse == b.lse);
    const qkv::dropout_stream d{.seed = 7, .offset = 3, .threshold = qkv::dropout_threshold(0.5)};
    const qkv::sdpa_shape& s = o.shape;
    int dropped_count = 0;
    for (std::size_t h = 0; h < s.q_heads; ++h)
        for (std::size_t i = 0; i < s.q_len; ++i) {
            const std::uint64_t row = qkv::dropout_row(0, h, i, s.q_heads, s.q_len);
            std::vector<double> out(s.d_v, 0.0);
            for (std::size_t j = 0; j < s.kv_len; ++j) {
                const double w = a.weights[row * s.kv_len + j], wd = b.weights[row * s.kv_len + j];
                CHECK(std::abs(wd) == w);
                CHECK(std::signbit(wd) == !d.keeps(row, j));
                if (!d.keeps(row, j)) {
                    ++dropped_count;
                    continue;
                }
                for (std::size_t c = 0; c < s.d_v; ++c) out[c] += w * 2.0 * static_cast<double>(o.v[j * s.d_v + c]);
            }
            for (std::size_t c = 0; c < s.d_v; ++c) CHECK(b.output[row * s.d_v + c] == Approx(out[c]).epsilon(1e-14));
        }
    CHECK(dropped_count > 0);
    dropped.options.dropout_p = 0;
    const qkv::sdpa_output_f64 none = qkv::cpu::sdpa_f64(dropped);
    CHECK((none.output == a.output && none.weights == a.weights));
}

}  // namespace

TEST_CASE("sdpa_backward: ALiBi far from every key keeps float64's precision", "[sdpa_backward]") {
    // Rows past every key: ALiBi's scores relative to each row's nearest key are the same at
    // position_offset 20 and 2^40 + 20, and so are the probabilities, hence the gradients (no
    // sink: its share depends on the absolute lse). Absolute biases of 2^40·slope in float64 would
    // round the scores by about 1e-4.
    owned<float> o;
    o.shape = {.batch = 1, .q_heads = 2, .kv_heads = 1, .q_len = 5, .kv_len = 9, .d_qk = 16, .d_v = 8};
    std::mt19937 rng(81);
    std::normal_distribution<float> normal;
    const auto fill = [&](std::size_t n) {
        std::vector<float> v(n);
        for (float& x : v) x = normal(rng);
        return v;
    };
    o.q = fill(2 * 5 * 16), o.k = fill(9 * 16), o.v = fill(9 * 8), o.d_out = fill(2 * 5 * 8);
    o.options = {.alibi_max_bias = 8.f, .position_offset = 20};
    const qkv::sdpa_gradients_f64 near = qkv::cpu::sdpa_backward_f64(o.backward());
    o.options.position_offset = (std::int64_t{1} << 40) + 20;
    const qkv::sdpa_gradients_f64 far = qkv::cpu::sdpa_backward_f64(o.backward());
    CHECK(nmse(far.dq, near.dq, "dq") <= 1e-24);
    CHECK(nmse(far.dk, near.dk, "dk") <= 1e-24);
    CHECK(nmse(far.dv, near.dv, "dv") <= 1e-24);
    // From the forward's saved float64 lse too: lse and the relative scores meet again, as precisely
    // as the saved lse holds its row (it is about -2^36 here: rounded by 2^-17, so P by ~1e-5).
    owned<double> d = widen(o);  // p's spans view d's vectors
    qkv::basic_sdpa_problem<double> p = d.forward();
    p.options.return_lse = true;
    const auto saved = qkv::cpu::sdpa(p);
    d.out = saved.output, d.lse = saved.lse;
    const qkv::sdpa_gradients_f64 from_saved = qkv::cpu::sdpa_backward(d.backward());
    CHECK(nmse(from_saved.dq, near.dq, "dq from the saved lse") <= 1e-8);
    CHECK(nmse(from_saved.dk, near.dk, "dk from the saved lse") <= 1e-8);
}
