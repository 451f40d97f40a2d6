// qkv on an application's own Vulkan device (qkv/vulkan/interop.hpp), through the application's
// own instance, device and buffers (examples/vulkan_app.hpp, volk): tensors over its buffers at
// odd offsets, fp16 tensors, a decode loop that appends to a cache over its memory and decodes in
// the same command buffer, several recordings in flight at once, and a device that lacks what a
// call needs. Its validation layer, with synchronisation validation, must say nothing.
#include <qkv/vulkan/interop.hpp>
#include <qkv/vulkan/runtime.hpp>
#include <qkv/vulkan/testing.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "app_values.hpp"
#include "support/catch.hpp"
#include "support/paged_problems.hpp"
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

TEST_CASE("interop: q8_0 / q4_0 tensors over the application's buffers that end mid 32-bit word",
          "[interop][quantized]") {
    // 17 rows of 34 (q8_0) or 18 (q4_0) bytes end mid-word: the blocks are read as words, the last
    // one's included. A range that reaches that word's end (or a start at the word's other half,
    // which ends the tensor on a whole word) reads every value; a range that stops short of it is
    // refused when the call is recorded, never read as zeros or whatever lies past it.
    app::vulkan_app a;
    qkv::vulkan::context ctx = context_on(a);
    std::mt19937_64 rng(5);
    constexpr std::size_t L = 2, S = 17, E = 32;
    const std::vector<float> q = normal(L * E, rng), k = normal(S * E, rng), v = normal(S * E, rng);
    for (const qkv::element_type t : {qkv::element_type::q8_0, qkv::element_type::q4_0}) {
        INFO(qkv::to_string(t));
        const std::size_t bytes = qkv::bytes_for(t, S * E);
        REQUIRE(bytes % 4 == 2);
        qkv::sdpa_problem desc;
        desc.shape = {.batch = 1, .q_heads = 1, .kv_heads = 1, .q_len = L, .kv_len = S, .d_qk = E, .d_v = E};
        desc.options.kv_type = t;
        qkv::sdpa_problem host = desc;
        host.q = q, host.k = k, host.v = v;
        const std::vector<double> want = qkv::cpu::sdpa_f64(host).output;  // K and V through kv_type
        qkv::vulkan::sdpa_call call(ctx, desc);
        app::buffer io = a.make_buffer(4096);
        put(io, 0, q);
        qkv::vulkan::tensor tq = qkv::vulkan::wrap(ctx, io.handle, 0, L * E * 4, {1, 1, L, E});
        qkv::vulkan::tensor to = qkv::vulkan::wrap(ctx, io.handle, 1024, L * E * 4, {1, 1, L, E});
        // (offset, range): the word's end reached, a start at a word's second half, a range short of it
        for (const auto& [at, range, refused] :
             {std::tuple{std::size_t{0}, bytes + 2, false}, std::tuple{std::size_t{2}, bytes, false},
              std::tuple{std::size_t{0}, bytes, true}}) {
            INFO("offset " << at << ", range " << range);
            app::buffer kv = a.make_buffer(2048);
            for (std::size_t i = 0; i < 512; ++i) kv.data<float>()[i] = 1234.5f;  // not zeros past the tensors
            qkv::vulkan::tensor tk = qkv::vulkan::wrap(ctx, kv.handle, at, range, {1, 1, S, E}, t);
            qkv::vulkan::tensor tv = qkv::vulkan::wrap(ctx, kv.handle, 1024 + at, range, {1, 1, S, E}, t);
            tk.upload(k), tv.upload(v);
            VkCommandBuffer cmd = a.begin();
            if (refused) {
                CHECK_THROWS_AS(qkv::vulkan::record(call, cmd, {.q = &tq, .k = &tk, .v = &tv, .out = &to}),
                                qkv::invalid_argument);
                a.submit_and_wait(cmd);
                continue;
            }
            qkv::vulkan::recording r = qkv::vulkan::record(call, cmd, {.q = &tq, .k = &tk, .v = &tv, .out = &to});
            app::vulkan_app::host_barrier(cmd);
            a.submit_and_wait(cmd);
            r.check();
            CHECK(nmse(io.data<float>() + 256, want) <= 1e-10);
        }
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
        qkv::vulkan::wrap(ctx, storage.handle, 256, k_bytes, {1, Hkv, capacity, E}, qkv::element_type::f32,
                          app::vulkan_app::all_usage),
        qkv::vulkan::wrap(ctx, storage.handle, 256 + k_bytes + 256, v_bytes, {1, Hkv, capacity, Ev},
                          qkv::element_type::f32, app::vulkan_app::all_usage));
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

TEST_CASE("interop: a server's batched paged decode steps recorded into the application's command buffer",
          "[interop][paged]") {
    // Two steps of a batch against one pool, q and out in the application's memory at odd offsets:
    // GQA, sequences 1 and 2 sharing sequence 0's first 32 keys, sequences of 0 and 1 keys; the
    // second step one key longer each. Each step's bits are the host call's, its values the float64
    // reference's.
    app::vulkan_app a;
    qkv::vulkan::context ctx = context_on(a);
    for (const std::size_t page_size : {1u, 16u}) {
        INFO("page_size " << page_size);
        const std::size_t two = 32 / page_size;
        qkv_test::owned_paged o = qkv_test::random_paged({.kv_lens = {40, 35, 33, 0, 1},
                                                          .q_len = 1,
                                                          .q_heads = 6,
                                                          .kv_heads = 2,
                                                          .d_qk = 16,
                                                          .d_v = 8,
                                                          .page_size = page_size,
                                                          .shares = {{0, 0}, {0, two}, {0, two}, {0, 0}, {0, 0}},
                                                          .seed = 60 + page_size});
        o.problem.options = {.causal = true, .alignment = qkv::causal_alignment::bottom_right, .return_lse = true};
        const qkv::paged_problem& full = o.problem;
        const std::size_t B = 5, Hq = 6, Hkv = 2, E = 16, Ev = 8, rows = full.num_pages * page_size;
        // The pool: the pages' rows in page order, (1, Hkv, rows, E).
        std::vector<float> k(rows * Hkv * E), v(rows * Hkv * Ev);
        for (std::size_t n = 0; n < rows; ++n)
            for (std::size_t h = 0; h < Hkv; ++h) {
                for (std::size_t e = 0; e < E; ++e) k[(h * rows + n) * E + e] = full.k_pages[(n * Hkv + h) * E + e];
                for (std::size_t e = 0; e < Ev; ++e) v[(h * rows + n) * Ev + e] = full.v_pages[(n * Hkv + h) * Ev + e];
            }
        qkv::vulkan::kv_cache pool(ctx, {.batch = 1, .kv_heads = Hkv, .capacity = rows, .d_qk = E, .d_v = Ev});
        pool.append(k, v, rows);
        // Step 2: one key more each, a new page (any of the pool's) where the key needs one.
        std::vector<std::int32_t> lens2 = o.seqlens, table2 = o.table;
        for (std::size_t b = 0; b < B; ++b) {
            const auto j = static_cast<std::size_t>(lens2[b]++);
            if (j % page_size == 0) table2[b * full.max_pages + j / page_size] = o.table[0];
        }
        qkv::paged_problem steps[2] = {full, full};
        steps[1].cache_seqlens = lens2, steps[1].block_table = table2;
        constexpr std::size_t q_at = 3, o_at = 5;
        const std::size_t nq = B * Hq * E, no = B * Hq * Ev;
        app::buffer in = a.make_buffer((q_at + nq) * 4), out = a.make_buffer((o_at + 2 * no) * 4);
        put(in, q_at, o.q);
        qkv::vulkan::tensor tq = qkv::vulkan::wrap(ctx, in.handle, q_at * 4, nq * 4, {B, 1, Hq, E});
        qkv::vulkan::tensor to[2] = {qkv::vulkan::wrap(ctx, out.handle, o_at * 4, no * 4, {B, 1, Hq, Ev}),
                                     qkv::vulkan::wrap(ctx, out.handle, (o_at + no) * 4, no * 4, {B, 1, Hq, Ev})};
        qkv::vulkan::tensor tl[2] = {qkv::vulkan::tensor(ctx, {Hq, B}), qkv::vulkan::tensor(ctx, {Hq, B})};
        qkv::paged_problem desc = full;
        desc.q = {}, desc.k_pages = {}, desc.v_pages = {}, desc.num_pages = 0;
        desc.block_table = {}, desc.cache_seqlens = {};
        qkv::vulkan::paged_call call(ctx, desc, pool);  // planned once, for every step
        VkCommandBuffer cmd = a.begin();
        std::vector<qkv::vulkan::recording> recs;
        for (std::size_t i = 0; i < 2; ++i)
            recs.push_back(qkv::vulkan::record(call, cmd,
                                               {.q = &tq,
                                                .out = &to[i],
                                                .lse = &tl[i],
                                                .block_table = steps[i].block_table,
                                                .cache_seqlens = steps[i].cache_seqlens}));
        app::vulkan_app::host_barrier(cmd);
        a.submit_and_wait(cmd);
        for (std::size_t i = 0; i < 2; ++i) {
            INFO("step " << i);
            recs[i].check();
            qkv::paged_problem host = steps[i];
            host.k_pages = {}, host.v_pages = {}, host.num_pages = 0;
            const qkv::varlen_output same = ctx.sdpa(host, pool);
            const std::vector<float> got(out.data<float>() + o_at + i * no, out.data<float>() + o_at + (i + 1) * no);
            CHECK(got == same.output);
            CHECK(tl[i].download() == same.lse);
            CHECK(nmse(got.data(), qkv::cpu::sdpa_f64(steps[i]).output) <= 1e-10);
        }
        // A page past the pool: refused before anything is recorded.
        std::vector<std::int32_t> bad = o.table;
        bad[0] = static_cast<std::int32_t>(full.num_pages);
        VkCommandBuffer cmd2 = a.begin();
        CHECK_THROWS_AS((void)qkv::vulkan::record(
                            call, cmd2, {.q = &tq, .out = &to[0], .block_table = bad, .cache_seqlens = o.seqlens}),
                        qkv::invalid_argument);
        a.discard(cmd2);
    }
    CHECK(a.log.count() == 0);
}

TEST_CASE("interop: a paged_call over lengths in the application's memory, recorded into its command buffer",
          "[interop][paged]") {
    // The lengths an i32 buffer of the application's (cache_seqlens_tensor), written after each
    // step is recorded and before it is submitted: the commands read them when they run (the
    // float64 reference at those lengths, 17 and a page boundary among them), and a negative one
    // fails the recording's check() (invalid_argument).
    app::vulkan_app a;
    qkv::vulkan::context ctx = context_on(a);
    qkv_test::owned_paged o = qkv_test::random_paged({.kv_lens = {40, 17, 33, 0},
                                                      .q_len = 2,
                                                      .q_heads = 6,
                                                      .kv_heads = 2,
                                                      .d_qk = 16,
                                                      .d_v = 8,
                                                      .page_size = 16,
                                                      .seed = 83});
    o.problem.options = {.causal = true, .alignment = qkv::causal_alignment::bottom_right};
    o.problem.cascade = false;
    const qkv::paged_problem& full = o.problem;
    const std::size_t B = 4, Hq = 6, Hkv = 2, E = 16, Ev = 8, rows = full.num_pages * full.page_size;
    std::vector<float> k(rows * Hkv * E), v(rows * Hkv * Ev);  // the pool (1, Hkv, rows, E)
    for (std::size_t n = 0; n < rows; ++n)
        for (std::size_t h = 0; h < Hkv; ++h) {
            for (std::size_t e = 0; e < E; ++e) k[(h * rows + n) * E + e] = full.k_pages[(n * Hkv + h) * E + e];
            for (std::size_t e = 0; e < Ev; ++e) v[(h * rows + n) * Ev + e] = full.v_pages[(n * Hkv + h) * Ev + e];
        }
    qkv::vulkan::kv_cache pool(ctx, {.batch = 1, .kv_heads = Hkv, .capacity = rows, .d_qk = E, .d_v = Ev});
    pool.append(k, v, rows);
    qkv::paged_problem desc = full;
    desc.q = {}, desc.k_pages = {}, desc.v_pages = {}, desc.num_pages = 0, desc.cache_seqlens = {};
    qkv::vulkan::paged_call call(ctx, desc, pool);
    constexpr std::size_t len_at = 3;
    app::buffer lens = a.make_buffer((len_at + B) * 4);
    qkv::vulkan::tensor tlen = qkv::vulkan::wrap(ctx, lens.handle, len_at * 4, B * 4, {B}, qkv::element_type::i32);
    qkv::vulkan::tensor tq(ctx, {B, 2, Hq, E}), to(ctx, {B, 2, Hq, Ev});
    tq.upload(o.q);
    const std::vector<std::int32_t> shorter = {17, 16, 1, 0}, bad = {17, -1, 1, 0};
    const qkv::vulkan::paged_tensors t{
        .q = &tq, .out = &to, .block_table = full.block_table, .cache_seqlens_tensor = &tlen};
    const std::vector<std::int32_t>& first = o.seqlens;
    for (const std::vector<std::int32_t>* lengths : {&first, &shorter, &bad}) {
        INFO("lengths " << (*lengths)[0] << " " << (*lengths)[1] << " " << (*lengths)[2] << " " << (*lengths)[3]);
        VkCommandBuffer cmd = a.begin();
        qkv::vulkan::recording r = qkv::vulkan::record(call, cmd, t);
        app::vulkan_app::host_barrier(cmd);
        // Written after the recording, before the submit: the commands read them when they run.
        for (std::size_t b = 0; b < B; ++b) lens.data<std::int32_t>()[len_at + b] = (*lengths)[b];
        a.submit_and_wait(cmd);
        if (lengths == &bad) {
            CHECK_THROWS_AS(r.check(), qkv::invalid_argument);
            continue;
        }
        r.check();
        qkv::paged_problem ref = full;
        ref.cache_seqlens = *lengths;
        CHECK(nmse(to.download().data(), qkv::cpu::sdpa_f64(ref).output) <= 1e-10);
    }
    CHECK(a.log.count() == 0);
}

TEST_CASE("interop: a paged_call that appends, recorded into the application's command buffer", "[interop][paged]") {
    // The new rows as tensors written into the pool's pages, then the decode, in the application's
    // command buffer. Recorded and never submitted: the pool is the command buffer's until the
    // recording goes, and then as it was (nothing written). Submitted: the float64 reference of
    // append-then-attend, and the rows are the pool's once check() has seen it complete.
    app::vulkan_app a;
    qkv::vulkan::context ctx = context_on(a);
    qkv_test::owned_paged o = qkv_test::random_paged({.kv_lens = {40, 17, 20},
                                                      .q_len = 1,
                                                      .q_heads = 6,
                                                      .kv_heads = 2,
                                                      .d_qk = 16,
                                                      .d_v = 8,
                                                      .page_size = 16,
                                                      .seed = 77});
    o.problem.options = {.causal = true, .alignment = qkv::causal_alignment::bottom_right};
    const std::vector<std::int32_t> full_lengths = o.seqlens;
    qkv::paged_problem before_ref = o.problem;  // every row the append would write, as it was
    before_ref.cache_seqlens = full_lengths;
    qkv_test::make_appends(o, 17, 78);
    const qkv::paged_problem& p = o.problem;
    const std::size_t B = 3, Hq = 6, Hkv = 2, E = 16, Ev = 8, rows = p.num_pages * p.page_size;
    std::vector<float> k(rows * Hkv * E), v(rows * Hkv * Ev);  // the pool (1, Hkv, rows, E)
    for (std::size_t n = 0; n < rows; ++n)
        for (std::size_t h = 0; h < Hkv; ++h) {
            for (std::size_t e = 0; e < E; ++e) k[(h * rows + n) * E + e] = p.k_pages[(n * Hkv + h) * E + e];
            for (std::size_t e = 0; e < Ev; ++e) v[(h * rows + n) * Ev + e] = p.v_pages[(n * Hkv + h) * Ev + e];
        }
    qkv::vulkan::kv_cache pool(ctx, {.batch = 1, .kv_heads = Hkv, .capacity = rows, .d_qk = E, .d_v = Ev});
    pool.append(k, v, rows);
    const auto host_of = [](qkv::paged_problem x) {
        x.k_pages = {}, x.v_pages = {}, x.num_pages = 0;
        return x;
    };
    qkv::paged_problem desc = host_of(p);
    desc.q = {}, desc.k_new = {}, desc.v_new = {};
    qkv::vulkan::paged_call call(ctx, desc, pool);
    qkv::vulkan::tensor tq(ctx, {B, 1, Hq, E}), to(ctx, {B, 1, Hq, Ev});
    qkv::vulkan::tensor tk(ctx, {B, 17, Hkv, E}), tv(ctx, {B, 17, Hkv, Ev});
    tq.upload(o.q), tk.upload(o.k_new), tv.upload(o.v_new);
    const qkv::vulkan::paged_tensors t{.q = &tq, .out = &to, .k_new = &tk, .v_new = &tv};
    const qkv::paged_problem before = host_of(before_ref);
    const std::vector<double> want_before = qkv::cpu::sdpa_f64(before_ref).output;
    VkCommandBuffer cmd = a.begin();
    {
        qkv::vulkan::recording r = qkv::vulkan::record(call, cmd, t);
        CHECK_THROWS_AS((void)ctx.sdpa(before, pool), qkv::invalid_argument);
        CHECK_THROWS_AS(call.run(t), qkv::invalid_argument);
        VkCommandBuffer other = a.begin();
        CHECK_THROWS_AS((void)qkv::vulkan::record(call, other, t), qkv::invalid_argument);
        a.discard(other);
        CHECK_THROWS_AS(r.check(), qkv::vulkan::not_complete);
    }
    a.discard(cmd);
    CHECK(nmse(ctx.sdpa(before, pool).output.data(), want_before) <= 1e-10);  // nothing written
    cmd = a.begin();
    qkv::vulkan::recording r = qkv::vulkan::record(call, cmd, t);
    app::vulkan_app::host_barrier(cmd);
    a.submit_and_wait(cmd);
    CHECK_THROWS_AS((void)ctx.sdpa(before, pool), qkv::invalid_argument);  // not known to have run yet
    r.check();
    const std::vector<float> got = to.download();
    CHECK(nmse(got.data(), qkv_test::kvcache_reference(p).output) <= 1e-10);
    std::vector<std::int32_t> lengths(o.seqlens);
    for (std::int32_t& n : lengths) n += 17;
    qkv::paged_problem after = host_of(p);
    after.cache_seqlens = lengths, after.new_rows = 0, after.k_new = {}, after.v_new = {};
    CHECK(ctx.sdpa(after, pool).output == got);  // the rows are the pool's: equal bits without the append
    CHECK(a.log.count() == 0);
}

TEST_CASE("interop: a paged_call appending q8_0 / q4_0 blocks from the application's buffers",
          "[interop][paged][quantized]") {
    // k_new and v_new as blocks in the application's buffers, at a word's second half so that K's
    // 3·17·3 blocks of 34 or 18 bytes end on a whole word, copied into a quantized pool's pages in the
    // application's command buffer. Discarded unsubmitted: the pool as it was. Submitted: the bits of
    // the host call with the same rows (quantized by qkv::quantize on the host, as the tensors'
    // upload quantizes). A buffer the copies cannot read from is refused, naming the flag.
    app::vulkan_app a;
    qkv::vulkan::context ctx = context_on(a);
    for (const qkv::element_type type : {qkv::element_type::q8_0, qkv::element_type::q4_0}) {
        INFO(qkv::to_string(type));
        qkv_test::owned_paged o = qkv_test::random_paged({.kv_lens = {40, 17, 20},
                                                          .q_len = 1,
                                                          .q_heads = 6,
                                                          .kv_heads = 3,
                                                          .d_qk = 32,
                                                          .d_v = 64,
                                                          .page_size = 16,
                                                          .seed = 79});
        o.problem.options = {.causal = true, .alignment = qkv::causal_alignment::bottom_right};
        qkv::paged_problem before_host = o.problem;  // every row the append would write, as it was
        before_host.k_pages = {}, before_host.v_pages = {}, before_host.num_pages = 0;
        const std::vector<std::int32_t> full_lengths = o.seqlens;
        before_host.cache_seqlens = full_lengths;
        qkv_test::make_appends(o, 17, 80);
        const qkv::paged_problem& p = o.problem;
        const std::size_t B = 3, Hq = 6, Hkv = 3, E = 32, Ev = 64, rows = p.num_pages * p.page_size;
        std::vector<float> k(rows * Hkv * E), v(rows * Hkv * Ev);  // the pool (1, Hkv, rows, E)
        for (std::size_t n = 0; n < rows; ++n)
            for (std::size_t h = 0; h < Hkv; ++h) {
                for (std::size_t e = 0; e < E; ++e) k[(h * rows + n) * E + e] = p.k_pages[(n * Hkv + h) * E + e];
                for (std::size_t e = 0; e < Ev; ++e) v[(h * rows + n) * Ev + e] = p.v_pages[(n * Hkv + h) * Ev + e];
            }
        const auto make_pool = [&] {
            qkv::vulkan::kv_cache pool(
                ctx, {.batch = 1, .kv_heads = Hkv, .capacity = rows, .d_qk = E, .d_v = Ev, .type = type});
            pool.append(k, v, rows);
            return pool;
        };
        qkv::paged_problem host = p;
        host.k_pages = {}, host.v_pages = {}, host.num_pages = 0;
        qkv::vulkan::kv_cache by_host = make_pool();
        const qkv::varlen_output want = ctx.sdpa(host, by_host);
        qkv::paged_problem ref = p;
        ref.options.kv_type = type;
        CHECK(nmse(want.output.data(), qkv::cpu::sdpa_f64(ref).output) <= 1e-9);

        qkv::vulkan::kv_cache pool = make_pool();
        const std::vector<float> before = ctx.sdpa(before_host, pool).output;
        qkv::paged_problem desc = host;
        desc.q = {}, desc.k_new = {}, desc.v_new = {};
        qkv::vulkan::paged_call call(ctx, desc, pool);
        const std::size_t k_bytes = qkv::bytes_for(type, B * 17 * Hkv * E);
        const std::size_t v_bytes = qkv::bytes_for(type, B * 17 * Hkv * Ev);
        REQUIRE(k_bytes % 4 == 2);
        app::buffer kv = a.make_buffer(32768);
        for (std::size_t i = 0; i < 4096; ++i) kv.data<float>()[i] = 1234.5f;  // not zeros past the tensors
        qkv::vulkan::tensor tk = qkv::vulkan::wrap(ctx, kv.handle, 2, k_bytes, {B, 17, Hkv, E}, type);
        // V's 3·17·3·2 blocks from a word's second half: the range reaches the word's end.
        REQUIRE(v_bytes % 4 == 0);
        qkv::vulkan::tensor tv = qkv::vulkan::wrap(ctx, kv.handle, 8192 + 2, v_bytes + 2, {B, 17, Hkv, Ev}, type);
        tk.upload(o.k_new), tv.upload(o.v_new);
        qkv::vulkan::tensor tq(ctx, {B, 1, Hq, E}), to(ctx, {B, 1, Hq, Ev});
        tq.upload(o.q);
        const qkv::vulkan::paged_tensors t{.q = &tq, .out = &to, .k_new = &tk, .v_new = &tv};
        VkCommandBuffer cmd = a.begin();
        {
            qkv::vulkan::recording r = qkv::vulkan::record(call, cmd, t);
            CHECK_THROWS_AS((void)ctx.sdpa(before_host, pool), qkv::invalid_argument);
        }
        a.discard(cmd);
        CHECK(ctx.sdpa(before_host, pool).output == before);  // nothing written
        {                                                     // blocks in a buffer the transfer copies cannot read
            app::buffer no_copy = a.make_buffer(8192, VK_BUFFER_USAGE_STORAGE_BUFFER_BIT);
            qkv::vulkan::tensor bad = qkv::vulkan::wrap(ctx, no_copy.handle, 2, k_bytes, {B, 17, Hkv, E}, type,
                                                        VK_BUFFER_USAGE_STORAGE_BUFFER_BIT);
            qkv::vulkan::paged_tensors with_bad = t;
            with_bad.k_new = &bad;
            cmd = a.begin();
            try {
                (void)qkv::vulkan::record(call, cmd, with_bad);
                FAIL("recorded a copy from a buffer without VK_BUFFER_USAGE_TRANSFER_SRC_BIT");
            } catch (const qkv::invalid_argument& e) {
                CHECK(std::string(e.what()).find("VK_BUFFER_USAGE_TRANSFER_SRC_BIT") != std::string::npos);
            }
            a.discard(cmd);
        }
        cmd = a.begin();
        qkv::vulkan::recording r = qkv::vulkan::record(call, cmd, t);
        app::vulkan_app::host_barrier(cmd);
        a.submit_and_wait(cmd);
        r.check();
        CHECK(to.download() == want.output);
        qkv::paged_problem after = host;
        std::vector<std::int32_t> lengths(o.seqlens);
        for (std::int32_t& n : lengths) n += 17;
        after.cache_seqlens = lengths, after.new_rows = 0, after.k_new = {}, after.v_new = {};
        CHECK(ctx.sdpa(after, pool).output == ctx.sdpa(after, by_host).output);  // the same rows in both pools
    }
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

    // The misuse rules of every call over tensors hold for the backward: a gradient over an input
    // is refused (nothing in place), a transposed shape is refused naming both shapes, ...
    const qkv::vulkan::sdpa_backward_tensors ok{.q = &tq,
                                                .k = &tk,
                                                .v = &tv,
                                                .out = &to,
                                                .lse = &tl,
                                                .d_out = &tdo,
                                                .dq = &dq,
                                                .dk = &dk,
                                                .dv = &dv,
                                                .d_sinks = &ds};
    qkv::vulkan::tensor dq_over_q =
        qkv::vulkan::wrap(ctx, mem.handle, qkv::vulkan::offset_of(tq), nq * 4, {1, Hq, L, E});
    qkv::vulkan::sdpa_backward_tensors bad = ok;
    bad.dq = &dq_over_q;
    cmd = a.begin();
    CHECK_THROWS_WITH((void)qkv::vulkan::record(b, cmd, bad), Catch::Matchers::Contains("overlap"));
    CHECK_THROWS_WITH(b.run(bad), Catch::Matchers::Contains("overlap"));
    qkv::vulkan::tensor dk_shle = qkv::vulkan::wrap(ctx, grads.handle, dk_at * 4, nk * 4, {1, S, Hkv, E});
    bad = ok;
    bad.dk = &dk_shle;
    CHECK_THROWS_WITH((void)qkv::vulkan::record(b, cmd, bad),
                      Catch::Matchers::Contains("(1, 23, 2, 16)") && Catch::Matchers::Contains("(1, 2, 23, 16)"));
    // ... and a recording destroyed before its submit frees nothing its commands use.
    for (std::size_t i = 0; i < nq + nk + nv + Hq + 16; ++i) grads.data<float>()[i] = 1234.5f;
    { qkv::vulkan::recording gone = qkv::vulkan::record(b, cmd, ok); }
    app::vulkan_app::host_barrier(cmd);
    a.submit_and_wait(cmd);
    CHECK(nmse(g + dq_at, want.dq) <= 1e-9);
    CHECK(nmse(g + dv_at, want.dv) <= 1e-9);
    CHECK(a.log.count() == 0);
}

// ---- What an application gets wrong: each ends in a typed error or the right answer, with the
// validation layer silent.

namespace {

/// A small problem (B = 1, GQA, odd lengths) over one application buffer: q, k, v at odd offsets.
struct misuse_problem {
    static constexpr std::size_t Hq = 4, Hkv = 2, L = 3, S = 17, E = 16, Ev = 8;
    static constexpr std::size_t nq = Hq * L * E, nk = Hkv * S * E, nv = Hkv * S * Ev, no = Hq * L * Ev;
    static constexpr std::size_t q_at = 1, k_at = q_at + nq + 3, v_at = k_at + nk + 5, end = v_at + nv;
    qkv::sdpa_problem desc;
    std::vector<float> q, k, v;
    std::vector<double> want;
    app::buffer in, out;
    qkv::vulkan::tensor tq, tk, tv, to;

    /// `q_scale`: q and k scaled by it (1e20: scores beyond float32, whatever the reference says).
    misuse_problem(app::vulkan_app& a, qkv::vulkan::context& ctx, float q_scale = 1.0f) {
        std::mt19937_64 rng(29);
        q = normal(nq, rng), k = normal(nk, rng), v = normal(nv, rng);
        for (float& x : q) x *= q_scale;
        for (float& x : k) x *= q_scale;
        desc.shape = {.batch = 1, .q_heads = Hq, .kv_heads = Hkv, .q_len = L, .kv_len = S, .d_qk = E, .d_v = Ev};
        qkv::sdpa_problem host = desc;
        host.q = q, host.k = k, host.v = v;
        if (q_scale == 1.0f) want = qkv::cpu::sdpa_f64(host).output;
        in = a.make_buffer(end * 4), out = a.make_buffer(no * 4);
        put(in, q_at, q), put(in, k_at, k), put(in, v_at, v);
        tq = qkv::vulkan::wrap(ctx, in.handle, q_at * 4, nq * 4, {1, Hq, L, E});
        tk = qkv::vulkan::wrap(ctx, in.handle, k_at * 4, nk * 4, {1, Hkv, S, E});
        tv = qkv::vulkan::wrap(ctx, in.handle, v_at * 4, nv * 4, {1, Hkv, S, Ev});
        to = qkv::vulkan::wrap(ctx, out.handle, 0, no * 4, {1, Hq, L, Ev});
    }
    [[nodiscard]] qkv::vulkan::sdpa_tensors tensors() { return {.q = &tq, .k = &tk, .v = &tv, .out = &to}; }
    [[nodiscard]] double error() const { return nmse(out.data<float>(), want); }
    void clear_output() {
        for (std::size_t i = 0; i < no; ++i) out.data<float>()[i] = std::numeric_limits<float>::quiet_NaN();
    }
};

}  // namespace

TEST_CASE("interop misuse: a recording destroyed before its commands ran frees nothing they use", "[interop][misuse]") {
    app::vulkan_app a;
    qkv::vulkan::context ctx = context_on(a);
    misuse_problem p(a, ctx);
    qkv::vulkan::sdpa_call call(ctx, p.desc);
    // Destroyed before the submit (what a discarded temporary does): the commands still run right.
    p.clear_output();
    VkCommandBuffer cmd = a.begin();
    { qkv::vulkan::recording r = qkv::vulkan::record(call, cmd, p.tensors()); }
    app::vulkan_app::host_barrier(cmd);
    a.submit_and_wait(cmd);
    CHECK(p.error() <= 1e-10);
    // Destroyed while perhaps still running.
    p.clear_output();
    cmd = a.begin();
    VkFence fence = VK_NULL_HANDLE;
    {
        qkv::vulkan::recording r = qkv::vulkan::record(call, cmd, p.tensors());
        app::vulkan_app::host_barrier(cmd);
        fence = a.submit(cmd);
    }
    a.wait(fence, cmd);
    CHECK(p.error() <= 1e-10);
    // Replaced by move-assignment before its submit: the same.
    p.clear_output();
    cmd = a.begin();
    qkv::vulkan::recording r = qkv::vulkan::record(call, cmd, p.tensors());
    r = qkv::vulkan::recording();
    app::vulkan_app::host_barrier(cmd);
    a.submit_and_wait(cmd);
    CHECK(p.error() <= 1e-10);
    // The retired ones are let go of by later calls; the call goes on working.
    p.clear_output();
    call.run(p.tensors());
    CHECK(p.error() <= 1e-10);
    CHECK(a.log.count() == 0);
}

TEST_CASE("interop misuse: check() before completion throws not_complete, never a verdict", "[interop][misuse]") {
    app::vulkan_app a;
    qkv::vulkan::context ctx = context_on(a);
    misuse_problem p(a, ctx, 1e20f);  // scores beyond float32: the verdict is numeric_overflow
    qkv::vulkan::sdpa_call call(ctx, p.desc);
    VkCommandBuffer cmd = a.begin();
    qkv::vulkan::recording r = qkv::vulkan::record(call, cmd, p.tensors());
    CHECK_THROWS_AS(r.check(), qkv::vulkan::not_complete);  // recorded, not submitted
    app::vulkan_app::host_barrier(cmd);
    a.submit_and_wait(cmd);
    CHECK_THROWS_AS(r.check(), qkv::vulkan::numeric_overflow);
    CHECK_THROWS_AS(r.check(), qkv::vulkan::numeric_overflow);  // asked again: the same verdict
    // A recording whose command buffer was never submitted: not_complete, however often asked.
    VkCommandBuffer never = a.begin();
    qkv::vulkan::recording unrun = qkv::vulkan::record(call, never, p.tensors());
    CHECK_THROWS_AS(unrun.check(), qkv::vulkan::not_complete);
    CHECK_THROWS_AS(unrun.check(), qkv::vulkan::not_complete);
    unrun = {};
    a.discard(never);
    CHECK(a.log.count() == 0);
}

TEST_CASE("interop: a recording tied to the application's fence completes with the fence, not its word",
          "[interop][misuse]") {
    app::vulkan_app a;
    qkv::vulkan::context ctx = context_on(a);
    misuse_problem p(a, ctx, 1e20f);  // scores beyond float32: the verdict is numeric_overflow
    qkv::vulkan::sdpa_call call(ctx, p.desc);
    VkFenceCreateInfo fence_info{};
    fence_info.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO;
    VkFence other = VK_NULL_HANDLE;
    app::check(vkCreateFence(a.device, &fence_info, nullptr, &other), "vkCreateFence");
    // Run to completion (its word says done), but tied to a fence no submit has signalled yet:
    // not complete until that fence is (the word alone is no host synchronisation).
    VkCommandBuffer cmd = a.begin();
    qkv::vulkan::recording r = qkv::vulkan::record(call, cmd, p.tensors());
    CHECK_THROWS_AS(r.completes_with(VK_NULL_HANDLE), qkv::invalid_argument);
    r.completes_with(other);
    app::vulkan_app::host_barrier(cmd);
    a.submit_and_wait(cmd);
    CHECK_THROWS_AS(r.check(), qkv::vulkan::not_complete);
    VkSubmitInfo empty{};
    empty.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO;
    app::check(vkQueueSubmit(a.queue, 1, &empty, other), "vkQueueSubmit");
    app::check(vkWaitForFences(a.device, 1, &other, VK_TRUE, UINT64_MAX), "vkWaitForFences");
    CHECK_THROWS_AS(r.check(), qkv::vulkan::numeric_overflow);
    r = {};
    // Destroyed unchecked once its fence is signalled: released at once, no later call needed
    // (without the fence it stays with the context until a later record or run). A run first:
    // the call keeps its own runs' recording.
    CHECK_THROWS_AS(call.run(p.tensors()), qkv::vulkan::numeric_overflow);
    const std::size_t live = qkv::vulkan::testing::live().recordings;
    cmd = a.begin();
    {
        qkv::vulkan::recording unchecked = qkv::vulkan::record(call, cmd, p.tensors());
        CHECK(qkv::vulkan::testing::live().recordings == live + 1);
        app::vulkan_app::host_barrier(cmd);
        const VkFence fence = a.submit(cmd);
        unchecked.completes_with(fence);
        app::check(vkWaitForFences(a.device, 1, &fence, VK_TRUE, UINT64_MAX), "vkWaitForFences");
        unchecked = {};
        CHECK(qkv::vulkan::testing::live().recordings == live);
        a.wait(fence, cmd);
    }
    // Destroyed before its fence signalled: the fence is forgotten (the application may destroy
    // it), and the word decides, as without one.
    cmd = a.begin();
    VkFence late = VK_NULL_HANDLE;
    app::check(vkCreateFence(a.device, &fence_info, nullptr, &late), "vkCreateFence");
    {
        qkv::vulkan::recording pending = qkv::vulkan::record(call, cmd, p.tensors());
        pending.completes_with(late);
    }
    vkDestroyFence(a.device, late, nullptr);
    CHECK(qkv::vulkan::testing::live().recordings == live + 1);
    app::vulkan_app::host_barrier(cmd);
    a.submit_and_wait(cmd);
    cmd = a.begin();
    {
        // A later record finds its word done and lets it go, never asking the destroyed fence.
        qkv::vulkan::recording again = qkv::vulkan::record(call, cmd, p.tensors());
        CHECK(qkv::vulkan::testing::live().recordings == live + 1);
        app::vulkan_app::host_barrier(cmd);
        a.submit_and_wait(cmd);
        CHECK_THROWS_AS(again.check(), qkv::vulkan::numeric_overflow);
    }
    CHECK(qkv::vulkan::testing::live().recordings == live);
    vkDestroyFence(a.device, other, nullptr);
    CHECK(a.log.count() == 0);
}

TEST_CASE("interop misuse: an append recorded but not run is never seen", "[interop][misuse][cache]") {
    app::vulkan_app a;
    qkv::vulkan::context ctx = context_on(a);
    constexpr std::size_t Hq = 4, Hkv = 2, E = 16, Ev = 8, capacity = 40, first = 5;
    const qkv::kv_layout layout{.batch = 1, .kv_heads = Hkv, .capacity = capacity, .d_qk = E, .d_v = Ev};
    constexpr std::size_t k_bytes = Hkv * capacity * E * 4, v_bytes = Hkv * capacity * Ev * 4;
    app::buffer storage = a.make_buffer(k_bytes + 256 + v_bytes);
    qkv::vulkan::kv_cache cache(ctx, layout,
                                qkv::vulkan::wrap(ctx, storage.handle, 0, k_bytes, {1, Hkv, capacity, E},
                                                  qkv::element_type::f32, app::vulkan_app::all_usage),
                                qkv::vulkan::wrap(ctx, storage.handle, k_bytes + 256, v_bytes, {1, Hkv, capacity, Ev},
                                                  qkv::element_type::f32, app::vulkan_app::all_usage));
    std::mt19937_64 rng(30);
    const std::vector<float> k0 = normal(Hkv * first * E, rng), v0 = normal(Hkv * first * Ev, rng);
    cache.append(k0, v0, first);
    cache.append({}, {}, 0);  // braces still mean host data (and zero rows do nothing)
    CHECK(cache.size() == first);
    // A new row in the application's memory, NaN-free and different from anything held.
    const std::vector<float> k1 = normal(Hkv * E, rng), v1 = normal(Hkv * Ev, rng), q = normal(Hq * E, rng);
    app::buffer rows = a.make_buffer((k1.size() + v1.size()) * 4), qo = a.make_buffer((Hq * E + Hq * Ev) * 4);
    put(rows, 0, k1), put(rows, k1.size(), v1), put(qo, 0, q);
    qkv::vulkan::tensor tk = qkv::vulkan::wrap(ctx, rows.handle, 0, k1.size() * 4, {1, Hkv, 1, E});
    qkv::vulkan::tensor tv = qkv::vulkan::wrap(ctx, rows.handle, k1.size() * 4, v1.size() * 4, {1, Hkv, 1, Ev});
    qkv::vulkan::tensor tq = qkv::vulkan::wrap(ctx, qo.handle, 0, q.size() * 4, {1, Hq, 1, E});
    qkv::vulkan::tensor to = qkv::vulkan::wrap(ctx, qo.handle, q.size() * 4, Hq * Ev * 4, {1, Hq, 1, Ev});
    qkv::sdpa_problem desc;
    desc.shape = {.batch = 1, .q_heads = Hq, .kv_heads = Hkv, .q_len = 1, .kv_len = 0, .d_qk = E, .d_v = Ev};
    qkv::vulkan::sdpa_call decode(ctx, desc, cache);
    const auto want = [&](bool with_new_row) {
        std::vector<float> k, v;
        for (std::size_t h = 0; h < Hkv; ++h) {
            k.insert(k.end(), k0.begin() + static_cast<std::ptrdiff_t>(h * first * E),
                     k0.begin() + static_cast<std::ptrdiff_t>((h + 1) * first * E));
            if (with_new_row)
                k.insert(k.end(), k1.begin() + static_cast<std::ptrdiff_t>(h * E),
                         k1.begin() + static_cast<std::ptrdiff_t>((h + 1) * E));
            v.insert(v.end(), v0.begin() + static_cast<std::ptrdiff_t>(h * first * Ev),
                     v0.begin() + static_cast<std::ptrdiff_t>((h + 1) * first * Ev));
            if (with_new_row)
                v.insert(v.end(), v1.begin() + static_cast<std::ptrdiff_t>(h * Ev),
                         v1.begin() + static_cast<std::ptrdiff_t>((h + 1) * Ev));
        }
        qkv::sdpa_problem host = desc;
        host.shape.kv_len = first + (with_new_row ? 1 : 0);
        host.q = q, host.k = k, host.v = v;
        return qkv::cpu::sdpa_f64(host).output;
    };
    const float* out = qo.data<float>() + q.size();

    // Recorded, never submitted: until the recording goes, every use of the rows elsewhere is
    // refused; when it goes, the row is taken back.
    VkCommandBuffer cmd = a.begin();
    {
        qkv::vulkan::recording append = qkv::vulkan::record_append(cache, cmd, tk, tv, 1);
        CHECK(cache.size() == first + 1);
        CHECK_THROWS_AS(decode.run({.q = &tq, .out = &to}), qkv::invalid_argument);
        CHECK_THROWS_AS(cache.append(k1, v1, 1), qkv::invalid_argument);
        CHECK_THROWS_AS(cache.clear(), qkv::invalid_argument);
        VkCommandBuffer other = a.begin();
        CHECK_THROWS_AS((void)qkv::vulkan::record(decode, other, {.q = &tq, .out = &to}), qkv::invalid_argument);
        CHECK_THROWS_AS((void)qkv::vulkan::record_append(cache, other, tk, tv, 1), qkv::invalid_argument);
        a.discard(other);
        CHECK_THROWS_AS(append.check(), qkv::vulkan::not_complete);
    }
    a.discard(cmd);
    CHECK(cache.size() == first);
    decode.run({.q = &tq, .out = &to});
    CHECK(nmse(out, want(false)) <= 1e-10);

    // Recorded and run: the rows are the cache's once check() has seen it complete.
    cmd = a.begin();
    qkv::vulkan::recording append = qkv::vulkan::record_append(cache, cmd, tk, tv, 1);
    a.submit_and_wait(cmd);
    CHECK_THROWS_AS(decode.run({.q = &tq, .out = &to}), qkv::invalid_argument);
    append.check();
    decode.run({.q = &tq, .out = &to});
    CHECK(nmse(out, want(true)) <= 1e-10);
    // Destroyed after completion without a check: the rows stay.
    cmd = a.begin();
    {
        qkv::vulkan::recording again = qkv::vulkan::record_append(cache, cmd, tk, tv, 1);
        a.submit_and_wait(cmd);
    }
    CHECK(cache.size() == first + 2);
    CHECK_NOTHROW(decode.run({.q = &tq, .out = &to}));
    CHECK(a.log.count() == 0);
}

TEST_CASE("interop misuse: overlapping tensors are refused on every call that takes tensors", "[interop][misuse]") {
    app::vulkan_app a;
    qkv::vulkan::context ctx = context_on(a);
    misuse_problem p(a, ctx);
    qkv::vulkan::sdpa_call call(ctx, p.desc);
    using P = misuse_problem;
    // out over v's last 4 bytes, in the same buffer.
    app::buffer both = a.make_buffer((P::end + P::no) * 4);
    put(both, P::v_at, p.v);
    qkv::vulkan::tensor v = qkv::vulkan::wrap(ctx, both.handle, P::v_at * 4, P::nv * 4, {1, P::Hkv, P::S, P::Ev});
    qkv::vulkan::tensor out = qkv::vulkan::wrap(ctx, both.handle, (P::end - 1) * 4, P::no * 4, {1, P::Hq, P::L, P::Ev});
    VkCommandBuffer cmd = a.begin();
    CHECK_THROWS_WITH((void)qkv::vulkan::record(call, cmd, {.q = &p.tq, .k = &p.tk, .v = &v, .out = &out}),
                      Catch::Matchers::Contains("overlap"));
    CHECK_THROWS_WITH(call.run({.q = &p.tq, .k = &p.tk, .v = &v, .out = &out}), Catch::Matchers::Contains("overlap"));
    // q as its own output (same shape when E = Ev): in place is refused too.
    qkv::sdpa_problem square = p.desc;
    square.shape.d_v = square.shape.d_qk;
    qkv::vulkan::sdpa_call same(ctx, square);
    qkv::vulkan::tensor wide_v = qkv::vulkan::wrap(ctx, both.handle, 0, P::nk * 4, {1, P::Hkv, P::S, P::E});
    CHECK_THROWS_WITH(same.run({.q = &p.tq, .k = &p.tk, .v = &wide_v, .out = &p.tq}),
                      Catch::Matchers::Contains("overlap"));
    // Apart by one element: fine.
    qkv::vulkan::tensor apart = qkv::vulkan::wrap(ctx, both.handle, P::end * 4, P::no * 4, {1, P::Hq, P::L, P::Ev});
    qkv::vulkan::recording r = qkv::vulkan::record(call, cmd, {.q = &p.tq, .k = &p.tk, .v = &v, .out = &apart});
    app::vulkan_app::host_barrier(cmd);
    a.submit_and_wait(cmd);
    r.check();
    // Self-attention: out over x.
    qkv::attention_problem att;
    att.shape = {.batch = 1, .seq = 3, .d_in = 4, .d_k = 4, .d_v = 4};
    qkv::vulkan::attention_call acall(ctx, att);
    qkv::vulkan::tensor x = qkv::vulkan::wrap(ctx, both.handle, 0, 48, {1, 3, 4}),
                        w = qkv::vulkan::wrap(ctx, both.handle, 64, 64, {4, 4}),
                        aout = qkv::vulkan::wrap(ctx, both.handle, 40, 48, {1, 3, 4});
    CHECK_THROWS_WITH(acall.run({.x = &x, .wq = &w, .wk = &w, .wv = &w, .out = &aout}),
                      Catch::Matchers::Contains("overlap"));
    // An append whose rows are read from the cache's own storage.
    constexpr std::size_t cap = 8;
    app::buffer storage = a.make_buffer(2 * cap * 16);
    const auto texels = [&](VkDeviceSize at) {
        return qkv::vulkan::wrap(ctx, storage.handle, at, cap * 16, {1, 1, cap, 4}, qkv::element_type::f32,
                                 app::vulkan_app::all_usage);
    };
    qkv::vulkan::kv_cache cache(ctx, {.batch = 1, .kv_heads = 1, .capacity = cap, .d_qk = 4, .d_v = 4}, texels(0),
                                texels(cap * 16));
    qkv::vulkan::tensor row = qkv::vulkan::wrap(ctx, storage.handle, 16, 16, {1, 1, 1, 4});
    qkv::vulkan::tensor other = qkv::vulkan::wrap(ctx, p.in.handle, 0, 16, {1, 1, 1, 4});
    CHECK_THROWS_WITH(cache.append(row, other, 1), Catch::Matchers::Contains("overlap"));
    CHECK(cache.size() == 0);
    // The cache's K and V storage over each other.
    CHECK_THROWS_WITH(qkv::vulkan::kv_cache(ctx, {.batch = 1, .kv_heads = 1, .capacity = cap, .d_qk = 4, .d_v = 4},
                                            texels(0), texels(64)),
                      Catch::Matchers::Contains("overlap"));
    CHECK(a.log.count() == 0);
}

TEST_CASE("interop misuse: a buffer range beyond the VkBuffer, a transposed shape, a usage the buffer lacks",
          "[interop][misuse]") {
    app::vulkan_app a;
    qkv::vulkan::context ctx = context_on(a);
    // The range: offset + size past the buffer's end is refused at wrap; VK_WHOLE_SIZE is the rest.
    app::buffer small = a.make_buffer(1024);
    CHECK_THROWS_AS(qkv::vulkan::wrap(ctx, small.handle, 0, 4096, {1024}), qkv::invalid_argument);
    CHECK_THROWS_AS(qkv::vulkan::wrap(ctx, small.handle, 512, 1024, {256}), qkv::invalid_argument);
    CHECK_THROWS_AS(qkv::vulkan::wrap(ctx, small.handle, 8192, VK_WHOLE_SIZE, {4}), qkv::invalid_argument);
    qkv::vulkan::tensor rest = qkv::vulkan::wrap(ctx, small.handle, 512, VK_WHOLE_SIZE, {128});
    CHECK(rest.bytes() == 512);

    // The shape: Q as (B, L, H, E), FlashAttention's layout, where qkv's is (B, H, L, E).
    misuse_problem p(a, ctx);
    using P = misuse_problem;
    qkv::vulkan::sdpa_call call(ctx, p.desc);
    qkv::vulkan::tensor blhe = qkv::vulkan::wrap(ctx, p.in.handle, P::q_at * 4, P::nq * 4, {1, P::L, P::Hq, P::E});
    VkCommandBuffer cmd = a.begin();
    CHECK_THROWS_WITH((void)qkv::vulkan::record(call, cmd, {.q = &blhe, .k = &p.tk, .v = &p.tv, .out = &p.to}),
                      Catch::Matchers::Contains("(1, 3, 4, 16)") && Catch::Matchers::Contains("(1, 4, 3, 16)"));
    CHECK_THROWS_AS(call.run({.q = &blhe, .k = &p.tk, .v = &p.tv, .out = &p.to}), qkv::invalid_argument);
    // The same bytes as (H, L, E), a dimension of 1 left out: the same layout, accepted and right.
    qkv::vulkan::tensor hle = qkv::vulkan::wrap(ctx, p.in.handle, P::q_at * 4, P::nq * 4, {P::Hq, P::L, P::E});
    p.clear_output();
    qkv::vulkan::recording r = qkv::vulkan::record(call, cmd, {.q = &hle, .k = &p.tk, .v = &p.tv, .out = &p.to});
    app::vulkan_app::host_barrier(cmd);
    a.submit_and_wait(cmd);
    r.check();
    CHECK(p.error() <= 1e-10);

    // The usage: a buffer made without UNIFORM_TEXEL_BUFFER cannot be a cache's storage.
    constexpr VkBufferUsageFlags storage_only = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT;
    constexpr std::size_t cap = 8;
    app::buffer plain = a.make_buffer(2 * cap * 16, storage_only);
    CHECK_THROWS_AS(qkv::vulkan::kv_cache(ctx, {.batch = 1, .kv_heads = 1, .capacity = cap, .d_qk = 4, .d_v = 4},
                                          qkv::vulkan::wrap(ctx, plain.handle, 0, cap * 16, {1, 1, cap, 4},
                                                            qkv::element_type::f32, storage_only),
                                          qkv::vulkan::wrap(ctx, plain.handle, cap * 16, cap * 16, {1, 1, cap, 4},
                                                            qkv::element_type::f32, storage_only)),
                    qkv::invalid_argument);
    // ... nor be uploaded to or downloaded from (no transfer usage), nor wrapped without STORAGE.
    qkv::vulkan::tensor t = qkv::vulkan::wrap(ctx, plain.handle, 0, 16, {4}, qkv::element_type::f32, storage_only);
    CHECK_THROWS_AS(t.download(), qkv::invalid_argument);
    qkv::vulkan::tensor u = qkv::vulkan::wrap(ctx, plain.handle, 0, 16, {4}, qkv::element_type::f32, storage_only);
    CHECK_THROWS_AS(u.upload(std::vector<float>{1, 2, 3, 4}), qkv::invalid_argument);
    CHECK_THROWS_AS(
        qkv::vulkan::wrap(ctx, plain.handle, 0, 16, {4}, qkv::element_type::f32, VK_BUFFER_USAGE_TRANSFER_SRC_BIT),
        qkv::invalid_argument);
    CHECK(a.log.count() == 0);
}

TEST_CASE("interop misuse: recordings destroyed unchecked keep nothing alive once the qkv objects are gone",
          "[interop][misuse][cache]") {
    // A destroyed recording whose commands qkv has not seen complete is kept by the context's
    // device core; it must not keep that core (and with it qkv's pipelines, pools and buffers)
    // alive after the application destroyed its last qkv object, before its vkDestroyDevice.
    const qkv::vulkan::testing::live_objects before = qkv::vulkan::testing::live();
    app::vulkan_app a;
    {
        qkv::vulkan::context ctx = context_on(a);
        constexpr std::size_t Hq = 2, Hkv = 1, E = 8, capacity = 8, first = 3;
        const qkv::kv_layout layout{.batch = 1, .kv_heads = Hkv, .capacity = capacity, .d_qk = E, .d_v = E};
        constexpr std::size_t bytes = Hkv * capacity * E * 4;
        app::buffer storage = a.make_buffer(2 * bytes);
        qkv::vulkan::kv_cache cache(ctx, layout,
                                    qkv::vulkan::wrap(ctx, storage.handle, 0, bytes, {1, Hkv, capacity, E},
                                                      qkv::element_type::f32, app::vulkan_app::all_usage),
                                    qkv::vulkan::wrap(ctx, storage.handle, bytes, bytes, {1, Hkv, capacity, E},
                                                      qkv::element_type::f32, app::vulkan_app::all_usage));
        std::mt19937_64 rng(31);
        cache.append(normal(Hkv * first * E, rng), normal(Hkv * first * E, rng), first);
        app::buffer rows = a.make_buffer(2 * Hkv * E * 4), qo = a.make_buffer(2 * Hq * E * 4);
        put(rows, 0, normal(2 * Hkv * E, rng)), put(qo, 0, normal(Hq * E, rng));
        qkv::vulkan::tensor tk = qkv::vulkan::wrap(ctx, rows.handle, 0, Hkv * E * 4, {1, Hkv, 1, E});
        qkv::vulkan::tensor tv = qkv::vulkan::wrap(ctx, rows.handle, Hkv * E * 4, Hkv * E * 4, {1, Hkv, 1, E});
        qkv::vulkan::tensor tq = qkv::vulkan::wrap(ctx, qo.handle, 0, Hq * E * 4, {1, Hq, 1, E});
        qkv::vulkan::tensor to = qkv::vulkan::wrap(ctx, qo.handle, Hq * E * 4, Hq * E * 4, {1, Hq, 1, E});
        qkv::sdpa_problem desc;
        desc.shape = {.batch = 1, .q_heads = Hq, .kv_heads = Hkv, .q_len = 1, .kv_len = 0, .d_qk = E, .d_v = E};
        qkv::vulkan::sdpa_call decode(ctx, desc, cache);
        // Run, then destroyed without a check: kept until a later call finds them done.
        VkCommandBuffer cmd = a.begin();
        {
            qkv::vulkan::recording append = qkv::vulkan::record_append(cache, cmd, tk, tv, 1);
            qkv::vulkan::recording step = qkv::vulkan::record(decode, cmd, {.q = &tq, .out = &to});
            a.submit_and_wait(cmd);
        }
        CHECK(cache.size() == first + 1);
        // Never submitted: kept until the core goes.
        VkCommandBuffer never = a.begin();
        { qkv::vulkan::recording unrun = qkv::vulkan::record(decode, never, {.q = &tq, .out = &to}); }
        a.discard(never);
        CHECK(qkv::vulkan::testing::live().recordings > before.recordings);
        CHECK(qkv::vulkan::testing::live().device_cores == before.device_cores + 1);
    }
    // Every qkv object is gone: so is everything qkv made on the application's device.
    CHECK(qkv::vulkan::testing::live().device_cores == before.device_cores);
    CHECK(qkv::vulkan::testing::live().recordings == before.recordings);
    CHECK(a.log.count() == 0);
}

TEST_CASE("interop: a planned call has built its pipelines; record() and run() create none", "[interop]") {
    app::vulkan_app a;
    qkv::vulkan::context ctx = context_on(a);
    const auto created = [] { return qkv::vulkan::testing::pipelines_created(); };
    // sdpa over tensors, and its backward, at a shape no earlier call of this context planned.
    misuse_problem p(a, ctx);
    qkv::sdpa_backward_problem bdesc;
    bdesc.forward = p.desc;
    bdesc.forward.options.causal = true;
    qkv::sdpa_problem fdesc = bdesc.forward;
    fdesc.options.return_lse = true;
    std::size_t before = created();
    qkv::vulkan::sdpa_call call(ctx, fdesc);
    CHECK(created() > before);  // the counter counts: planning built them
    qkv::vulkan::sdpa_backward_call backward(ctx, bdesc);
    constexpr std::size_t Hq = misuse_problem::Hq, L = misuse_problem::L, Ev = misuse_problem::Ev;
    app::buffer grads = a.make_buffer((misuse_problem::end + 2 * Hq * L * Ev + Hq * L) * 4);
    std::size_t at = 0;
    const auto place = [&](std::size_t n, std::vector<std::size_t> shape) {
        qkv::vulkan::tensor t = qkv::vulkan::wrap(ctx, grads.handle, at * 4, n * 4, std::move(shape));
        at += n;
        return t;
    };
    qkv::vulkan::tensor dq = place(misuse_problem::nq, {1, Hq, L, misuse_problem::E}),
                        dk = place(misuse_problem::nk, {1, misuse_problem::Hkv, misuse_problem::S, misuse_problem::E}),
                        dv = place(misuse_problem::nv, {1, misuse_problem::Hkv, misuse_problem::S, Ev}),
                        d_out = place(Hq * L * Ev, {1, Hq, L, Ev}), out = place(Hq * L * Ev, {1, Hq, L, Ev}),
                        lse = place(Hq * L, {1, Hq, L});
    std::mt19937_64 rng(32);
    put(grads, misuse_problem::nq + misuse_problem::nk + misuse_problem::nv, normal(Hq * L * Ev, rng));  // d_out
    // self-attention
    constexpr std::size_t N = 5, d_in = 6, d = 8;
    app::buffer mem = a.make_buffer((N * d_in + 3 * d_in * d + N * d) * 4);
    put(mem, 0, normal(N * d_in + 3 * d_in * d, rng));
    qkv::vulkan::tensor tx = qkv::vulkan::wrap(ctx, mem.handle, 0, N * d_in * 4, {N, d_in});
    qkv::vulkan::tensor wq = qkv::vulkan::wrap(ctx, mem.handle, N * d_in * 4, d_in * d * 4, {d_in, d});
    qkv::vulkan::tensor wk = qkv::vulkan::wrap(ctx, mem.handle, (N * d_in + d_in * d) * 4, d_in * d * 4, {d_in, d});
    qkv::vulkan::tensor wv = qkv::vulkan::wrap(ctx, mem.handle, (N * d_in + 2 * d_in * d) * 4, d_in * d * 4, {d_in, d});
    qkv::vulkan::tensor ao = qkv::vulkan::wrap(ctx, mem.handle, (N * d_in + 3 * d_in * d) * 4, N * d * 4, {N, d});
    qkv::attention_problem adesc;
    adesc.shape = {.batch = 1, .seq = N, .d_in = d_in, .d_k = d, .d_v = d, .heads = 2};
    qkv::vulkan::attention_call attention(ctx, adesc);

    before = created();
    VkCommandBuffer cmd = a.begin();
    qkv::vulkan::recording rf =
        qkv::vulkan::record(call, cmd, {.q = &p.tq, .k = &p.tk, .v = &p.tv, .out = &out, .lse = &lse});
    qkv::vulkan::recording rb = qkv::vulkan::record(backward, cmd,
                                                    {.q = &p.tq,
                                                     .k = &p.tk,
                                                     .v = &p.tv,
                                                     .out = &out,
                                                     .lse = &lse,
                                                     .d_out = &d_out,
                                                     .dq = &dq,
                                                     .dk = &dk,
                                                     .dv = &dv});
    qkv::vulkan::recording ra =
        qkv::vulkan::record(attention, cmd, {.x = &tx, .wq = &wq, .wk = &wk, .wv = &wv, .out = &ao});
    app::vulkan_app::host_barrier(cmd);
    a.submit_and_wait(cmd);
    CHECK(created() == before);
    rf.check(), rb.check(), ra.check();
    call.run({.q = &p.tq, .k = &p.tk, .v = &p.tv, .out = &out, .lse = &lse});
    backward.run({.q = &p.tq,
                  .k = &p.tk,
                  .v = &p.tv,
                  .out = &out,
                  .lse = &lse,
                  .d_out = &d_out,
                  .dq = &dq,
                  .dk = &dk,
                  .dv = &dv});
    CHECK(created() == before);

    // A decode over a cache: its kernels are those of the rows the cache holds when it is planned,
    // and stay the same as the cache grows, by an append recorded before it or by the host.
    constexpr std::size_t Hkv = 2, E = 16, capacity = 12, first = 4;
    qkv::vulkan::kv_cache cache(ctx,
                                qkv::kv_layout{.batch = 1, .kv_heads = Hkv, .capacity = capacity, .d_qk = E, .d_v = E});
    cache.append(normal(Hkv * first * E, rng), normal(Hkv * first * E, rng), first);
    qkv::sdpa_problem ddesc;
    ddesc.shape = {.batch = 1, .q_heads = 4, .kv_heads = Hkv, .q_len = 1, .kv_len = 0, .d_qk = E, .d_v = E};
    qkv::vulkan::sdpa_call decode(ctx, ddesc, cache);
    qkv::vulkan::tensor q(ctx, {1, 4, 1, E}), o(ctx, {1, 4, 1, E}), k1(ctx, {1, Hkv, 1, E}), v1(ctx, {1, Hkv, 1, E});
    q.upload(normal(4 * E, rng)), k1.upload(normal(Hkv * E, rng)), v1.upload(normal(Hkv * E, rng));
    before = created();
    cmd = a.begin();
    qkv::vulkan::recording step = qkv::vulkan::record(decode, cmd, {.q = &q, .out = &o});
    qkv::vulkan::recording grow = qkv::vulkan::record_append(cache, cmd, k1, v1, 1);
    qkv::vulkan::recording next = qkv::vulkan::record(decode, cmd, {.q = &q, .out = &o});
    app::vulkan_app::host_barrier(cmd);
    a.submit_and_wait(cmd);
    step.check(), grow.check(), next.check();
    cache.append(normal(Hkv * E, rng), normal(Hkv * E, rng), 1);
    decode.run({.q = &q, .out = &o});
    CHECK(cache.size() == first + 2);
    CHECK(created() == before);
    CHECK(a.log.count() == 0);
}

TEST_CASE("interop: two appends into one pool row through a device table fail the recording's check",
          "[interop][paged]") {
    // Sequences 0 and 1 name one page as their second (a table on the device, i32) and their new
    // rows meet there: recorded into the application's command buffer and submitted, check() fails
    // with invalid_argument naming the table, and the pool is as it was (the claims live in fresh,
    // poisoned memory: only the words this step claims are cleared, by its own commands). The table
    // fixed on the device, the same call recorded again runs as the float64 reference says.
    app::vulkan_app a;
    qkv::vulkan::context ctx = context_on(a);
    qkv_test::owned_paged o = qkv_test::random_paged({.kv_lens = {21, 20, 19},
                                                      .q_len = 1,
                                                      .q_heads = 4,
                                                      .kv_heads = 2,
                                                      .d_qk = 16,
                                                      .d_v = 8,
                                                      .page_size = 16,
                                                      .shares = {{0, 0}, {0, 2}, {0, 0}},
                                                      .seed = 83});
    o.problem.options = {.causal = true, .alignment = qkv::causal_alignment::bottom_right};
    o.problem.cascade = false;
    qkv::paged_problem before_ref = o.problem;  // every row the append would write, as it was
    const std::vector<std::int32_t> full_lengths = o.seqlens;
    before_ref.cache_seqlens = full_lengths;
    qkv_test::make_appends(o, 3, 84);  // sequence 0 writes rows 2..4 of its second page, sequence 1 rows 1..3
    const qkv::paged_problem& p = o.problem;
    const std::size_t B = 3, Hq = 4, Hkv = 2, E = 16, Ev = 8, rows = p.num_pages * p.page_size;
    std::vector<float> k(rows * Hkv * E), v(rows * Hkv * Ev);  // the pool (1, Hkv, rows, E)
    for (std::size_t n = 0; n < rows; ++n)
        for (std::size_t h = 0; h < Hkv; ++h) {
            for (std::size_t e = 0; e < E; ++e) k[(h * rows + n) * E + e] = p.k_pages[(n * Hkv + h) * E + e];
            for (std::size_t e = 0; e < Ev; ++e) v[(h * rows + n) * Ev + e] = p.v_pages[(n * Hkv + h) * Ev + e];
        }
    qkv::vulkan::kv_cache pool(ctx, {.batch = 1, .kv_heads = Hkv, .capacity = rows, .d_qk = E, .d_v = Ev});
    pool.append(k, v, rows);
    const auto host_of = [](qkv::paged_problem x) {
        x.k_pages = {}, x.v_pages = {}, x.num_pages = 0;
        return x;
    };
    qkv::paged_problem desc = host_of(p);
    desc.q = {}, desc.k_new = {}, desc.v_new = {}, desc.block_table = {}, desc.cache_seqlens = {};
    qkv::vulkan::paged_call call(ctx, desc, pool);
    qkv::vulkan::tensor tq(ctx, {B, 1, Hq, E}), to(ctx, {B, 1, Hq, Ev});
    qkv::vulkan::tensor tk(ctx, {B, 3, Hkv, E}), tv(ctx, {B, 3, Hkv, Ev});
    qkv::vulkan::tensor table(ctx, {B, p.max_pages}, qkv::element_type::i32);
    tq.upload(o.q), tk.upload(o.k_new), tv.upload(o.v_new), table.upload(o.table);
    const qkv::vulkan::paged_tensors t{
        .q = &tq, .out = &to, .k_new = &tk, .v_new = &tv, .block_table_tensor = &table, .cache_seqlens = o.seqlens};
    {
        VkCommandBuffer cmd = a.begin();
        qkv::vulkan::recording r = qkv::vulkan::record(call, cmd, t);
        app::vulkan_app::host_barrier(cmd);
        a.submit_and_wait(cmd);
        bool refused = false;
        try {
            r.check();
        } catch (const qkv::invalid_argument& e) {
            refused = true;
            const std::string message = e.what();
            INFO(message);
            CHECK(message.find("found on the device") != std::string::npos);
            CHECK(message.find("same row of the pool") != std::string::npos);
        }
        CHECK(refused);
    }
    const std::vector<double> want_before = qkv::cpu::sdpa_f64(before_ref).output;
    CHECK(nmse(ctx.sdpa(host_of(before_ref), pool).output.data(), want_before) <= 1e-10);  // nothing written
    // Sequence 1's second page moved to one no sequence names, on the device.
    std::vector<std::int32_t> fixed(o.table);
    std::int32_t spare = 0;
    while (std::find(fixed.begin(), fixed.end(), spare) != fixed.end()) ++spare;
    fixed[p.max_pages + 1] = spare;
    table.upload(fixed);
    VkCommandBuffer cmd = a.begin();
    qkv::vulkan::recording r = qkv::vulkan::record(call, cmd, t);
    app::vulkan_app::host_barrier(cmd);
    a.submit_and_wait(cmd);
    r.check();
    qkv::paged_problem want = p;
    want.block_table = fixed;
    CHECK(nmse(to.download().data(), qkv_test::kvcache_reference(want).output) <= 1e-10);
    CHECK(a.log.count() == 0);
}
