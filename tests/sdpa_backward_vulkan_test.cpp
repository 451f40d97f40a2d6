// The backward pass on the device (context::sdpa_backward, kernels/flash_backward.hpp) against the
// float64 CPU reference (qkv::cpu::sdpa_backward_f64), which is tested against torch.autograd
// (tests/sdpa_backward_test.cpp): odd shapes, every option alone and together, both causal
// alignments, GQA, fp16 storage, the saved tensors' check, the non-finite rules, determinism,
// key and row chunks, and dropout's mask bit for bit against the CPU's.
#include <qkv/runtime/cpu.hpp>
#include <qkv/vulkan/context.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "support/catch.hpp"
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
    std::vector<float> q, k, v, d_out, additive, sinks, out, lse;
    std::vector<std::uint8_t> mask;
    std::vector<std::size_t> mask_shape;
    bool want_d_additive = false;

    [[nodiscard]] qkv::sdpa_problem forward() const {
        qkv::sdpa_problem p{.shape = shape, .q = q, .k = k, .v = v, .options = options};
        p.mask = mask, p.additive_mask = additive, p.mask_shape = mask_shape, p.sinks = sinks;
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
