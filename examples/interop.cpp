// qkv inside an application that owns its Vulkan device (README, "Inside your own Vulkan
// application"): the application creates its instance and device through the loader (volk), its
// buffers, and a compute shader that writes Q, K and V; qkv's attention is recorded into the
// application's command buffer between that shader and another of the application's, which
// consumes the output; one submit. The result is checked against the float64 CPU backend, and the
// validation layer (with synchronisation validation) must say nothing. Exit 0 only if both hold.
#include <qkv/vulkan/interop.hpp>
#include <qkv/vulkan/runtime.hpp>

#include <cmath>
#include <cstdio>
#include <exception>
#include <vector>

#include "app_values.hpp"
#include "vulkan_app.hpp"

extern "C" const std::uint32_t qkv_spv_app_fill_qkv[];
extern "C" const std::size_t qkv_spv_app_fill_qkv_words;
extern "C" const std::uint32_t qkv_spv_app_consume[];
extern "C" const std::size_t qkv_spv_app_consume_words;

int main() try {
    app::vulkan_app a;  // the application's own instance, device, queue

    // qkv on the application's device: it checks what the device was created with.
    qkv::vulkan::context ctx = qkv::vulkan::make_context({.instance = a.instance,
                                                          .physical_device = a.physical,
                                                          .device = a.device,
                                                          .queue_family = a.family,
                                                          .queue = a.queue,
                                                          .get_instance_proc_addr = vkGetInstanceProcAddr,
                                                          .create_info = &a.device_info});

    // The problem: 8 query heads over 2 K/V heads, 5 new queries against 300 keys, causal.
    constexpr std::size_t Hq = 8, Hkv = 2, L = 5, S = 300, E = 64, Ev = 64;
    constexpr std::size_t nq = Hq * L * E, nk = Hkv * S * E, nv = Hkv * S * Ev, no = Hq * L * Ev;
    // The application's buffers: Q, K and V in one, at offsets of its choosing; the output; its result.
    constexpr std::size_t q_off = 16, k_off = q_off + nq + 4, v_off = k_off + nk + 4;  // elements
    app::buffer qkv = a.make_buffer((v_off + nv) * 4), out = a.make_buffer(no * 4), result = a.make_buffer(no * 4);
    qkv::vulkan::tensor q = qkv::vulkan::wrap(ctx, qkv.handle, q_off * 4, nq * 4, {1, Hq, L, E});
    qkv::vulkan::tensor k = qkv::vulkan::wrap(ctx, qkv.handle, k_off * 4, nk * 4, {1, Hkv, S, E});
    qkv::vulkan::tensor v = qkv::vulkan::wrap(ctx, qkv.handle, v_off * 4, nv * 4, {1, Hkv, S, Ev});
    qkv::vulkan::tensor o = qkv::vulkan::wrap(ctx, out.handle, 0, no * 4, {1, Hq, L, Ev});

    qkv::sdpa_problem description;
    description.shape = {.batch = 1, .q_heads = Hq, .kv_heads = Hkv, .q_len = L, .kv_len = S, .d_qk = E, .d_v = Ev};
    description.options.causal = true;
    description.options.alignment = qkv::causal_alignment::bottom_right;
    qkv::vulkan::sdpa_call call(ctx, description);  // planned once

    const std::size_t fill = a.make_pipeline({qkv_spv_app_fill_qkv, qkv_spv_app_fill_qkv_words}, 3, 7 * 4);
    const std::size_t consume = a.make_pipeline({qkv_spv_app_consume, qkv_spv_app_consume_words}, 2, 2 * 4);

    // One command buffer: the application's producer, qkv's attention, the application's consumer.
    VkCommandBuffer cmd = a.begin();
    const std::uint32_t fill_push[7] = {nq, nk, nv, q_off, k_off, v_off, 0};
    const VkBuffer three[] = {qkv.handle, qkv.handle, qkv.handle};
    a.dispatch(cmd, fill, three, fill_push, sizeof fill_push, (nk + 63) / 64);
    qkv::vulkan::recording r = qkv::vulkan::record(call, cmd, {.q = &q, .k = &k, .v = &v, .out = &o});
    app::vulkan_app::compute_barrier(cmd);  // qkv's output written by compute shaders: then read
    const std::uint32_t consume_push[2] = {no, 0};
    const VkBuffer two[] = {out.handle, result.handle};
    a.dispatch(cmd, consume, two, consume_push, sizeof consume_push, (no + 63) / 64);
    app::vulkan_app::host_barrier(cmd);
    a.submit_and_wait(cmd);
    r.check();  // numeric_overflow if the device had found the inputs beyond float32

    // The float64 CPU backend on the same values.
    const std::vector<float> hq = app::hashed_values(nq, 0, 0), hk = app::hashed_values(nk, 1, 0),
                             hv = app::hashed_values(nv, 2, 0);
    qkv::sdpa_problem host = description;
    host.q = hq, host.k = hk, host.v = hv;
    const std::vector<double> want = qkv::cpu::sdpa_f64(host).output;
    double num = 0, den = 0;
    bool finite = true;
    for (std::size_t i = 0; i < no; ++i) {
        const double got = result.data<float>()[i], ref = 2.0 * want[i] + 1.0;
        finite = finite && std::isfinite(got);
        num += (got - ref) * (got - ref);
        den += ref * ref;
    }
    const double nmse = num / den;
    const std::size_t messages = a.log.count();
    std::printf(
        "qkv inside the application's Vulkan device (%s): %zu x %zu attention recorded between two of its "
        "dispatches, one submit\n",
        ctx.device().name.c_str(), L, S);
    std::printf("  normalised MSE against the float64 CPU backend: %.3g (bound 1e-10)\n", nmse);
    std::printf("  validation messages (synchronisation validation on): %zu\n", messages);
    return finite && nmse <= 1e-10 && messages == 0 ? 0 : 1;
} catch (const std::exception& e) {
    std::fprintf(stderr, "interop example: %s\n", e.what());
    return 1;
}
