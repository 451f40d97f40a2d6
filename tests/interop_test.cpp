// qkv on an application's own Vulkan device (qkv/vulkan/interop.hpp), through the application's
// own instance, device and buffers (examples/vulkan_app.hpp, volk): tensors over its buffers at
// odd offsets, fp16 tensors, a decode loop that appends to a cache over its memory and decodes in
// the same command buffer, several recordings in flight at once, and a device that lacks what a
// call needs. Its validation layer, with synchronisation validation, must say nothing.
#include <qkv/vulkan/interop.hpp>
#include <qkv/vulkan/runtime.hpp>
#include <qkv/vulkan/testing.hpp>

#include <cmath>
#include <random>
#include <vector>

#include "app_values.hpp"
#include "support/catch.hpp"
#include "vulkan_app.hpp"

namespace {

std::vector<float> normal(std::size_t n, std::mt19937_64& rng) {
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<float> v(n);
    for (float& x : v) x = d(rng);
    return v;
}

double nmse(const float* got, const std::vector<double>& want) {
    double num = 0, den = 0;
    for (std::size_t i = 0; i < want.size(); ++i) {
        REQUIRE(std::isfinite(got[i]));
        num += (got[i] - want[i]) * (got[i] - want[i]);
        den += want[i] * want[i];
    }
    return num / den;
}

qkv::vulkan::context context_on(app::vulkan_app& a) {
    return qkv::vulkan::testing::make_context({.instance = a.instance,
                                               .physical_device = a.physical,
                                               .device = a.device,
                                               .queue_family = a.family,
                                               .queue = a.queue,
                                               .get_instance_proc_addr = vkGetInstanceProcAddr,
                                               .create_info = &a.device_info},
                                              {}, {.poison_new_memory = true});  // no test passes on zeroed memory
}

/// Writes host values into an application buffer at an element offset (its memory is mapped).
void put(app::buffer& b, std::size_t at, const std::vector<float>& v) {
    for (std::size_t i = 0; i < v.size(); ++i) b.data<float>()[at + i] = v[i];
}

}  // namespace

TEST_CASE("interop: tensors over the application's buffers at odd offsets, fp32 and fp16", "[interop]") {
    app::vulkan_app a;
    qkv::vulkan::context ctx = context_on(a);
    std::mt19937_64 rng(3);
    constexpr std::size_t Hq = 4, Hkv = 2, L = 3, S = 113, E = 16, Ev = 8;
    constexpr std::size_t nq = Hq * L * E, nk = Hkv * S * E, nv = Hkv * S * Ev, no = Hq * L * Ev;
    const std::vector<float> q = normal(nq, rng), k = normal(nk, rng), v = normal(nv, rng);
    qkv::sdpa_problem desc;
    desc.shape = {.batch = 1, .q_heads = Hq, .kv_heads = Hkv, .q_len = L, .kv_len = S, .d_qk = E, .d_v = Ev};
    qkv::sdpa_problem host = desc;
    host.q = q, host.k = k, host.v = v;
    const std::vector<double> want = qkv::cpu::sdpa_f64(host).output;
    // One buffer, each tensor at an odd element offset (none on the storage offset alignment).
    constexpr std::size_t q_at = 1, k_at = q_at + nq + 3, v_at = k_at + nk + 5, o_at = 7;
    app::buffer in = a.make_buffer((v_at + nv) * 4), out = a.make_buffer((o_at + no + 3) * 4);
    // Vulkan memory starts with any contents: a sentinel on both sides of the output shows a stray write.
    constexpr float sentinel = 1234.5f;
    const auto fence_output = [&] {
        for (std::size_t i = 0; i < o_at + no + 3; ++i) out.data<float>()[i] = sentinel;
    };
    const auto output_fenced = [&] {
        for (std::size_t i = 0; i < o_at; ++i)
            if (out.data<float>()[i] != sentinel) return false;
        for (std::size_t i = o_at + no; i < o_at + no + 3; ++i)
            if (out.data<float>()[i] != sentinel) return false;
        return true;
    };
    put(in, q_at, q), put(in, k_at, k), put(in, v_at, v);
    qkv::vulkan::tensor tq = qkv::vulkan::wrap(ctx, in.handle, q_at * 4, nq * 4, {1, Hq, L, E});
    qkv::vulkan::tensor tk = qkv::vulkan::wrap(ctx, in.handle, k_at * 4, nk * 4, {1, Hkv, S, E});
    qkv::vulkan::tensor tv = qkv::vulkan::wrap(ctx, in.handle, v_at * 4, nv * 4, {1, Hkv, S, Ev});
    qkv::vulkan::tensor to = qkv::vulkan::wrap(ctx, out.handle, o_at * 4, no * 4, {1, Hq, L, Ev});
    CHECK(to.wraps_caller_memory());
    CHECK(qkv::vulkan::buffer_of(to) == out.handle);
    CHECK(qkv::vulkan::offset_of(to) == o_at * 4);
    for (const auto family : {qkv::kernel_family::row_tiles, qkv::kernel_family::block_tiles}) {
        desc.options.kernel = family;
        qkv::vulkan::sdpa_call call(ctx, desc);
        fence_output();
        VkCommandBuffer cmd = a.begin();
        qkv::vulkan::recording r = qkv::vulkan::record(call, cmd, {.q = &tq, .k = &tk, .v = &tv, .out = &to});
        app::vulkan_app::host_barrier(cmd);
        a.submit_and_wait(cmd);
        r.check();
        CHECK(nmse(out.data<float>() + o_at, want) <= 1e-10);
        CHECK(output_fenced());  // nothing written outside the tensor
    }
    // The host calls over wrapped tensors go through the application's queue.
    CHECK(tq.download() == q);
    // fp16: tensors of float16 in the application's buffer (upload rounds them).
    if (a.fp16_enabled()) {
        desc.options.kernel = qkv::kernel_family::automatic;
        desc.options.precision = qkv::precision::fp16;
        app::buffer half = a.make_buffer((nq + nk + nv + 8) * 2);
        qkv::vulkan::tensor hq = qkv::vulkan::wrap(ctx, half.handle, 2, nq * 2, {1, Hq, L, E}, qkv::element_type::f16);
        qkv::vulkan::tensor hk =
            qkv::vulkan::wrap(ctx, half.handle, 2 + nq * 2 + 4, nk * 2, {1, Hkv, S, E}, qkv::element_type::f16);
        qkv::vulkan::tensor hv = qkv::vulkan::wrap(ctx, half.handle, 2 + nq * 2 + 4 + nk * 2 + 2, nv * 2,
                                                   {1, Hkv, S, Ev}, qkv::element_type::f16);
        hq.upload(q), hk.upload(k), hv.upload(v);
        qkv::sdpa_problem rounded = desc;
        const std::vector<float> rq = hq.download(), rk = hk.download(), rv = hv.download();
        rounded.q = rq, rounded.k = rk, rounded.v = rv;
        qkv::vulkan::sdpa_call call(ctx, desc);
        fence_output();
        VkCommandBuffer cmd = a.begin();
        qkv::vulkan::recording r = qkv::vulkan::record(call, cmd, {.q = &hq, .k = &hk, .v = &hv, .out = &to});
        app::vulkan_app::host_barrier(cmd);
        a.submit_and_wait(cmd);
        r.check();
        CHECK(nmse(out.data<float>() + o_at, qkv::cpu::sdpa_f64(rounded).output) <= 1e-10);
        CHECK(output_fenced());
    }
    CHECK(a.log.count() == 0);
}

TEST_CASE("interop: a decode loop appends to a cache over the application's memory and decodes, one submit",
          "[interop][cache]") {
    app::vulkan_app a;
    qkv::vulkan::context ctx = context_on(a);
    constexpr std::size_t Hq = 8, Hkv = 2, E = 32, Ev = 32, capacity = 1200, first = 1100, steps = 4;
    constexpr std::size_t e4 = E / 4;
    // The cache's storage in the application's buffer, at a texel-aligned offset.
    constexpr std::size_t k_bytes = Hkv * capacity * e4 * 16, v_bytes = Hkv * capacity * (Ev / 4) * 16;
    app::buffer storage = a.make_buffer(256 + k_bytes + 256 + v_bytes);
    qkv::vulkan::kv_cache cache(
        ctx, {.batch = 1, .kv_heads = Hkv, .capacity = capacity, .d_qk = E, .d_v = Ev},
        qkv::vulkan::wrap(ctx, storage.handle, 256, k_bytes, {1, Hkv, capacity, E}),
        qkv::vulkan::wrap(ctx, storage.handle, 256 + k_bytes + 256, v_bytes, {1, Hkv, capacity, Ev}));
    std::mt19937_64 rng(11);
    std::vector<float> all_k = normal(Hkv * first * E, rng), all_v = normal(Hkv * first * Ev, rng);
    cache.append(all_k, all_v, first);  // the prompt, from the host
    qkv::sdpa_problem desc;
    desc.shape = {.batch = 1, .q_heads = Hq, .kv_heads = Hkv, .q_len = 1, .kv_len = 0, .d_qk = E, .d_v = Ev};
    qkv::vulkan::sdpa_call decode(ctx, desc, cache);
    // Per step: a new key/value row and a query in the application's memory, an output of its own.
    app::buffer step_kv = a.make_buffer(steps * Hkv * (E + Ev) * 4), queries = a.make_buffer(steps * Hq * E * 4),
                outs = a.make_buffer(steps * Hq * Ev * 4);
    std::vector<std::vector<float>> ks, vs, qs;
    std::vector<qkv::vulkan::tensor> tk, tv, tq, to;
    for (std::size_t t = 0; t < steps; ++t) {
        ks.push_back(normal(Hkv * E, rng)), vs.push_back(normal(Hkv * Ev, rng)), qs.push_back(normal(Hq * E, rng));
        const std::size_t kv_at = t * Hkv * (E + Ev);
        put(step_kv, kv_at, ks[t]), put(step_kv, kv_at + Hkv * E, vs[t]), put(queries, t * Hq * E, qs[t]);
        tk.push_back(qkv::vulkan::wrap(ctx, step_kv.handle, kv_at * 4, Hkv * E * 4, {1, Hkv, 1, E}));
        tv.push_back(qkv::vulkan::wrap(ctx, step_kv.handle, (kv_at + Hkv * E) * 4, Hkv * Ev * 4, {1, Hkv, 1, Ev}));
        tq.push_back(qkv::vulkan::wrap(ctx, queries.handle, t * Hq * E * 4, Hq * E * 4, {1, Hq, 1, E}));
        to.push_back(qkv::vulkan::wrap(ctx, outs.handle, t * Hq * Ev * 4, Hq * Ev * 4, {1, Hq, 1, Ev}));
    }
    // Every step appended and decoded in one command buffer: qkv's recordings order themselves.
    VkCommandBuffer cmd = a.begin();
    std::vector<qkv::vulkan::recording> recs;
    for (std::size_t t = 0; t < steps; ++t) {
        recs.push_back(qkv::vulkan::record_append(cache, cmd, tk[t], tv[t], 1));
        recs.push_back(qkv::vulkan::record(decode, cmd, {.q = &tq[t], .out = &to[t]}));
    }
    app::vulkan_app::host_barrier(cmd);
    a.submit_and_wait(cmd);
    CHECK(cache.size() == first + steps);
    for (std::size_t t = 0; t < steps; ++t) {
        recs[2 * t + 1].check();
        // The reference: the prompt and the first t + 1 new rows, per K/V head.
        const std::size_t held = first + t + 1;
        std::vector<float> k, v;
        for (std::size_t h = 0; h < Hkv; ++h) {
            for (std::size_t j = 0; j < first * E; ++j) k.push_back(all_k[h * first * E + j]);
            for (std::size_t s = 0; s <= t; ++s)
                for (std::size_t c = 0; c < E; ++c) k.push_back(ks[s][h * E + c]);
            for (std::size_t j = 0; j < first * Ev; ++j) v.push_back(all_v[h * first * Ev + j]);
            for (std::size_t s = 0; s <= t; ++s)
                for (std::size_t c = 0; c < Ev; ++c) v.push_back(vs[s][h * Ev + c]);
        }
        qkv::sdpa_problem host = desc;
        host.shape.kv_len = held;
        host.q = qs[t], host.k = k, host.v = v;
        INFO("step " << t);
        CHECK(nmse(outs.data<float>() + t * Hq * Ev, qkv::cpu::sdpa_f64(host).output) <= 1e-10);
    }
    CHECK(a.log.count() == 0);
}

TEST_CASE("interop: several recordings of one call in flight at once", "[interop]") {
    app::vulkan_app a;
    qkv::vulkan::context ctx = context_on(a);
    constexpr std::size_t Hq = 2, L = 17, S = 33, E = 8, n = 3;
    qkv::sdpa_problem desc;
    desc.shape = {.batch = 1, .q_heads = Hq, .kv_heads = 1, .q_len = L, .kv_len = S, .d_qk = E, .d_v = E};
    desc.options.causal = true;
    qkv::vulkan::sdpa_call call(ctx, desc);
    std::mt19937_64 rng(2);
    std::vector<app::buffer> ins, outs;
    std::vector<std::vector<double>> want;
    std::vector<qkv::vulkan::recording> recs;
    std::vector<VkCommandBuffer> cmds;
    std::vector<qkv::vulkan::tensor> tensors;
    for (std::size_t i = 0; i < n; ++i) {
        const std::vector<float> q = normal(Hq * L * E, rng), k = normal(S * E, rng), v = normal(S * E, rng);
        ins.push_back(a.make_buffer((q.size() + k.size() + v.size()) * 4));
        outs.push_back(a.make_buffer(Hq * L * E * 4));
        put(ins[i], 0, q), put(ins[i], q.size(), k), put(ins[i], q.size() + k.size(), v);
        qkv::sdpa_problem host = desc;
        host.q = q, host.k = k, host.v = v;
        want.push_back(qkv::cpu::sdpa_f64(host).output);
    }
    for (std::size_t i = 0; i < n; ++i) {
        tensors.push_back(qkv::vulkan::wrap(ctx, ins[i].handle, 0, Hq * L * E * 4, {Hq, L, E}));
        tensors.push_back(qkv::vulkan::wrap(ctx, ins[i].handle, Hq * L * E * 4, S * E * 4, {S, E}));
        tensors.push_back(qkv::vulkan::wrap(ctx, ins[i].handle, (Hq * L + S) * E * 4, S * E * 4, {S, E}));
        tensors.push_back(qkv::vulkan::wrap(ctx, outs[i].handle, 0, Hq * L * E * 4, {Hq, L, E}));
    }
    // Record all, then submit all in one batch, then wait once.
    for (std::size_t i = 0; i < n; ++i) {
        cmds.push_back(a.begin());
        recs.push_back(qkv::vulkan::record(
            call, cmds[i],
            {.q = &tensors[4 * i], .k = &tensors[4 * i + 1], .v = &tensors[4 * i + 2], .out = &tensors[4 * i + 3]}));
        app::vulkan_app::host_barrier(cmds[i]);
        app::check(vkEndCommandBuffer(cmds[i]), "vkEndCommandBuffer");
    }
    VkSubmitInfo submit = app::make<VkSubmitInfo>(VK_STRUCTURE_TYPE_SUBMIT_INFO);
    submit.commandBufferCount = static_cast<std::uint32_t>(n);
    submit.pCommandBuffers = cmds.data();
    app::check(vkQueueSubmit(a.queue, 1, &submit, VK_NULL_HANDLE), "vkQueueSubmit");
    app::check(vkQueueWaitIdle(a.queue), "vkQueueWaitIdle");
    for (std::size_t i = 0; i < n; ++i) {
        recs[i].check();
        CHECK(nmse(outs[i].data<float>(), want[i]) <= 1e-10);
    }
    vkFreeCommandBuffers(a.device, a.pool, static_cast<std::uint32_t>(n), cmds.data());
    CHECK(a.log.count() == 0);
}

TEST_CASE("interop: what the application's device was not created with is refused, naming it", "[interop]") {
    app::vulkan_app a(/*fp16=*/false);
    qkv::vulkan::context ctx = context_on(a);
    CHECK_FALSE(ctx.device().fp16_storage);
    qkv::sdpa_problem desc;
    desc.shape = {.batch = 1, .q_heads = 1, .kv_heads = 1, .q_len = 3, .kv_len = 5, .d_qk = 8, .d_v = 8};
    desc.options.precision = qkv::precision::fp16;
    CHECK_THROWS_WITH(qkv::vulkan::sdpa_call(ctx, desc), Catch::Matchers::Contains("storageBuffer16BitAccess"));
    CHECK_THROWS_AS(qkv::vulkan::tensor(ctx, {4}, qkv::element_type::f16), qkv::vulkan::unavailable);
    // fp32 works on the same device.
    desc.options.precision = qkv::precision::fp32;
    std::vector<float> q(24, 0.5f), k(40, 0.25f), v(40, 1.0f);
    qkv::sdpa_problem host = desc;
    host.q = q, host.k = k, host.v = v;
    CHECK(ctx.sdpa(host).output == qkv::cpu::sdpa(host).output);
    // A device without a compute queue family given: refused before anything runs.
    CHECK_THROWS_AS(qkv::vulkan::make_context({.instance = a.instance,
                                               .physical_device = a.physical,
                                               .device = a.device,
                                               .queue_family = 99,
                                               .queue = a.queue,
                                               .get_instance_proc_addr = vkGetInstanceProcAddr}),
                    qkv::vulkan::unavailable);
    CHECK(a.log.count() == 0);
}

TEST_CASE("interop: self-attention recorded over the application's buffers", "[interop][attention]") {
    app::vulkan_app a;
    qkv::vulkan::context ctx = context_on(a);
    constexpr std::size_t N = 9, d_in = 6, d = 8, d_out = 5;
    std::mt19937_64 rng(4);
    const std::vector<float> x = normal(N * d_in, rng), wq = normal(d_in * d, rng), wk = normal(d_in * d, rng),
                             wv = normal(d_in * d, rng), wo = normal(d * d_out, rng);
    app::buffer mem = a.make_buffer((x.size() + 3 * wq.size() + wo.size() + N * d_out + 16) * 4);
    std::size_t at = 3;  // odd offsets again
    const auto place = [&](const std::vector<float>& v, std::vector<std::size_t> shape) {
        put(mem, at, v);
        qkv::vulkan::tensor t = qkv::vulkan::wrap(ctx, mem.handle, at * 4, v.size() * 4, std::move(shape));
        at += v.size() + 1;
        return t;
    };
    qkv::vulkan::tensor tx = place(x, {N, d_in}), tq = place(wq, {d_in, d}), tk = place(wk, {d_in, d}),
                        tv = place(wv, {d_in, d}), to = place(wo, {d, d_out});
    qkv::vulkan::tensor out = qkv::vulkan::wrap(ctx, mem.handle, at * 4, N * d_out * 4, {N, d_out});
    qkv::attention_problem desc;
    desc.shape = {.batch = 1, .seq = N, .d_in = d_in, .d_k = d, .d_v = d, .heads = 2, .d_out = d_out};
    desc.options.causal = true;
    qkv::attention_problem host = desc;
    host.x = x, host.wq = wq, host.wk = wk, host.wv = wv, host.wo = wo;
    qkv::vulkan::attention_call call(ctx, desc);
    VkCommandBuffer cmd = a.begin();
    qkv::vulkan::recording r =
        qkv::vulkan::record(call, cmd, {.x = &tx, .wq = &tq, .wk = &tk, .wv = &tv, .wo = &to, .out = &out});
    app::vulkan_app::host_barrier(cmd);
    a.submit_and_wait(cmd);
    r.check();
    CHECK(nmse(mem.data<float>() + at, qkv::cpu::attention_f64(host).output) <= 1e-10);
    CHECK(a.log.count() == 0);
}

TEST_CASE("interop: the forward and the backward recorded in the application's command buffer", "[interop][backward]") {
    app::vulkan_app a;
    qkv::vulkan::context ctx = context_on(a);
    std::mt19937_64 rng(5);
    constexpr std::size_t Hq = 4, Hkv = 2, L = 17, S = 23, E = 16, Ev = 8;
    constexpr std::size_t nq = Hq * L * E, nk = Hkv * S * E, nv = Hkv * S * Ev, no = Hq * L * Ev, nl = Hq * L;
    const std::vector<float> q = normal(nq, rng), k = normal(nk, rng), v = normal(nv, rng), d_out = normal(no, rng),
                             sinks = normal(Hq, rng);
    qkv::sdpa_backward_problem desc;
    desc.forward.shape = {.batch = 1, .q_heads = Hq, .kv_heads = Hkv, .q_len = L, .kv_len = S, .d_qk = E, .d_v = Ev};
    desc.forward.options = {.causal = true, .softcap = 4.f, .dropout_p = 0.2f, .dropout_seed = 9};
    desc.forward.sinks = sinks;
    qkv::sdpa_backward_problem host = desc;
    host.forward.q = q, host.forward.k = k, host.forward.v = v, host.d_out = d_out;  // out, lse: recomputed
    const qkv::sdpa_gradients_f64 want = qkv::cpu::sdpa_backward_f64(host);
    // Every tensor at an odd element offset of one buffer; the gradients in another, each fenced.
    std::size_t at = 1;
    app::buffer mem = a.make_buffer((nq + nk + nv + 3 * no + nl + 16) * 4);
    app::buffer grads = a.make_buffer((nq + nk + nv + Hq + 16) * 4);
    for (std::size_t i = 0; i < nq + nk + nv + Hq + 16; ++i) grads.data<float>()[i] = 1234.5f;
    const auto place = [&](app::buffer& b, std::size_t& next, const std::vector<float>* values, std::size_t n,
                           std::vector<std::size_t> shape) {
        if (values) put(b, next, *values);
        qkv::vulkan::tensor t = qkv::vulkan::wrap(ctx, b.handle, next * 4, n * 4, std::move(shape));
        next += n + 3;
        return t;
    };
    qkv::vulkan::tensor tq = place(mem, at, &q, nq, {1, Hq, L, E}), tk = place(mem, at, &k, nk, {1, Hkv, S, E}),
                        tv = place(mem, at, &v, nv, {1, Hkv, S, Ev}), tdo = place(mem, at, &d_out, no, {1, Hq, L, Ev}),
                        to = place(mem, at, nullptr, no, {1, Hq, L, Ev}), tl = place(mem, at, nullptr, nl, {1, Hq, L});
    std::size_t g_at = 1;
    const std::size_t dq_at = g_at;
    qkv::vulkan::tensor dq = place(grads, g_at, nullptr, nq, {1, Hq, L, E});
    const std::size_t dk_at = g_at;
    qkv::vulkan::tensor dk = place(grads, g_at, nullptr, nk, {1, Hkv, S, E});
    const std::size_t dv_at = g_at;
    qkv::vulkan::tensor dv = place(grads, g_at, nullptr, nv, {1, Hkv, S, Ev});
    const std::size_t ds_at = g_at;
    qkv::vulkan::tensor ds = place(grads, g_at, nullptr, Hq, {Hq});

    qkv::sdpa_problem forward = desc.forward;
    forward.options.return_lse = true;
    qkv::vulkan::sdpa_call f(ctx, forward);
    qkv::vulkan::sdpa_backward_call b(ctx, desc);
    VkCommandBuffer cmd = a.begin();
    qkv::vulkan::recording rf = qkv::vulkan::record(f, cmd, {.q = &tq, .k = &tk, .v = &tv, .out = &to, .lse = &tl});
    qkv::vulkan::recording rb = qkv::vulkan::record(b, cmd,
                                                    {.q = &tq,
                                                     .k = &tk,
                                                     .v = &tv,
                                                     .out = &to,
                                                     .lse = &tl,
                                                     .d_out = &tdo,
                                                     .dq = &dq,
                                                     .dk = &dk,
                                                     .dv = &dv,
                                                     .d_sinks = &ds});
    app::vulkan_app::host_barrier(cmd);
    a.submit_and_wait(cmd);
    rf.check();
    rb.check();
    const float* g = grads.data<float>();
    CHECK(nmse(g + dq_at, want.dq) <= 1e-9);
    CHECK(nmse(g + dk_at, want.dk) <= 1e-9);
    CHECK(nmse(g + dv_at, want.dv) <= 1e-9);
    CHECK(nmse(g + ds_at, want.d_sinks) <= 1e-9);
    for (const std::size_t gap : {dq_at - 1, dk_at - 1, dv_at - 1, ds_at - 1, ds_at + Hq})
        CHECK(g[gap] == 1234.5f);  // nothing written outside the gradients
    CHECK(a.log.count() == 0);
}
