// What a user writes: the compile-time core, the CPU backend (qkv::runtime) and, when qkv was built
// with it, the Vulkan backend.
#include <qkv/qkv.hpp>
#include <qkv/runtime/cpu.hpp>
#include <qkv/runtime/sdpa.hpp>
#ifdef QKV_CONSUMER_VULKAN
#include <qkv/vulkan/runtime.hpp>
#endif

#include <cmath>
#include <cstdio>
#include <vector>

constexpr auto x = qkv::matrix_of<float>({{1, 0, 1, 0}, {0, 2, 0, 2}, {1, 1, 1, 1}});
constexpr auto wk = qkv::matrix_of<float>({{0, 0, 1}, {1, 1, 0}, {0, 1, 0}, {1, 1, 0}});
constexpr auto wq = qkv::matrix_of<float>({{1, 0, 1}, {1, 0, 0}, {0, 0, 1}, {0, 1, 1}});
constexpr auto wv = qkv::matrix_of<float>({{0, 2, 0}, {0, 3, 0}, {1, 0, 3}, {1, 1, 0}});
constexpr auto expected =
    qkv::matrix_of<float>({{1.9366f, 6.6831f, 1.5951f}, {2.0f, 7.9640f, 0.0540f}, {2.0f, 7.7599f, 0.3584f}});
static_assert(qkv::approx_equal(qkv::self_attention(x, wq, wk, wv, {.scale = 1.f}).output, expected, 1e-3f));
// The gradients of the tutorial's attention for d_out = identity, by the compiler.
constexpr auto tutorial = qkv::self_attention(x, wq, wk, wv, {.scale = 1.f});
constexpr auto d_out = qkv::matrix_of<float>({{1, 0, 0}, {0, 1, 0}, {0, 0, 1}});
constexpr auto grads = qkv::sdpa_backward(
    tutorial.queries, tutorial.keys, tutorial.values,
    qkv::scaled_dot_product_attention(tutorial.queries, tutorial.keys, tutorial.values, {.scale = 1.f}), d_out,
    {.scale = 1.f});

int main() {
    const std::vector<float> xs{1, 0, 1, 0, 0, 2, 0, 2, 1, 1, 1, 1};
    const std::vector<float> wks{0, 0, 1, 1, 1, 0, 0, 1, 0, 1, 1, 0}, wqs{1, 0, 1, 1, 0, 0, 0, 0, 1, 0, 1, 1},
        wvs{0, 2, 0, 0, 3, 0, 1, 0, 3, 1, 1, 0};
    const qkv::attention_problem p{.shape = {.seq = 3, .d_in = 4, .d_k = 3, .d_v = 3},
                                   .x = xs,
                                   .wq = wqs,
                                   .wk = wks,
                                   .wv = wvs,
                                   .options = {.scale = 1.f}};
    const auto cpu = qkv::cpu::attention(p);
    // The same attention through SDPA: q = x·Wq, k = x·Wk, v = x·Wv of the tutorial.
    const std::vector<float> q{1, 0, 2, 2, 2, 2, 2, 1, 3}, k{0, 1, 1, 4, 4, 0, 2, 3, 1}, v{1, 2, 3, 2, 8, 0, 2, 6, 3};
    qkv::sdpa_problem sp;
    sp.shape = {.q_len = 3, .kv_len = 3, .d_qk = 3, .d_v = 3};
    sp.q = q, sp.k = k, sp.v = v;
    sp.options.scale = 1.f;
    const auto sdpa = qkv::cpu::sdpa(sp);
    for (std::size_t i = 0; i < cpu.output.size(); ++i)
        if (std::abs(sdpa.output[i] - cpu.output[i]) > 1e-5f) return 1;
    // The same gradients from the CPU backend's float64 reference.
    const std::vector<float> d_outs{1, 0, 0, 0, 1, 0, 0, 0, 1};
    const qkv::sdpa_gradients g = qkv::cpu::sdpa_backward({.forward = sp, .d_out = d_outs});
    for (std::size_t i = 0; i < 3; ++i)
        for (std::size_t c = 0; c < 3; ++c)
            if (std::abs(g.dq[i * 3 + c] - grads.dq(i, c)) > 1e-4f ||
                std::abs(g.dk[i * 3 + c] - grads.dk(i, c)) > 1e-4f ||
                std::abs(g.dv[i * 3 + c] - grads.dv(i, c)) > 1e-4f)
                return 1;
#ifdef QKV_CONSUMER_VULKAN
    try {
        qkv::vulkan::context ctx;
        const auto gpu = ctx.attention(p);
        for (std::size_t i = 0; i < gpu.output.size(); ++i)
            if (std::abs(gpu.output[i] - cpu.output[i]) > 1e-5f) return 1;
        std::printf("consumer: output[0] = %.4f on %s\n", gpu.output[0], ctx.device().name.c_str());
    } catch (const qkv::vulkan::unavailable& e) {
        std::printf("consumer: no Vulkan (%s); CPU output[0] = %.4f\n", e.what(), cpu.output[0]);
    }
#else
    std::printf("consumer: qkv::runtime only; CPU output[0] = %.4f, sdpa %.4f\n", cpu.output[0], sdpa.output[0]);
#endif
    return std::abs(cpu.output[0] - 1.9366f) < 1e-3f ? 0 : 1;
}
