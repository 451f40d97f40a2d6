// The backward pass on the device (context::sdpa_backward, kernels/flash_backward.hpp) against the
// float64 CPU reference (qkv::cpu::sdpa_backward_f64), which is tested against torch.autograd
// (tests/sdpa_backward_test.cpp): odd shapes, every option alone and together, both causal
// alignments, GQA, fp16 storage, the saved tensors' check, the non-finite rules, determinism,
// key and row chunks, and dropout's mask bit for bit against the CPU's.
#include <qkv/runtime/cpu.hpp>
#include <qkv/vulkan/context.hpp>
#include <qkv/vulkan/sdpa_backward_call.hpp>
#include <qkv/vulkan/sdpa_call.hpp>
#include <qkv/vulkan/sequence.hpp>
#include <qkv/vulkan/tensor.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "support/catch.hpp"
#include "support/families.hpp"
#include "support/gpu.hpp"

namespace {

using qkv_test::gpu;
using qkv_test::require_clean;

/// Σ(got - want)² / Σ want²; a non-finite value where the reference is finite (or the reverse) fails.
double nmse(const std::vector<float>& got, const std::vector<double>& want) {
    REQUIRE(got.size() == want.size());
    double num = 0, den = 0;
    for (std::size_t n = 0; n < got.size(); ++n) {
        INFO("element " << n << ": " << got[n] << " vs " << want[n]);
        REQUIRE(std::isfinite(got[n]) == std::isfinite(want[n]));
        if (!std::isfinite(want[n])) continue;
        const double d = static_cast<double>(got[n]) - want[n];
        num += d * d;
        den += want[n] * want[n];
    }
    return den > 0 ? num / den : num;
}

/// A problem's owned data.
struct owned {
    qkv::sdpa_shape shape;
    qkv::sdpa_options options;
    std::vector<float> q, k, v, d_out, additive, sinks, slopes, out, lse;
    std::vector<std::uint8_t> mask;
    std::vector<std::size_t> mask_shape;
    bool want_d_additive = false;

    [[nodiscard]] qkv::sdpa_problem forward() const {
        qkv::sdpa_problem p{.shape = shape, .q = q, .k = k, .v = v, .options = options};
        p.mask = mask, p.additive_mask = additive, p.mask_shape = mask_shape, p.sinks = sinks;
        p.alibi_slopes = slopes;
        return p;
    }
    [[nodiscard]] qkv::sdpa_backward_problem backward() const {
        qkv::sdpa_backward_problem b{.forward = forward()};
        b.out = out, b.lse = lse, b.d_out = d_out;
        b.return_d_additive_mask = want_d_additive;
        return b;
    }
};

std::vector<float> normal(std::size_t n, std::mt19937& rng, float sigma = 1.f) {
    std::normal_distribution<float> dist(0.f, sigma);
    std::vector<float> v(n);
    for (float& x : v) x = dist(rng);
    return v;
}

owned make(const qkv::sdpa_shape& s, const qkv::sdpa_options& options, std::uint32_t seed) {
    std::mt19937 rng(seed);
    owned o;
    o.shape = s;
    o.options = options;
    o.q = normal(s.batch * s.q_heads * s.q_len * s.d_qk, rng);
    o.k = normal(s.batch * s.kv_heads * s.kv_len * s.d_qk, rng);
    o.v = normal(s.batch * s.kv_heads * s.kv_len * s.d_v, rng);
    o.d_out = normal(s.batch * s.q_heads * s.q_len * s.d_v, rng);
    return o;
}

/// The forward's out and lse from the CPU reference (float32 results, as a caller saves them).
void save_forward(owned& o) {
    qkv::sdpa_problem p = o.forward();
    p.options.return_lse = true;
    const qkv::sdpa_output f = qkv::cpu::sdpa(p);
    o.out = f.output, o.lse = f.lse;
}

/// `o` with one non-finite input (its forward saved again), for the three places the NaN tests
/// poison (rows of 16 values): 0, a key's value; 1, a query; 2, an infinite d_out element.
owned poisoned_copy(const owned& o, int where) {
    owned poisoned = o;
    const float nan = std::numeric_limits<float>::quiet_NaN();
    if (where == 0) poisoned.v[4 * 16 + 1] = nan;
    if (where == 1) poisoned.q[2 * 16 + 3] = nan;
    if (where == 2) poisoned.d_out[6 * 16 + 5] = std::numeric_limits<float>::infinity();
    save_forward(poisoned);
    return poisoned;
}

/// The device's gradients against the float64 reference, each within `bound`.
void check_against_reference(const owned& o, double bound) {
    const qkv::sdpa_gradients_f64 want = qkv::cpu::sdpa_backward_f64(o.backward());
    const qkv::sdpa_gradients got = gpu().sdpa_backward(o.backward());
    require_clean(gpu());
    CHECK(nmse(got.dq, want.dq) <= bound);
    CHECK(nmse(got.dk, want.dk) <= bound);
    CHECK(nmse(got.dv, want.dv) <= bound);
    REQUIRE(got.d_sinks.size() == want.d_sinks.size());
    if (!want.d_sinks.empty()) CHECK(nmse(got.d_sinks, want.d_sinks) <= bound);
    REQUIRE(got.d_additive_mask.size() == want.d_additive_mask.size());
    if (!want.d_additive_mask.empty()) CHECK(nmse(got.d_additive_mask, want.d_additive_mask) <= bound);
}

/// The same problem with q, k, v and d_out as float16 stores them (precision fp16's storage).
owned rounded_to_half(owned o) {
    for (std::vector<float>* t : {&o.q, &o.k, &o.v, &o.d_out}) *t = qkv::round_trip(qkv::element_type::f16, *t);
    return o;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

template <class F>
void expect_throw_with(F&& f, std::initializer_list<std::string> words) {
    bool thrown = false;
    try {
        f();
    } catch (const std::exception& e) {
        thrown = true;
        const std::string m = e.what();
        INFO("message: " << m);
        for (const std::string& w : words) CHECK(m.find(w) != std::string::npos);
    }
    CHECK(thrown);
}

/// The description of a backward call over tensors: `o`'s shape, options, masks and sinks, no data.
qkv::sdpa_backward_problem description_of(const owned& o) {
    qkv::sdpa_backward_problem b = o.backward();
    b.forward.q = {}, b.forward.k = {}, b.forward.v = {};
    b.out = {}, b.lse = {}, b.d_out = {};
    return b;
}

/// A backward call's tensors on the device: q, k, v and d_out of the precision's type, uploaded;
/// out and lse uploaded where `o` holds them; the gradients (d_sinks and the mask's where asked).
struct device_tensors {
    qkv::vulkan::tensor q, k, v, d_out, out, lse, dq, dk, dv, d_sinks, d_mask;

    device_tensors(qkv::vulkan::context& ctx, const owned& o) {
        const qkv::sdpa_shape& s = o.shape;
        const qkv::element_type type =
            o.options.precision == qkv::precision::fp16 ? qkv::element_type::f16 : qkv::element_type::f32;
        const auto make_one = [&](std::vector<std::size_t> shape, const std::vector<float>& values,
                                  qkv::element_type t = qkv::element_type::f32) {
            qkv::vulkan::tensor x(ctx, std::move(shape), t);
            if (!values.empty()) x.upload(values);
            return x;
        };
        q = make_one({s.batch, s.q_heads, s.q_len, s.d_qk}, o.q, type);
        k = make_one({s.batch, s.kv_heads, s.kv_len, s.d_qk}, o.k, type);
        v = make_one({s.batch, s.kv_heads, s.kv_len, s.d_v}, o.v, type);
        d_out = make_one({s.batch, s.q_heads, s.q_len, s.d_v}, o.d_out, type);
        out = make_one({s.batch, s.q_heads, s.q_len, s.d_v}, o.out);
        lse = make_one({s.batch, s.q_heads, s.q_len}, o.lse);
        dq = make_one({s.batch, s.q_heads, s.q_len, s.d_qk}, {});
        dk = make_one({s.batch, s.kv_heads, s.kv_len, s.d_qk}, {});
        dv = make_one({s.batch, s.kv_heads, s.kv_len, s.d_v}, {});
        if (!o.sinks.empty()) d_sinks = make_one({s.q_heads}, {});
        if (o.want_d_additive)  // the mask's shape (L x S where mask_shape is empty)
            d_mask = make_one(o.mask_shape.empty() ? std::vector<std::size_t>{s.q_len, s.kv_len} : o.mask_shape, {});
    }
    [[nodiscard]] qkv::vulkan::sdpa_backward_tensors view() {
        return {.q = &q,
                .k = &k,
                .v = &v,
                .out = &out,
                .lse = &lse,
                .d_out = &d_out,
                .dq = &dq,
                .dk = &dk,
                .dv = &dv,
                .d_sinks = d_sinks ? &d_sinks : nullptr,
                .d_additive_mask = d_mask ? &d_mask : nullptr};
    }
    /// The gradients as the device holds them.
    [[nodiscard]] qkv::sdpa_gradients gradients() const {
        qkv::sdpa_gradients g;
        g.dq = dq.download(), g.dk = dk.download(), g.dv = dv.download();
        if (d_sinks) g.d_sinks = d_sinks.download();
        if (d_mask) g.d_additive_mask = d_mask.download();
        return g;
    }
};

/// `got` against the float64 reference of `o` (the values float16 stores, with precision fp16; the
/// reference's own forward where `o` holds no out and lse).
void check_gradients(const qkv::sdpa_gradients& got, const owned& o, double bound) {
    const owned r = o.options.precision == qkv::precision::fp16 ? rounded_to_half(o) : o;
    const qkv::sdpa_gradients_f64 want = qkv::cpu::sdpa_backward_f64(r.backward());
    CHECK(nmse(got.dq, want.dq) <= bound);
    CHECK(nmse(got.dk, want.dk) <= bound);
    CHECK(nmse(got.dv, want.dv) <= bound);
    REQUIRE(got.d_sinks.size() == want.d_sinks.size());
    if (!want.d_sinks.empty()) CHECK(nmse(got.d_sinks, want.d_sinks) <= bound);
    REQUIRE(got.d_additive_mask.size() == want.d_additive_mask.size());
    if (!want.d_additive_mask.empty()) CHECK(nmse(got.d_additive_mask, want.d_additive_mask) <= bound);
}

bool same_gradients(const qkv::sdpa_gradients& a, const qkv::sdpa_gradients& b) {
    return same_bits(a.dq, b.dq) && same_bits(a.dk, b.dk) && same_bits(a.dv, b.dv) && same_bits(a.d_sinks, b.d_sinks) &&
           same_bits(a.d_additive_mask, b.d_additive_mask);
}

/// The device's gradients of `o` the same bits twice, and, with keys (dq), row slots (dk/dv) and
/// sums (the folds) cut into chunks of 8 as lavapipe's loop limit cuts long sequences, equal to
/// float64's; the chunked context's validation silent.
void check_repeatable_and_chunked(const owned& o) {
    const qkv::sdpa_gradients first = gpu().sdpa_backward(o.backward());
    const qkv::sdpa_gradients again = gpu().sdpa_backward(o.backward());
    CHECK(same_bits(first.dq, again.dq));
    CHECK(same_bits(first.dk, again.dk));
    CHECK(same_bits(first.dv, again.dv));
    CHECK(same_bits(first.d_sinks, again.d_sinks));
    CHECK(same_bits(first.d_additive_mask, again.d_additive_mask));
    qkv::vulkan::context chunked = qkv_test::make_context({.max_fused_keys_per_dispatch = 8});
    const qkv::sdpa_gradients cut = chunked.sdpa_backward(o.backward());
    qkv_test::require_clean(chunked);
    const qkv::sdpa_gradients_f64 want = qkv::cpu::sdpa_backward_f64(o.backward());
    CHECK(nmse(cut.dq, want.dq) <= 1e-9);
    CHECK(nmse(cut.dk, want.dk) <= 1e-9);
    CHECK(nmse(cut.dv, want.dv) <= 1e-9);
    REQUIRE(cut.d_sinks.size() == want.d_sinks.size());
    if (!want.d_sinks.empty()) CHECK(nmse(cut.d_sinks, want.d_sinks) <= 1e-9);
    REQUIRE(cut.d_additive_mask.size() == want.d_additive_mask.size());
    if (!want.d_additive_mask.empty()) CHECK(nmse(cut.d_additive_mask, want.d_additive_mask) <= 1e-9);
}

/// A float16 computation of the same gradients, the same-dtype reference of FlashAttention's
/// tolerance rule, written from PyTorch's documented scaled_dot_product_attention (S = Q·Kᵀ·scale,
/// causal keys j <= i + off, P = softmax(S), O = P·V; K and V repeated over each group) and its
/// autograd, as PyTorch runs it in float16: every product and every op's result rounded to float16
/// (sums inside an op in float32): S, S·scale, P, O; dP = dO·Vᵀ, dV = Pᵀ·dO, the softmax's
/// backward dS = P∘(dP − Σ_j P·dP), the scale's, dQ = dS·K, dK = dSᵀ·Q, and the group's sums of
/// dK and dV. A row that sees no key has zero gradients. Takes q, k, v and d_out as float16 holds
/// them, no rule but the causal one.
struct half_gradients {
    std::vector<float> dq, dk, dv;
};
half_gradients half_reference(const owned& o) {
    const qkv::sdpa_shape& sh = o.shape;
    const std::size_t L = sh.q_len, S = sh.kv_len, E = sh.d_qk, Ev = sh.d_v, group = sh.q_heads / sh.kv_heads;
    const float scale = qkv::default_scale(sh);
    const std::int64_t off = qkv::causal_offset(sh, o.options);
    const auto half = [](std::vector<float>& x) { x = qkv::round_trip(qkv::element_type::f16, x); };
    const auto seen = [&](std::size_t i, std::size_t j) {
        return !o.options.causal || static_cast<std::int64_t>(j) <= static_cast<std::int64_t>(i) + off;
    };
    half_gradients g;
    g.dq.assign(o.q.size(), 0.f), g.dk.assign(o.k.size(), 0.f), g.dv.assign(o.v.size(), 0.f);
    std::vector<float> dk_sum(o.k.size(), 0.f), dv_sum(o.v.size(), 0.f);
    for (std::size_t b = 0; b < sh.batch; ++b)
        for (std::size_t h = 0; h < sh.q_heads; ++h) {
            const std::size_t kvh = h / group;
            const float* q = o.q.data() + (b * sh.q_heads + h) * L * E;
            const float* dout = o.d_out.data() + (b * sh.q_heads + h) * L * Ev;
            const float* k = o.k.data() + (b * sh.kv_heads + kvh) * S * E;
            const float* v = o.v.data() + (b * sh.kv_heads + kvh) * S * Ev;
            std::vector<float> s(L * S), p(L * S, 0.f), dp(L * S), ds(L * S, 0.f);
            for (std::size_t i = 0; i < L; ++i)
                for (std::size_t j = 0; j < S; ++j) {
                    float acc = 0;
                    for (std::size_t e = 0; e < E; ++e) acc += q[i * E + e] * k[j * E + e];
                    s[i * S + j] = acc;
                }
            half(s);
            for (float& x : s) x *= scale;
            half(s);
            for (std::size_t i = 0; i < L; ++i) {  // the softmax over the row's visible keys
                float m = -std::numeric_limits<float>::infinity();
                for (std::size_t j = 0; j < S; ++j)
                    if (seen(i, j)) m = std::max(m, s[i * S + j]);
                if (std::isinf(m)) continue;  // no key: P = 0
                float z = 0;
                for (std::size_t j = 0; j < S; ++j)
                    if (seen(i, j)) z += std::exp(s[i * S + j] - m);
                for (std::size_t j = 0; j < S; ++j)
                    if (seen(i, j)) p[i * S + j] = std::exp(s[i * S + j] - m) / z;
            }
            half(p);
            for (std::size_t i = 0; i < L; ++i)
                for (std::size_t j = 0; j < S; ++j) {
                    float acc = 0;
                    for (std::size_t e = 0; e < Ev; ++e) acc += dout[i * Ev + e] * v[j * Ev + e];
                    dp[i * S + j] = acc;
                }
            half(dp);
            std::vector<float> dv(S * Ev, 0.f), dk(S * E, 0.f), dq(L * E, 0.f);
            for (std::size_t j = 0; j < S; ++j)
                for (std::size_t e = 0; e < Ev; ++e) {
                    float acc = 0;
                    for (std::size_t i = 0; i < L; ++i) acc += p[i * S + j] * dout[i * Ev + e];
                    dv[j * Ev + e] = acc;
                }
            half(dv);
            for (std::size_t i = 0; i < L; ++i) {
                float d = 0;
                for (std::size_t j = 0; j < S; ++j) d += p[i * S + j] * dp[i * S + j];
                for (std::size_t j = 0; j < S; ++j) ds[i * S + j] = p[i * S + j] * (dp[i * S + j] - d);
            }
            half(ds);
            for (float& x : ds) x *= scale;
            half(ds);
            for (std::size_t i = 0; i < L; ++i)
                for (std::size_t e = 0; e < E; ++e) {
                    float acc = 0;
                    for (std::size_t j = 0; j < S; ++j) acc += ds[i * S + j] * k[j * E + e];
                    dq[i * E + e] = acc;
                }
            half(dq);
            for (std::size_t j = 0; j < S; ++j)
                for (std::size_t e = 0; e < E; ++e) {
                    float acc = 0;
                    for (std::size_t i = 0; i < L; ++i) acc += ds[i * S + j] * q[i * E + e];
                    dk[j * E + e] = acc;
                }
            half(dk);
            std::copy(dq.begin(), dq.end(), g.dq.begin() + static_cast<std::ptrdiff_t>((b * sh.q_heads + h) * L * E));
            const std::size_t kat = (b * sh.kv_heads + kvh) * S * E, vat = (b * sh.kv_heads + kvh) * S * Ev;
            for (std::size_t n = 0; n < dk.size(); ++n) dk_sum[kat + n] += dk[n];
            for (std::size_t n = 0; n < dv.size(); ++n) dv_sum[vat + n] += dv[n];
        }
    half(dk_sum), half(dv_sum);  // the group's sums (the repeat's backward), one float16 result
    g.dk = std::move(dk_sum), g.dv = std::move(dv_sum);
    return g;
}

/// The largest |got - want| and the root of the nmse.
struct error_of {
    double max_abs = 0, rms = 0;
};
error_of error_against(const std::vector<float>& got, const std::vector<double>& want) {
    error_of e;
    e.rms = std::sqrt(nmse(got, want));
    for (std::size_t n = 0; n < got.size(); ++n)
        e.max_abs = std::max(e.max_abs, std::abs(static_cast<double>(got[n]) - want[n]));
    return e;
}

/// FlashAttention's tolerance rule for half-precision gradients: `o`'s q, k, v and d_out as
/// float16 holds them, each of dq, dk and dv from `ctx` (precision fp16) within twice the error
/// of the float16 reference (half_reference) against float64, by the largest difference (as
/// FlashAttention's tests) and by the root of the nmse; the reference's own error that of a
/// float16 computation (so that the rule measures something). Returns dq's nmse.
double check_flash_attention_rule(qkv::vulkan::context& ctx, owned o) {
    o = rounded_to_half(o);
    save_forward(o);
    const qkv::sdpa_gradients_f64 want = qkv::cpu::sdpa_backward_f64(o.backward());
    const half_gradients ref = half_reference(o);
    const qkv::sdpa_gradients got = ctx.sdpa_backward(o.backward());
    qkv_test::require_clean(ctx);
    const std::pair<const char*, std::pair<const std::vector<float>*, const std::vector<float>*>> grads[] = {
        {"dq", {&got.dq, &ref.dq}}, {"dk", {&got.dk, &ref.dk}}, {"dv", {&got.dv, &ref.dv}}};
    const std::vector<double>* wants[] = {&want.dq, &want.dk, &want.dv};
    for (std::size_t n = 0; n < 3; ++n) {
        const error_of mine = error_against(*grads[n].second.first, *wants[n]);
        const error_of theirs = error_against(*grads[n].second.second, *wants[n]);
        INFO(grads[n].first << ": max |error| " << mine.max_abs << " against float16's " << theirs.max_abs << ", rms "
                            << mine.rms << " against " << theirs.rms);
        CHECK(theirs.rms > 1e-5);  // a float16 computation: unit roundoff 2^-11
        CHECK(theirs.rms < 1e-2);
        CHECK(mine.max_abs <= 2 * theirs.max_abs);
        CHECK(mine.rms <= 2 * theirs.rms);
    }
    return nmse(got.dq, want.dq);
}

/// The shapes the rule is checked at: odd lengths and widths, GQA, causal both ways, one row.
std::vector<owned> flash_attention_rule_problems(qkv::kernel_family family) {
    const auto with = [&](qkv::sdpa_options options) {
        options.precision = qkv::precision::fp16;
        options.kernel = family;
        return options;
    };
    std::vector<owned> all;
    all.push_back(make({.batch = 1, .q_heads = 4, .kv_heads = 2, .q_len = 37, .kv_len = 41, .d_qk = 64, .d_v = 64},
                       with({.causal = true}), 301));
    all.push_back(make({.batch = 2, .q_heads = 3, .kv_heads = 1, .q_len = 17, .kv_len = 113, .d_qk = 80, .d_v = 48},
                       with({}), 302));
    all.push_back(make({.batch = 1, .q_heads = 2, .kv_heads = 2, .q_len = 113, .kv_len = 17, .d_qk = 16, .d_v = 16},
                       with({.causal = true, .alignment = qkv::causal_alignment::bottom_right}), 303));
    all.push_back(
        make({.batch = 1, .q_heads = 2, .kv_heads = 1, .q_len = 1, .kv_len = 3, .d_qk = 17, .d_v = 3}, with({}), 304));
    return all;
}

/// The problems the calls over tensors are tested on: odd shapes, then every rule together
/// (GQA, causal bottom-right, a window, softcap, ALiBi, sinks, an additive mask and its gradient,
/// dropout), a bool mask with rows that see no key and given ALiBi slopes, and fp16 storage.
std::vector<owned> tensor_problems() {
    std::vector<owned> all;
    for (const auto& [L, S, E] :
         {std::tuple<std::size_t, std::size_t, std::size_t>{1, 1, 16}, {3, 17, 16}, {17, 113, 80}, {113, 3, 16}}) {
        const qkv::sdpa_shape s{.batch = 1, .q_heads = 2, .kv_heads = 1, .q_len = L, .kv_len = S, .d_qk = E, .d_v = E};
        all.push_back(make(s, {}, static_cast<std::uint32_t>(L * 100 + S)));
    }
    std::mt19937 rng(61);
    const qkv::sdpa_shape g{.batch = 2, .q_heads = 4, .kv_heads = 2, .q_len = 17, .kv_len = 29, .d_qk = 16, .d_v = 8};
    owned every = make(g,
                       {.causal = true,
                        .alignment = qkv::causal_alignment::bottom_right,
                        .window_left = 9,
                        .softcap = 5.f,
                        .alibi_max_bias = 4.f,
                        .dropout_p = 0.25f,
                        .dropout_seed = 0xfeedull,
                        .dropout_offset = 3},
                       62);
    every.sinks = normal(4, rng);
    every.additive = normal(17 * 29, rng);
    every.mask_shape = {17, 29};
    every.want_d_additive = true;
    all.push_back(every);
    const qkv::sdpa_shape b{.batch = 2, .q_heads = 2, .kv_heads = 2, .q_len = 13, .kv_len = 5, .d_qk = 16, .d_v = 16};
    owned masked = make(b, {.causal = true, .alignment = qkv::causal_alignment::bottom_right}, 63);
    masked.mask.resize(2 * 13 * 5);
    for (std::size_t n = 0; n < masked.mask.size(); ++n) masked.mask[n] = (n * 7 + 3) % 5 != 0 ? 1 : 0;
    masked.mask_shape = {1, 2, 13, 5};
    masked.slopes = {0.5f, 0.125f};  // ALiBi's slopes given per head (FlashAttention's alibi_slopes)
    all.push_back(masked);
    const qkv::sdpa_shape h{.batch = 1, .q_heads = 4, .kv_heads = 2, .q_len = 37, .kv_len = 41, .d_qk = 64, .d_v = 64};
    if (gpu().device().fp16_storage)
        all.push_back(make(h, {.causal = true, .precision = qkv::precision::fp16, .softcap = 20.f}, 64));
    for (owned& o : all) save_forward(o);
    return all;
}

}  // namespace

TEST_CASE("sdpa_backward on the device: odd shapes against the float64 reference", "[backward]") {
    for (const std::size_t L : {1u, 3u, 17u, 113u})
        for (const std::size_t S : {1u, 17u, 113u}) {
            const std::size_t E = L == 17 ? 80 : 16;
            const qkv::sdpa_shape s{
                .batch = 1, .q_heads = 2, .kv_heads = 1, .q_len = L, .kv_len = S, .d_qk = E, .d_v = E};
            owned o = make(s, {}, static_cast<std::uint32_t>(L * 1000 + S));
            save_forward(o);
            INFO("L " << L << ", S " << S << ", E " << E);
            check_against_reference(o, 1e-9);
        }
}

TEST_CASE("sdpa_backward on the device: the call's timings name each kernel's part", "[backward]") {
    const qkv::sdpa_shape s{.batch = 1, .q_heads = 2, .kv_heads = 1, .q_len = 17, .kv_len = 113, .d_qk = 16, .d_v = 16};
    owned o = make(s, {}, 7);
    save_forward(o);
    (void)gpu().sdpa_backward(o.backward());
    const qkv::vulkan::call_stats t = gpu().last_call();
    if (!gpu().device().timestamps) {
        CHECK(t.backward_dq_ms == 0);
        CHECK(t.backward_dkdv_ms == 0);
        return;
    }
    CHECK(t.backward_dq_ms > 0);
    CHECK(t.backward_dkdv_ms > 0);
    CHECK(t.backward_dq_ms + t.backward_dkdv_ms <= t.attention_ms * (1 + 1e-9));
    CHECK(t.attention_ms <= t.device_ms * (1 + 1e-9));
    // Another kind of call reports neither.
    qkv::sdpa_problem f = o.forward();
    (void)gpu().sdpa(f);
    CHECK(gpu().last_call().backward_dq_ms == 0);
    CHECK(gpu().last_call().backward_dkdv_ms == 0);
    require_clean(gpu());
}

TEST_CASE("sdpa_backward on the device: causal, GQA and every rule", "[backward]") {
    const qkv::sdpa_shape s{.batch = 2, .q_heads = 4, .kv_heads = 2, .q_len = 17, .kv_len = 33, .d_qk = 16, .d_v = 8};
    for (const auto align : {qkv::causal_alignment::top_left, qkv::causal_alignment::bottom_right}) {
        owned o = make(s, {.causal = true, .alignment = align}, 7);
        save_forward(o);
        check_against_reference(o, 1e-9);
    }
    owned o = make(s, {.causal = true, .window_left = 5, .window_right = 0, .softcap = 3.f, .alibi_max_bias = 8.f}, 8);
    std::mt19937 rng(9);
    o.sinks = normal(4, rng);
    o.additive = normal(17 * 33, rng);
    o.mask_shape = {17, 33};
    o.want_d_additive = true;
    save_forward(o);
    check_against_reference(o, 1e-9);
}

TEST_CASE("sdpa_backward on the device: dropout", "[backward]") {
    const qkv::sdpa_shape s{.batch = 1, .q_heads = 2, .kv_heads = 2, .q_len = 19, .kv_len = 23, .d_qk = 16, .d_v = 16};
    owned o = make(s, {.dropout_p = 0.25f, .dropout_seed = 0x123456789abcdefull, .dropout_offset = 77}, 11);
    save_forward(o);
    check_against_reference(o, 1e-9);
    // With every rule, GQA, both alignments' offset and the mask's gradient: the same mask as the
    // forward's, whatever else the call does.
    const qkv::sdpa_shape g{.batch = 2, .q_heads = 3, .kv_heads = 1, .q_len = 17, .kv_len = 29, .d_qk = 16, .d_v = 8};
    owned all = make(g,
                     {.causal = true,
                      .alignment = qkv::causal_alignment::bottom_right,
                      .window_left = 9,
                      .softcap = 5.f,
                      .alibi_max_bias = 4.f,
                      .dropout_p = 0.5f,
                      .dropout_seed = 3,
                      .dropout_offset = 5},
                     12);
    std::mt19937 rng(13);
    all.sinks = normal(3, rng);
    all.additive = normal(3 * 17 * 29, rng);
    all.mask_shape = {3, 1, 29};  // (Hq, 1, S): broadcast over batch and rows
    all.additive.resize(3 * 29);
    all.want_d_additive = true;
    save_forward(all);
    check_against_reference(all, 1e-9);
}

TEST_CASE("sdpa_backward on the device: rows without keys, masks, offsets and K/V types", "[backward]") {
    std::mt19937 rng(21);
    // L > S bottom-right: the first L - S rows see no key (zero gradients), with sinks (their
    // gradient still has every row's term) and a bool mask broadcast over the batch.
    const qkv::sdpa_shape s{.batch = 2, .q_heads = 2, .kv_heads = 2, .q_len = 13, .kv_len = 5, .d_qk = 16, .d_v = 16};
    owned o = make(s, {.causal = true, .alignment = qkv::causal_alignment::bottom_right}, 22);
    o.sinks = normal(2, rng);
    o.mask.resize(2 * 13 * 5);
    for (std::size_t n = 0; n < o.mask.size(); ++n) o.mask[n] = (n * 7 + 3) % 5 != 0 ? 1 : 0;
    o.mask_shape = {1, 2, 13, 5};
    save_forward(o);
    check_against_reference(o, 1e-9);
    // An explicit position offset with a window on both sides; an additive mask with -inf entries,
    // its gradient of the full shape.
    owned w = make(s, {.window_left = 3, .window_right = 2, .position_offset = -4}, 23);
    w.additive = normal(2 * 2 * 13 * 5, rng);
    for (std::size_t n = 0; n < w.additive.size(); n += 7) w.additive[n] = -std::numeric_limits<float>::infinity();
    w.mask_shape = {2, 2, 13, 5};
    w.want_d_additive = true;
    save_forward(w);
    check_against_reference(w, 1e-9);
    // K and V stored as q8_0: the gradients at the stored values (the reference rounds them too).
    const qkv::sdpa_shape wide{
        .batch = 1, .q_heads = 2, .kv_heads = 1, .q_len = 9, .kv_len = 33, .d_qk = 32, .d_v = 32};
    owned q8 = make(wide, {.causal = true, .kv_type = qkv::element_type::q8_0}, 24);
    save_forward(q8);
    check_against_reference(q8, 1e-9);
}

TEST_CASE("sdpa_backward on the device: fp16 storage", "[backward]") {
    // Q, K, V and d_out stored as float16, every sum in float32: against the reference of the
    // values float16 holds.
    const qkv::sdpa_shape s{.batch = 1, .q_heads = 4, .kv_heads = 2, .q_len = 37, .kv_len = 41, .d_qk = 64, .d_v = 64};
    owned o = make(s, {.causal = true, .precision = qkv::precision::fp16, .softcap = 20.f}, 31);
    save_forward(o);
    const owned r = rounded_to_half(o);
    const qkv::sdpa_gradients_f64 want = qkv::cpu::sdpa_backward_f64(r.backward());
    const qkv::sdpa_gradients got = gpu().sdpa_backward(o.backward());
    require_clean(gpu());
    CHECK(nmse(got.dq, want.dq) <= 1e-9);
    CHECK(nmse(got.dk, want.dk) <= 1e-9);
    CHECK(nmse(got.dv, want.dv) <= 1e-9);
    // A d_out beyond float16's range is refused, as q, k and v are.
    o.d_out[5] = 1e6f;
    CHECK_THROWS_AS(gpu().sdpa_backward(o.backward()), qkv::vulkan::numeric_overflow);
}

TEST_CASE("sdpa_backward on the device: FlashAttention's tolerance rule for fp16 gradients", "[backward]") {
    // The scalar family (float16 storage, float32 sums): within twice a float16 computation's error.
    if (!gpu().device().fp16_storage) {
        WARN("no 16-bit storage: nothing to check");
        return;
    }
    for (const owned& o : flash_attention_rule_problems(qkv::kernel_family::automatic)) {
        INFO("L = " << o.shape.q_len << ", S = " << o.shape.kv_len << ", d = " << o.shape.d_qk << " / " << o.shape.d_v);
        (void)check_flash_attention_rule(gpu(), o);
    }
}

TEST_CASE("sdpa_backward on the device: the fused order in chunks of heads, the same bits", "[backward]") {
    // The fused order's dR scratch for a few (batch, head)s at a time (flash_bwd_plan::fused_heads):
    // whole K/V heads' groups, parts of a group (dk/dv resumes), with row chunks inside, GQA of
    // three, causal with a window, sinks and a softcap: every chunking the bits of one chunk.
    const qkv::sdpa_shape s{.batch = 2, .q_heads = 6, .kv_heads = 2, .q_len = 17, .kv_len = 113, .d_qk = 16, .d_v = 8};
    owned o = make(s, {.causal = true, .window_left = 40, .softcap = 8.f}, 211);
    std::mt19937 rng(212);
    o.sinks = normal(6, rng);
    save_forward(o);
    const qkv::sdpa_gradients whole = gpu().sdpa_backward(o.backward());
    require_clean(gpu());
    const bool split = gpu().device().timestamps && gpu().last_call().backward_dq_ms > 0;
    const qkv::sdpa_gradients_f64 want = qkv::cpu::sdpa_backward_f64(o.backward());
    CHECK(nmse(whole.dq, want.dq) <= 1e-9);
    CHECK(nmse(whole.dk, want.dk) <= 1e-9);
    CHECK(nmse(whole.dv, want.dv) <= 1e-9);
    CHECK(nmse(whole.d_sinks, want.d_sinks) <= 1e-9);
    // fp16 storage, the same way.
    owned h = o;
    h.options.precision = qkv::precision::fp16;
    save_forward(h);
    const bool half = gpu().device().fp16_storage;
    const qkv::sdpa_gradients whole_half = half ? gpu().sdpa_backward(h.backward()) : qkv::sdpa_gradients{};
    // Two heads per chunk (parts of a group of three: 2 + 1, dk/dv resuming) with row chunks of 8
    // inside; three (one K/V head's group each).
    for (const auto& [heads, keys] : {std::pair<std::uint32_t, std::uint32_t>{2, 8}, {3, 0}}) {
        INFO(heads << " heads per chunk, " << keys << " row slots per dk/dv dispatch");
        qkv::vulkan::context chunked =
            qkv_test::make_context({.max_fused_keys_per_dispatch = keys, .max_fused_backward_heads = heads});
        const qkv::sdpa_gradients cut = chunked.sdpa_backward(o.backward());
        qkv_test::require_clean(chunked);
        CHECK(same_gradients(cut, whole));
        // Several chunks interleave dk/dv and dq: the call reports no split of their times (where
        // the one-chunk call does), which also says the chunks ran.
        if (split) CHECK(chunked.last_call().backward_dq_ms == 0);
        if (half) CHECK(same_gradients(chunked.sdpa_backward(h.backward()), whole_half));
        qkv_test::require_clean(chunked);
    }
    require_clean(gpu());
}

TEST_CASE("sdpa_backward on the device: the fused order at odd shapes (deterministic and chunked)", "[backward]") {
    // Without the mask's gradient a shuffle device (lavapipe) takes the fused order (dk/dv stores
    // dR, dq sums it: flash_bwd_plan::fused): causal with a window, GQA, sinks and a softcap, keys
    // fewer and more than a key block; the same bits twice, and cut into chunks of 8 row slots.
    const std::pair<std::size_t, std::size_t> shapes[] = {{1, 113}, {3, 17}, {17, 3}, {113, 113}};
    for (const auto& [L, S] : shapes) {
        const qkv::sdpa_shape s{
            .batch = 2, .q_heads = 4, .kv_heads = 2, .q_len = L, .kv_len = S, .d_qk = 16, .d_v = 16};
        owned o = make(
            s, {.causal = true, .alignment = qkv::causal_alignment::bottom_right, .window_left = 20, .softcap = 8.f},
            static_cast<std::uint32_t>(7 * L + S));
        std::mt19937 rng(static_cast<std::uint32_t>(L + S));
        o.sinks = normal(4, rng);
        save_forward(o);
        INFO("L " << L << ", S " << S);
        check_against_reference(o, 1e-9);
        check_repeatable_and_chunked(o);
    }
}

TEST_CASE("sdpa_backward on the device: deterministic, chunked, recomputed", "[backward]") {
    const qkv::sdpa_shape s{.batch = 2, .q_heads = 4, .kv_heads = 2, .q_len = 45, .kv_len = 53, .d_qk = 16, .d_v = 16};
    owned o = make(s, {.causal = true, .window_left = 20, .softcap = 8.f}, 41);
    std::mt19937 rng(42);
    o.sinks = normal(4, rng);
    o.additive = normal(45 * 53, rng);
    o.mask_shape = {45, 53};
    o.want_d_additive = true;
    save_forward(o);
    check_repeatable_and_chunked(o);
    const qkv::sdpa_gradients_f64 want = qkv::cpu::sdpa_backward_f64(o.backward());
    // A GPU's tiles (one row or key per invocation, K, V, Q and dO fetched by every lane, no
    // shuffles), planned as for a discrete GPU on this device.
    qkv::vulkan::device_info discrete = gpu().device();
    discrete.type = qkv::vulkan::device_type::discrete_gpu;
    qkv::vulkan::context as_gpu = qkv_test::make_context({.fused_tiles_as = discrete});
    const qkv::sdpa_gradients tiles = as_gpu.sdpa_backward(o.backward());
    qkv_test::require_clean(as_gpu);
    CHECK(nmse(tiles.dq, want.dq) <= 1e-9);
    CHECK(nmse(tiles.dk, want.dk) <= 1e-9);
    CHECK(nmse(tiles.dv, want.dv) <= 1e-9);
    CHECK(nmse(tiles.d_additive_mask, want.d_additive_mask) <= 1e-9);
    // Without out and lse the forward runs first: the same gradients.
    owned bare = o;
    bare.out.clear(), bare.lse.clear();
    const qkv::sdpa_gradients recomputed = gpu().sdpa_backward(bare.backward());
    require_clean(gpu());
    CHECK(nmse(recomputed.dq, want.dq) <= 1e-9);
    CHECK(nmse(recomputed.dk, want.dk) <= 1e-9);
}

TEST_CASE("sdpa_backward on the device: saved tensors and non-finite values", "[backward]") {
    const qkv::sdpa_shape s{.batch = 1, .q_heads = 2, .kv_heads = 1, .q_len = 11, .kv_len = 13, .d_qk = 16, .d_v = 16};
    owned o = make(s, {.causal = true}, 51);
    save_forward(o);
    // out and lse of another problem are refused, naming a row, as the CPU reference does.
    owned bad = o;
    bad.lse[3] += 0.5f;
    expect_throw_with([&] { (void)gpu().sdpa_backward(bad.backward()); },
                      {"row 3", "must be this problem's forward results"});
    bad = o;
    bad.out[5 * 16 + 2] += 10.f;
    expect_throw_with([&] { (void)gpu().sdpa_backward(bad.backward()); }, {"row 5", "rowsum(d_out * out)"});
    bad = o;
    bad.lse[0] = -std::numeric_limits<float>::infinity();
    expect_throw_with([&] { (void)gpu().sdpa_backward(bad.backward()); }, {"row 0", "-inf"});
    CHECK_THROWS_AS(gpu().sdpa_backward(bad.backward()), qkv::invalid_argument);
    require_clean(gpu());

    // A NaN the forward reads poisons what it reaches, exactly where the reference's does: a key's
    // value (the rows that attend it), a query (its row), a d_out element (its row's dq, the dk and
    // dv of the keys it attends; the others stay finite, masked keys get nothing).
    for (const int where : {0, 1, 2}) {
        const owned poisoned = poisoned_copy(o, where);
        INFO("poisoned input " << where);
        check_against_reference(poisoned, 1e-9);
    }
    // Finite inputs whose gradients leave float32's range: numeric_overflow, never inf or NaN.
    owned big = o;
    for (float& x : big.v) x *= 1e30f;
    for (float& x : big.d_out) x *= 1e20f;
    save_forward(big);
    expect_throw_with([&] { (void)gpu().sdpa_backward(big.backward()); }, {"not finite", "every input is finite"});
    CHECK_THROWS_AS(gpu().sdpa_backward(big.backward()), qkv::vulkan::numeric_overflow);
    require_clean(gpu());
}

TEST_CASE("dropout on the device: the forward's mask bit for bit, on both families", "[backward][dropout]") {
    // The weights with dropout are FlashAttention's return_attn_probs: a dropped weight negated. The
    // device's signs are the CPU's, bit for bit (qkv/dropout.hpp's mask), and the output follows.
    for (const auto family : {qkv::kernel_family::row_tiles, qkv::kernel_family::block_tiles})
        for (const std::size_t L : {1u, 17u}) {
            const std::size_t S = L == 1 ? 1500 : 45;
            const qkv::sdpa_shape s{
                .batch = 2, .q_heads = 2, .kv_heads = 1, .q_len = L, .kv_len = S, .d_qk = 40, .d_v = 24};
            owned o = make(s,
                           {.causal = L > 1,
                            .kernel = family,
                            .dropout_p = 0.3f,
                            .dropout_seed = 0xfeedfacecafebeefull,
                            .dropout_offset = 0xffffffffull},  // the counter's low word carries into the high one
                           static_cast<std::uint32_t>(L));
            qkv::sdpa_problem p = o.forward();
            p.options.return_weights = true;
            const qkv::sdpa_output_f64 want = qkv::cpu::sdpa_f64(p);
            const qkv::sdpa_output got = gpu().sdpa(p);
            require_clean(gpu());
            INFO("family " << (family == qkv::kernel_family::row_tiles ? "row_tiles" : "block_tiles") << ", L " << L);
            CHECK(nmse(got.output, want.output) <= 1e-9);
            CHECK(nmse(got.weights, want.weights) <= 1e-9);
            std::size_t dropped = 0, differ = 0;
            for (std::size_t n = 0; n < want.weights.size(); ++n) {
                dropped += std::signbit(want.weights[n]) ? 1u : 0u;
                differ += std::signbit(got.weights[n]) != std::signbit(want.weights[n]) ? 1u : 0u;
            }
            CHECK(differ == 0);
            CHECK(dropped > 0);
        }
}

TEST_CASE("sdpa_backward_call: over tensors, the host path's gradients bit for bit", "[backward][tensors]") {
    std::size_t n = 0;
    for (const owned& o : tensor_problems()) {
        INFO("problem " << n++ << ": L " << o.shape.q_len << ", S " << o.shape.kv_len);
        qkv::vulkan::sdpa_backward_call call(gpu(), description_of(o));
        device_tensors t(gpu(), o);
        call.run(t.view());
        const qkv::sdpa_gradients got = t.gradients();
        require_clean(gpu());
        check_gradients(got, o, 1e-9);
        // The same kernels as context::sdpa_backward: the same bits; and again, the same bits.
        CHECK(same_gradients(got, gpu().sdpa_backward(o.backward())));
        call.run(t.view());
        CHECK(same_gradients(got, t.gradients()));
        require_clean(gpu());
    }
}

TEST_CASE("sdpa_backward_call: in a sequence after the forward over the same tensors", "[backward][tensors]") {
    // The forward (sdpa_call, with its lse) writes out and lse; the backward reads them: one submit.
    // Dropout in both draws the same mask (the same seed and offset).
    for (const owned& o : tensor_problems()) {
        INFO("L " << o.shape.q_len << ", S " << o.shape.kv_len);
        owned bare = o;
        bare.out.clear(), bare.lse.clear();
        device_tensors t(gpu(), bare);
        qkv::sdpa_problem forward = description_of(o).forward;
        forward.options.return_lse = true;
        qkv::vulkan::sdpa_call f(gpu(), forward);
        qkv::vulkan::sdpa_backward_call b(gpu(), description_of(o));
        qkv::vulkan::sequence seq(gpu());
        seq.record(f, {.q = &t.q, .k = &t.k, .v = &t.v, .out = &t.out, .lse = &t.lse});
        seq.record(b, t.view());
        CHECK(seq.recorded() == 2);
        seq.run();
        require_clean(gpu());
        check_gradients(t.gradients(), bare, 1e-9);  // the reference's own forward (of the stored values)
    }
}

TEST_CASE("sdpa_backward_call: what it refuses, and its checks on the device", "[backward][tensors]") {
    const qkv::sdpa_shape s{.batch = 1, .q_heads = 2, .kv_heads = 1, .q_len = 11, .kv_len = 13, .d_qk = 16, .d_v = 16};
    std::mt19937 rng(71);
    owned o = make(s, {.causal = true}, 72);
    o.sinks = normal(2, rng);
    save_forward(o);
    const qkv::sdpa_backward_problem desc = description_of(o);
    // K and V of another type than Q's, or quantized, only from the host; data in the description.
    qkv::sdpa_backward_problem other = desc;
    other.forward.options.kv_type = qkv::element_type::f16;
    expect_throw_with([&] { qkv::vulkan::sdpa_backward_call c(gpu(), other); },
                      {"sdpa_backward_call", "kv_type", "context::sdpa_backward"});
    CHECK_THROWS_AS(qkv::vulkan::sdpa_backward_call(gpu(), o.backward()), qkv::invalid_argument);
    other = desc;
    other.d_out = o.d_out;
    expect_throw_with([&] { qkv::vulkan::sdpa_backward_call c(gpu(), other); }, {"d_out must be empty"});
    other = desc;
    other.return_d_additive_mask = true;
    CHECK_THROWS_AS(qkv::vulkan::sdpa_backward_call(gpu(), other), qkv::invalid_argument);

    qkv::vulkan::sdpa_backward_call call(gpu(), desc);
    device_tensors t(gpu(), o);
    // Tensors missing, of the wrong size or type, or one the description does not ask for.
    qkv::vulkan::sdpa_backward_tensors v = t.view();
    v.d_sinks = nullptr;
    expect_throw_with([&] { call.run(v); }, {"no d_sinks tensor"});
    v = t.view();
    v.d_additive_mask = &t.dq;
    expect_throw_with([&] { call.run(v); }, {"d_additive_mask", "return_d_additive_mask is not set"});
    v = t.view();
    v.dk = &t.dq;  // dq's shape
    CHECK_THROWS_AS(call.run(v), qkv::invalid_argument);
    // Nothing in place: a gradient over an input, or over another gradient.
    v = t.view();
    v.dq = &t.q;
    expect_throw_with([&] { call.run(v); }, {"the q and dq tensors overlap"});
    v = t.view();
    v.dv = &t.dk;  // (1, 1, 13, 16) both
    expect_throw_with([&] { call.run(v); }, {"the dk and dv tensors overlap"});
    if (gpu().device().fp16_storage) {
        qkv::vulkan::tensor half(gpu(), {1, 2, 11, 16}, qkv::element_type::f16);
        v = t.view();
        v.q = &half;
        CHECK_THROWS_AS(call.run(v), qkv::invalid_argument);
    }
    // Saved tensors that are not the forward's: refused after the run, naming the row.
    std::vector<float> lse = o.lse;
    lse[3] += 0.5f;
    t.lse.upload(lse);
    expect_throw_with([&] { call.run(t.view()); }, {"row 3", "must be this problem's forward results"});
    t.lse.upload(o.lse);
    // Finite inputs whose gradients leave float32's range: numeric_overflow, never inf or NaN.
    owned big = o;
    for (float& x : big.v) x *= 1e30f;
    for (float& x : big.d_out) x *= 1e20f;
    save_forward(big);
    device_tensors tb(gpu(), big);
    expect_throw_with([&] { call.run(tb.view()); }, {"not finite", "every input is finite"});
    CHECK_THROWS_AS(call.run(tb.view()), qkv::vulkan::numeric_overflow);
    // Scores beyond float32: the overflow rule, as on the host path.
    owned huge = o;
    for (float& x : huge.q) x *= 1e20f;
    for (float& x : huge.k) x *= 1e20f;
    device_tensors th(gpu(), huge);
    CHECK_THROWS_AS(call.run(th.view()), qkv::vulkan::numeric_overflow);
    // A NaN in d_out: its gradients NaN where the reference's are, no error.
    owned poisoned = o;
    poisoned.d_out[6 * 16 + 5] = std::numeric_limits<float>::quiet_NaN();
    device_tensors tp(gpu(), poisoned);
    call.run(tp.view());
    check_gradients(tp.gradients(), poisoned, 1e-9);
    // And the call is as good as new after each refusal.
    call.run(t.view());
    check_gradients(t.gradients(), o, 1e-9);
    require_clean(gpu());
    qkv::vulkan::sdpa_backward_call moved = std::move(call);
    CHECK_THROWS_AS(call.run(t.view()), qkv::error);  // NOLINT(bugprone-use-after-move): the test
}

TEST_CASE("sdpa_backward on the device: ALiBi from rows beyond the keys, huge softcaps, and the limit", "[backward]") {
    std::mt19937 rng(71);
    // Rows past every key (positions 12..28 over keys 0..8) and before them (-20..-4), with sinks:
    // the kernels' scores are relative to each row's nearest key, so lse' and the sink are raised
    // by slope·distance (up to 0.5·20 = 10) to meet them. The second with a softcap above 2^126,
    // whose 1/C only the host's two normal factors hold.
    const qkv::sdpa_shape s{.batch = 1, .q_heads = 2, .kv_heads = 1, .q_len = 17, .kv_len = 9, .d_qk = 16, .d_v = 8};
    for (const auto& [off, cap] : {std::pair{std::int64_t{12}, 0.f}, std::pair{std::int64_t{-20}, 3e38f}}) {
        INFO("position_offset " << off << ", softcap " << cap);
        owned o = make(s, {.softcap = cap, .position_offset = off}, 72);
        o.slopes = {0.5f, 0.25f};
        o.sinks = normal(2, rng);
        save_forward(o);
        check_against_reference(o, 1e-9);
    }
    // A drop beyond 16 (slope 1, rows 20 before the keys): the float32 lse has lost the precision
    // the probabilities need, so the plan refuses it, naming the option.
    owned far = make(s, {.position_offset = -20}, 73);
    far.slopes = {1.f, 0.25f};
    save_forward(far);
    expect_throw_with([&] { (void)gpu().sdpa_backward(far.backward()); }, {"ALiBi", "alibi_slopes", "position_offset"});
    CHECK_THROWS_AS(gpu().sdpa_backward(far.backward()), qkv::vulkan::limit_exceeded);
    require_clean(gpu());
}

TEST_CASE("sdpa_backward on the device: dk and dv by the cooperative-matrix kernel", "[coop_backward]") {
    // Run with QKV_BACKWARD_COOP=1 (tests/CMakeLists.txt: qkv_sdpa_backward_coopmat) on a device the
    // family runs on; elsewhere there is nothing to run.
    const char* asked = std::getenv("QKV_BACKWARD_COOP");
    if (!asked || std::string(asked) != "1" || !qkv_test::coopmat_runs(gpu().device())) {
        WARN("QKV_BACKWARD_COOP=1 on a device with the cooperative-matrix family is needed");
        return;
    }
    struct shaped {
        qkv::sdpa_shape s;
        qkv::sdpa_options options;
    };
    const shaped cases[] = {
        {{.batch = 1, .q_heads = 4, .kv_heads = 2, .q_len = 17, .kv_len = 113, .d_qk = 64, .d_v = 64},
         {.causal = true, .precision = qkv::precision::fp16}},
        {{.batch = 2, .q_heads = 3, .kv_heads = 1, .q_len = 1, .kv_len = 3, .d_qk = 17, .d_v = 3},
         {.precision = qkv::precision::fp16}},
        {{.batch = 1, .q_heads = 2, .kv_heads = 2, .q_len = 113, .kv_len = 17, .d_qk = 80, .d_v = 48},
         {.causal = true, .precision = qkv::precision::fp16, .softcap = 20.f}},
    };
    std::uint32_t seed = 90;
    for (const auto& [s, options] : cases) {
        INFO("L = " << s.q_len << ", S = " << s.kv_len << ", d = " << s.d_qk << " / " << s.d_v);
        owned o = make(s, options, seed++);
        save_forward(o);
        const owned r = rounded_to_half(o);
        const qkv::sdpa_gradients_f64 want = qkv::cpu::sdpa_backward_f64(r.backward());
        const qkv::sdpa_gradients got = gpu().sdpa_backward(o.backward());
        require_clean(gpu());
        // dq, dk and dv from float16 P and dS with float32 sums, as FlashAttention-2's fp16
        // backward: float16's unit roundoff 2^-11 gives an nmse near 1e-7, bounded here by 1e-5;
        // and above 1e-12, which the float32 kernels stay below, so that this case fails if the
        // cooperative-matrix kernels did not run.
        const double dq = nmse(got.dq, want.dq), dk = nmse(got.dk, want.dk), dv = nmse(got.dv, want.dv);
        INFO("nmse dq " << dq << ", dk " << dk << ", dv " << dv);
        CHECK(dq <= 1e-5);
        CHECK(dk <= 1e-5);
        CHECK(dv <= 1e-5);
        CHECK(dq > 1e-12);
        CHECK(dk + dv > 1e-12);
        // Deterministic: the same bits again.
        CHECK(same_gradients(got, gpu().sdpa_backward(o.backward())));
    }
}

TEST_CASE("sdpa_backward on the device: the cooperative-matrix dk/dv with every rule, chunked and poisoned",
          "[coop_backward]") {
    const char* asked = std::getenv("QKV_BACKWARD_COOP");
    if (!asked || std::string(asked) != "1" || !qkv_test::coopmat_runs(gpu().device())) {
        WARN("QKV_BACKWARD_COOP=1 on a device with the cooperative-matrix family is needed");
        return;
    }
    const auto check_coop = [](const qkv::sdpa_gradients& got, const owned& o) {
        const qkv::sdpa_gradients_f64 want = qkv::cpu::sdpa_backward_f64(rounded_to_half(o).backward());
        CHECK(nmse(got.dq, want.dq) <= 1e-5);
        CHECK(nmse(got.dk, want.dk) <= 1e-5);
        CHECK(nmse(got.dv, want.dv) <= 1e-5);
        REQUIRE(got.d_sinks.size() == want.d_sinks.size());
        if (!want.d_sinks.empty()) CHECK(nmse(got.d_sinks, want.d_sinks) <= 1e-9);
    };
    // GQA, causal bottom-right, a window, softcap, ALiBi, sinks and an additive mask (no gradient).
    const qkv::sdpa_shape s{.batch = 2, .q_heads = 4, .kv_heads = 2, .q_len = 45, .kv_len = 53, .d_qk = 16, .d_v = 24};
    owned o = make(s,
                   {.causal = true,
                    .alignment = qkv::causal_alignment::bottom_right,
                    .precision = qkv::precision::fp16,
                    .window_left = 20,
                    .softcap = 8.f,
                    .alibi_max_bias = 4.f},
                   41);
    std::mt19937 rng(42);
    o.sinks = normal(4, rng);
    o.additive = normal(45 * 53, rng);
    o.mask_shape = {45, 53};
    save_forward(o);
    const qkv::sdpa_gradients whole = gpu().sdpa_backward(o.backward());
    require_clean(gpu());
    check_coop(whole, o);
    // Row slots cut into chunks of 8 (lavapipe's loop limit at small sizes): each dispatch resumes
    // from dk and dv as the last left them, the same bits.
    qkv::vulkan::context chunked = qkv_test::make_context({.max_fused_keys_per_dispatch = 8});
    const qkv::sdpa_gradients cut = chunked.sdpa_backward(o.backward());
    qkv_test::require_clean(chunked);
    check_coop(cut, o);
    CHECK(same_bits(cut.dq, whole.dq));
    CHECK(same_bits(cut.dk, whole.dk));
    CHECK(same_bits(cut.dv, whole.dv));
    // A NaN poisons what it reaches, as in the reference: a key's value, a query (its head runs on
    // the scalar kernel's careful pipeline), an infinite d_out element.
    const qkv::sdpa_shape small{
        .batch = 1, .q_heads = 2, .kv_heads = 1, .q_len = 11, .kv_len = 13, .d_qk = 16, .d_v = 16};
    const owned base = make(small, {.causal = true, .precision = qkv::precision::fp16}, 51);
    for (const int where : {0, 1, 2}) {
        const owned poisoned = poisoned_copy(base, where);
        INFO("poisoned input " << where);
        const qkv::sdpa_gradients got = gpu().sdpa_backward(poisoned.backward());
        require_clean(gpu());
        check_coop(got, poisoned);
    }
    // The saved tensors' check runs in the cooperative-matrix dq: another problem's lse is refused,
    // naming its row, in one dispatch and in chunks of keys.
    owned bad = base;
    save_forward(bad);
    bad.lse[3] += 0.5f;
    expect_throw_with([&] { (void)gpu().sdpa_backward(bad.backward()); }, {"row 3"});
    expect_throw_with([&] { (void)chunked.sdpa_backward(bad.backward()); }, {"row 3"});
    require_clean(gpu());
    // What the family's backward refuses, naming why: float32 storage, the mask's gradient.
    owned fp32 = base;
    fp32.options.precision = qkv::precision::fp32;
    save_forward(fp32);
    expect_throw_with([&] { (void)gpu().sdpa_backward(fp32.backward()); }, {"precision fp16"});
    owned d_mask = o;
    d_mask.want_d_additive = true;
    expect_throw_with([&] { (void)gpu().sdpa_backward(d_mask.backward()); }, {"additive mask's gradient"});
}

TEST_CASE("sdpa_backward with kernel coopmat: FlashAttention's tolerance rule for fp16 gradients", "[coop_backward]") {
    // The cooperative-matrix kernels (float16 P and dS into float32 sums): within twice a float16
    // computation's error, as FlashAttention's own backward.
    if (!qkv_test::coopmat_runs(gpu().device())) {
        WARN("a device with the cooperative-matrix family is needed");
        return;
    }
    for (const owned& o : flash_attention_rule_problems(qkv::kernel_family::coopmat)) {
        INFO("L = " << o.shape.q_len << ", S = " << o.shape.kv_len << ", d = " << o.shape.d_qk << " / " << o.shape.d_v);
        // float16 P and dS: the matrix kernels ran (the float32 ones stay below 1e-12).
        CHECK(check_flash_attention_rule(gpu(), o) > 1e-12);
    }
}

TEST_CASE("sdpa_backward with kernel coopmat: the cooperative-matrix kernels, host and tensors", "[coop_backward]") {
    const qkv::sdpa_shape s{.batch = 1, .q_heads = 4, .kv_heads = 2, .q_len = 37, .kv_len = 41, .d_qk = 64, .d_v = 64};
    owned o = make(s, {.causal = true, .precision = qkv::precision::fp16, .kernel = qkv::kernel_family::coopmat}, 77);
    o.sinks = {0.5f, -1.f, 0.25f, 2.f};
    save_forward(o);
    if (!qkv_test::coopmat_runs(gpu().device())) {
        // Refused, naming why, where the family does not run: never another kernel in secret.
        CHECK_THROWS_AS(gpu().sdpa_backward(o.backward()), qkv::vulkan::unavailable);
        return;
    }
    const qkv::sdpa_gradients host = gpu().sdpa_backward(o.backward());
    require_clean(gpu());
    const qkv::sdpa_gradients_f64 want = qkv::cpu::sdpa_backward_f64(rounded_to_half(o).backward());
    const double dq = nmse(host.dq, want.dq), dk = nmse(host.dk, want.dk), dv = nmse(host.dv, want.dv);
    INFO("nmse dq " << dq << ", dk " << dk << ", dv " << dv);
    CHECK(dq <= 1e-5);
    CHECK(dk <= 1e-5);
    CHECK(dv <= 1e-5);
    CHECK(dq > 1e-12);  // float16 P and dS: the matrix kernels ran
    CHECK(nmse(host.d_sinks, want.d_sinks) <= 1e-9);
    // Over tensors: the same kernels, the same bits.
    qkv::vulkan::sdpa_backward_call call(gpu(), description_of(o));
    device_tensors t(gpu(), o);
    call.run(t.view());
    CHECK(same_gradients(t.gradients(), host));
    require_clean(gpu());
}
