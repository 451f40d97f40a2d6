// `qkv bench --serve B`: one continuous-batching decode step. B sequences, lengths drawn
// log-uniform in [16, --seq] from the seed, each with one new query (L = 1, causal bottom-right)
// against its cached keys, timed four ways on the same device and data:
//   - one batched paged call against the pool on the device: context::sdpa over a paged_problem
//     and a kv_cache holding the pool's pages (pages of 16 rows in shuffled order, a block table
//     per sequence), filled before the timing: the batched paged decode;
//   - one batched paged call with the pool on the host: context::sdpa over a paged_problem (its
//     rows gathered on the host and uploaded every call);
//   - B separate calls: context::sdpa against B per-sequence kv_caches (filled before the timing);
//   - one call padded to the longest: a kv_cache of B rows of max S_b keys, the padded keys masked
//     (skipped, and said so, where its K or V would not fit the device's largest buffer or both
//     would pass 4 GiB).
// Each form runs its own warm-up and timed rounds in turn (as a server repeats one step). Tokens per
// second are the batch's B new tokens over the median time; each form's process CPU
// time (std::clock: the host thread and lavapipe's workers alike) is printed beside its wall time.
// "Work" is the sum over the sequences of S_b: the padded form does B·max S_b.
//
// With --shared-prefix P, every sequence begins with the same P rows (a common prompt) in the same
// pages, its drawn length after them, and the call against the pool on the device is timed twice:
// with the shared prefix attended once per group (cascade, paged_problem::cascade) and without.
// With --prefix-tree R (and --shared-prefix), a prefix tree of two levels: after the prompt, each
// of --prefix-groups groups of consecutive sequences shares R more rows (a few-shot prefix) in its
// own pages, then each sequence's drawn length. The call against the pool on the device is then
// timed three ways: the two-level cascade (the tables as they are), one level (the same rows, but
// the second level's pages copied into pages of each sequence's own, so that only the prompt is
// shared), and without cascade.
// With --recorded, the call against the pool on the device is also timed over device tensors
// (qkv::vulkan::paged_call made once, q uploaded once, the step's table and lengths given with the
// tensors each step, so each step is planned and recorded as a server's): run, and recorded into a
// sequence and run; its output must equal the host call's bits. And with the lengths as an i32
// device tensor (paged_tensors::cache_seqlens_tensor, no cascade): its plan is made for each table
// row's keys, not the lengths, so its time against the host lengths' is the balance it loses.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <iostream>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "bench.hpp"
#include "qkv/runtime/kv_layout.hpp"
#include "qkv/runtime/paged.hpp"
#include "qkv/vulkan/error.hpp"
#include "qkv/vulkan/kv_cache.hpp"
#include "qkv/vulkan/paged_call.hpp"
#include "qkv/vulkan/sequence.hpp"
#include "qkv/vulkan/tensor.hpp"

namespace qkv::cli::bench {

json run_serve(qkv::vulkan::context& ctx, const varlen_config& vc, int warmup, int repeat, std::uint64_t seed,
               std::ostream& os) {
    const std::size_t B = vc.batch, Hq = vc.q_heads, Hkv = vc.kv_heads, d = vc.dim, page = 16;
    batch_draws draw(seed);
    const std::size_t prompt = vc.shared_prefix, prompt_pages = prompt / page;  // whole pages: bench.cpp checks
    const std::size_t tree = vc.prefix_tree, tree_pages = tree / page, groups = tree ? vc.prefix_groups : 0;
    const auto group_of = [&](std::size_t b) { return b * groups / B; };  // consecutive, as even as B allows
    std::vector<std::size_t> len = draw.lengths(vc);
    for (std::size_t& l : len) l += prompt + tree;  // the prompt, the group's prefix, each one's drawn length
    const std::size_t keys = std::accumulate(len.begin(), len.end(), std::size_t{0});
    const std::size_t longest = *std::max_element(len.begin(), len.end());
    // The pool: sequence b's pages drawn from a shuffled list; its keys row j % 16 of its page j / 16.
    // The prompt's pages come first in the list and open every sequence's row of the table; then
    // each group's prefix pages (after the prompt in its members' rows), then (with a tree) every
    // sequence's copy of its group's prefix pages (the one-level tables), then each one's own.
    const std::size_t shared_pages = prompt_pages + groups * tree_pages, copies = tree ? B * tree_pages : 0;
    std::vector<std::size_t> first_page(B + 1, shared_pages + copies);
    for (std::size_t b = 0; b < B; ++b) first_page[b + 1] = first_page[b] + (len[b] - prompt - tree + page - 1) / page;
    const std::size_t pages = first_page[B], columns = (longest + page - 1) / page;
    std::vector<std::int32_t> order(pages);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), draw.rng);
    std::vector<std::int32_t> table(B * columns, 0), seqlens, one_level;
    for (std::size_t b = 0; b < B; ++b) {
        for (std::size_t i = 0; i < prompt_pages; ++i) table[b * columns + i] = order[i];
        for (std::size_t i = 0; i < tree_pages; ++i)
            table[b * columns + prompt_pages + i] = order[prompt_pages + group_of(b) * tree_pages + i];
        for (std::size_t i = first_page[b]; i < first_page[b + 1]; ++i)
            table[b * columns + prompt_pages + tree_pages + i - first_page[b]] = order[i];
        seqlens.push_back(static_cast<std::int32_t>(len[b]));
    }
    std::vector<float> k_pool = draw.values(pages * page * Hkv * d), v_pool = draw.values(pages * page * Hkv * d);
    if (tree) {  // the one-level tables: b's copies of its group's prefix pages, the same rows
        one_level = table;
        const std::size_t row = page * Hkv * d;  // floats of a page: (16, Hkv, d)
        for (std::size_t b = 0; b < B; ++b)
            for (std::size_t i = 0; i < tree_pages; ++i) {
                const auto from = static_cast<std::size_t>(table[b * columns + prompt_pages + i]);
                const std::int32_t to = order[shared_pages + b * tree_pages + i];
                one_level[b * columns + prompt_pages + i] = to;
                for (std::vector<float>* pool_values : {&k_pool, &v_pool})
                    std::copy_n(pool_values->begin() + static_cast<std::ptrdiff_t>(from * row), row,
                                pool_values->begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(to) * row));
            }
    }
    const std::vector<float> q = draw.values(B * Hq * d);
    const qkv::sdpa_options options = batch_options(vc);
    const qkv::paged_problem paged{.q_heads = Hq,
                                   .kv_heads = Hkv,
                                   .d_qk = d,
                                   .d_v = d,
                                   .page_size = page,
                                   .num_pages = pages,
                                   .k_pages = k_pool,
                                   .v_pages = v_pool,
                                   .max_pages = columns,
                                   .block_table = table,
                                   .cache_seqlens = seqlens,
                                   .q_len = 1,
                                   .q = q,
                                   .options = options};
    // Each sequence's rows in (Hkv, S_b, d) order, gathered from the pool once: the separate caches'
    // and the padded cache's contents.
    const qkv::basic_gathered_pages<float> gathered = qkv::gather_pages(paged);
    const qkv::element_type stored = qkv::stored_kv_type(options);
    const auto rows_of = [&](const std::vector<float>& packed, std::size_t b) {
        std::vector<float> out(Hkv * len[b] * d);
        const auto k0 = static_cast<std::size_t>(gathered.cu_seqlens_k[b]);
        for (std::size_t h = 0; h < Hkv; ++h)
            for (std::size_t j = 0; j < len[b]; ++j)
                std::copy_n(packed.begin() + static_cast<std::ptrdiff_t>(((k0 + j) * Hkv + h) * d), d,
                            out.begin() + static_cast<std::ptrdiff_t>((h * len[b] + j) * d));
        return out;
    };
    // The pool on the device: a kv_cache of one batch whose rows are the pages' rows, (Hkv, pool rows,
    // d), appended a slice of rows at a time (the pool is (pool rows, Hkv, d)); past the device's
    // maxStorageBufferRange it is read only through texel views, and skipped, and said so, where
    // even those would not reach it (maxTexelBufferElements: a kv_cache's limit).
    const std::size_t pool_rows = pages * page;
    std::optional<qkv::vulkan::kv_cache> pool;
    std::string pool_refused;
    try {
        pool.emplace(ctx, qkv::kv_layout{
                              .batch = 1, .kv_heads = Hkv, .capacity = pool_rows, .d_qk = d, .d_v = d, .type = stored});
    } catch (const qkv::vulkan::limit_exceeded& e) {
        pool_refused = e.what();
    } catch (const qkv::vulkan::out_of_memory& e) {
        pool_refused = e.what();
    }
    for (std::size_t n0 = 0; pool && n0 < pool_rows; n0 += 4096) {
        const std::size_t n = std::min<std::size_t>(4096, pool_rows - n0);
        std::vector<float> ks(Hkv * n * d), vs(Hkv * n * d);
        for (std::size_t h = 0; h < Hkv; ++h)
            for (std::size_t j = 0; j < n; ++j) {
                const auto from = static_cast<std::ptrdiff_t>(((n0 + j) * Hkv + h) * d);
                std::copy_n(k_pool.begin() + from, d, ks.begin() + static_cast<std::ptrdiff_t>((h * n + j) * d));
                std::copy_n(v_pool.begin() + from, d, vs.begin() + static_cast<std::ptrdiff_t>((h * n + j) * d));
            }
        pool->append(ks, vs, n);
    }
    qkv::paged_problem on_device = paged;
    on_device.k_pages = {}, on_device.v_pages = {}, on_device.num_pages = 0;
    qkv::paged_problem no_cascade = on_device;  // the same call, every sequence over all its keys
    no_cascade.cascade = false;
    const bool cascade = pool && prompt > 0;
    qkv::paged_problem flat_tree = on_device;  // the same rows, only the prompt's pages shared
    flat_tree.block_table = one_level;
    const bool two_levels = cascade && tree > 0;
    std::vector<qkv::vulkan::kv_cache> caches;
    std::vector<std::vector<float>> one_q(B);
    std::vector<qkv::sdpa_problem> one(B);
    for (std::size_t b = 0; b < B; ++b) {
        caches.emplace_back(
            ctx, qkv::kv_layout{.batch = 1, .kv_heads = Hkv, .capacity = len[b], .d_qk = d, .d_v = d, .type = stored});
        caches.back().append(rows_of(gathered.k, b), rows_of(gathered.v, b), len[b]);
        // q (1, Hq, 1, d) from the paged problem's (B, 1, Hq, d)
        one_q[b].assign(q.begin() + static_cast<std::ptrdiff_t>(b * Hq * d),
                        q.begin() + static_cast<std::ptrdiff_t>((b + 1) * Hq * d));
        one[b].shape = {.batch = 1, .q_heads = Hq, .kv_heads = Hkv, .q_len = 1, .kv_len = 0, .d_qk = d, .d_v = d};
        one[b].q = one_q[b];
        one[b].options = options;
    }
    // The padded form: (B, Hkv, longest, d), each sequence's rows first, the rest zeros and masked;
    // skipped where one of its K and V would not fit the device's largest buffer, or both pass 4 GiB.
    const double padded_bytes = static_cast<double>(B * Hkv * longest) * static_cast<double>(qkv::bytes_for(stored, d));
    const bool pad = padded_bytes <= static_cast<double>(ctx.device().max_storage_buffer_range) &&
                     2 * padded_bytes <= 4.0 * 1073741824.0;
    std::vector<qkv::vulkan::kv_cache> padded_cache;
    std::vector<std::uint8_t> mask;
    std::vector<float> padded_q;
    qkv::sdpa_problem padded;
    if (pad) {
        std::vector<float> pk(B * Hkv * longest * d, 0.0f), pv(pk.size(), 0.0f);
        mask.assign(B * longest, 0);
        for (std::size_t b = 0; b < B; ++b) {
            const std::vector<float> kb = rows_of(gathered.k, b), vb = rows_of(gathered.v, b);
            for (std::size_t h = 0; h < Hkv; ++h) {
                std::copy_n(kb.begin() + static_cast<std::ptrdiff_t>(h * len[b] * d), len[b] * d,
                            pk.begin() + static_cast<std::ptrdiff_t>((b * Hkv + h) * longest * d));
                std::copy_n(vb.begin() + static_cast<std::ptrdiff_t>(h * len[b] * d), len[b] * d,
                            pv.begin() + static_cast<std::ptrdiff_t>((b * Hkv + h) * longest * d));
            }
            std::fill_n(mask.begin() + static_cast<std::ptrdiff_t>(b * longest), len[b], std::uint8_t{1});
        }
        padded_cache.emplace_back(
            ctx, qkv::kv_layout{.batch = B, .kv_heads = Hkv, .capacity = longest, .d_qk = d, .d_v = d, .type = stored});
        padded_cache.back().append(pk, pv, longest);
        padded_q = q;  // (B, 1, Hq, d) is (B, Hq, 1, d)
        padded.shape = {.batch = B, .q_heads = Hq, .kv_heads = Hkv, .q_len = 1, .kv_len = 0, .d_qk = d, .d_v = d};
        padded.q = padded_q;
        padded.mask = mask;
        padded.mask_shape = {B, 1, 1, longest};
        padded.options = options;
        padded.options.alignment = qkv::causal_alignment::top_left;  // the query sees every real key via the mask
        padded.options.causal = false;
    }

    using clock = std::chrono::steady_clock;
    std::vector<double> device_ms, paged_ms, separate_ms, padded_ms, device_cpu, paged_cpu, separate_cpu, padded_cpu;
    std::vector<double> flat_ms, flat_cpu;    // the device form without cascade
    std::vector<double> level_ms, level_cpu;  // the device form with one level of cascade
    // The device's own time (context::last_call().device_ms: timestamps around each command
    // buffer; for the separate calls their sum) of the device-pool and separate forms.
    std::vector<double> device_gpu, separate_gpu, unused_gpu;
    double round_gpu = 0;
    double max_diff = 0;
    // Each form in its own rounds (its warm-up, then its timed rounds), as a server repeats one step:
    // no form pays for the buffers another left in the context.
    const auto time_form = [&](auto&& call, std::vector<double>& wall, std::vector<double>& cpu_ms,
                               std::vector<double>& gpu_ms) {
        for (int i = 0; i < warmup + repeat; ++i) {
            round_gpu = 0;
            const auto t = clock::now();
            const std::clock_t cpu = std::clock();
            call(i);
            const double w = ms_since(t), c = cpu_ms_since(cpu);
            if (i >= warmup) wall.push_back(w), cpu_ms.push_back(c), gpu_ms.push_back(round_gpu);
        }
    };
    qkv::varlen_output dr, fr, lr, r;
    std::vector<qkv::sdpa_output> each(B);
    qkv::sdpa_output p;
    if (pool)
        time_form(
            [&](int i) {
                if (i == 0)
                    dr = ctx.sdpa(on_device, *pool);
                else
                    (void)ctx.sdpa(on_device, *pool);
                round_gpu = ctx.last_call().device_ms;
            },
            device_ms, device_cpu, device_gpu);
    else
        device_ms.push_back(0), device_cpu.push_back(0), device_gpu.push_back(0);
    if (cascade)
        time_form(
            [&](int i) {
                if (i == 0)
                    fr = ctx.sdpa(no_cascade, *pool);
                else
                    (void)ctx.sdpa(no_cascade, *pool);
            },
            flat_ms, flat_cpu, unused_gpu);
    else
        flat_ms.push_back(0), flat_cpu.push_back(0);
    if (two_levels)
        time_form(
            [&](int i) {
                if (i == 0)
                    lr = ctx.sdpa(flat_tree, *pool);
                else
                    (void)ctx.sdpa(flat_tree, *pool);
            },
            level_ms, level_cpu, unused_gpu);
    else
        level_ms.push_back(0), level_cpu.push_back(0);
    time_form(
        [&](int i) {
            if (i == 0)
                r = ctx.sdpa(paged);
            else
                (void)ctx.sdpa(paged);
        },
        paged_ms, paged_cpu, unused_gpu);
    time_form(
        [&](int i) {
            for (std::size_t b = 0; b < B; ++b) {
                if (i == 0)
                    each[b] = ctx.sdpa(one[b], caches[b]);
                else
                    (void)ctx.sdpa(one[b], caches[b]);
                round_gpu += ctx.last_call().device_ms;
            }
        },
        separate_ms, separate_cpu, separate_gpu);
    if (pad)
        time_form(
            [&](int i) {
                if (i == 0)
                    p = ctx.sdpa(padded, padded_cache.front());
                else
                    (void)ctx.sdpa(padded, padded_cache.front());
            },
            padded_ms, padded_cpu, unused_gpu);
    else
        padded_ms.push_back(0), padded_cpu.push_back(0);
    // --recorded: the device-pool call over tensors, run and in a sequence; its bits the host call's.
    const bool recorded = pool && vc.recorded;
    std::vector<double> call_ms, call_cpu, seq_ms, seq_cpu, lengths_ms, lengths_cpu;
    bool same_bits = true;
    double lengths_diff = 0;  // the device lengths' largest |difference| from the host call
    if (recorded) {
        qkv::paged_problem desc = on_device;
        desc.q = {}, desc.block_table = {}, desc.cache_seqlens = {};
        qkv::vulkan::paged_call call(ctx, desc, *pool);
        qkv::vulkan::tensor tq(ctx, {B, 1, Hq, d}), to(ctx, {B, 1, Hq, d});
        tq.upload(q);
        const qkv::vulkan::paged_tensors t{
            .q = &tq, .out = &to, .block_table = on_device.block_table, .cache_seqlens = on_device.cache_seqlens};
        time_form([&](int) { call.run(t); }, call_ms, call_cpu, unused_gpu);
        same_bits = to.download() == dr.output;
        qkv::vulkan::sequence seq(ctx);
        time_form(
            [&](int) {
                seq.record(call, t);
                seq.run();
            },
            seq_ms, seq_cpu, unused_gpu);
        same_bits = same_bits && to.download() == dr.output;
        qkv::paged_problem flat = desc;  // lengths on the device: no shared prefixes
        flat.cascade = false;
        qkv::vulkan::paged_call device_lengths(ctx, flat, *pool);
        qkv::vulkan::tensor lengths(ctx, {B}, qkv::element_type::i32);
        lengths.upload(on_device.cache_seqlens);
        const qkv::vulkan::paged_tensors lt{
            .q = &tq, .out = &to, .block_table = on_device.block_table, .cache_seqlens_tensor = &lengths};
        time_form([&](int) { device_lengths.run(lt); }, lengths_ms, lengths_cpu, unused_gpu);
        const std::vector<float> got = to.download();
        for (std::size_t i = 0; i < got.size(); ++i)
            lengths_diff = std::max<double>(lengths_diff, std::abs(got[i] - dr.output[i]));
    }
    // the forms agree: (B, 1, Hq, d) against each (1, Hq, 1, d) and (B, Hq, 1, d)
    for (std::size_t b = 0; b < B; ++b)
        for (std::size_t e = 0; e < Hq * d; ++e) {
            max_diff = std::max<double>(max_diff, std::abs(r.output[b * Hq * d + e] - each[b].output[e]));
            if (pool) max_diff = std::max<double>(max_diff, std::abs(dr.output[b * Hq * d + e] - each[b].output[e]));
            if (cascade) max_diff = std::max<double>(max_diff, std::abs(fr.output[b * Hq * d + e] - each[b].output[e]));
            if (two_levels)
                max_diff = std::max<double>(max_diff, std::abs(lr.output[b * Hq * d + e] - each[b].output[e]));
            if (pad)
                max_diff = std::max<double>(max_diff, std::abs(r.output[b * Hq * d + e] - p.output[b * Hq * d + e]));
        }
    const summary ds = summarise(device_ms), rs = summarise(paged_ms), ss = summarise(separate_ms),
                  ps = summarise(padded_ms);
    const summary fs = summarise(flat_ms), fc = summarise(flat_cpu);
    const summary ls = summarise(level_ms), lc = summarise(level_cpu);
    const summary dc = summarise(device_cpu), rc = summarise(paged_cpu), sc = summarise(separate_cpu),
                  pc = summarise(padded_cpu);
    const summary dg = summarise(device_gpu), sg = summarise(separate_gpu);
    const auto tokens = [&](const summary& x) { return static_cast<double>(B) / (x.median / 1000.0); };
    const std::size_t shortest = *std::min_element(len.begin(), len.end());
    os << "Serving step: " << B << " sequences decoding one token each, cached lengths ";
    if (prompt) os << "a shared prompt of " << prompt << " rows plus ";
    if (tree) os << "a prefix of " << tree << " rows shared in each of " << groups << " groups plus ";
    os << "log-uniform in [16, " << vc.max_len << "] (shortest " << shortest << ", longest " << longest << ", " << keys
       << " keys; padded: " << B * longest << "), pages of " << page << ", Hq = " << Hq << ", Hkv = " << Hkv
       << ", d = " << d << ", " << (vc.precision == qkv::precision::fp16 ? "fp16" : "fp32");
    if (vc.kv_type) os << ", K/V stored as " << qkv::to_string(stored);
    os << ":\n"
       << "  one batched paged call, pool on the device: ";
    if (pool)
        os << "median " << fixed(ds.median, 3) << " ms (min " << fixed(ds.min, 3) << ", max " << fixed(ds.max, 3)
           << "), " << sig3(tokens(ds)) << " tokens/s; CPU " << fixed(dc.median, 1) << " ms; device "
           << fixed(dg.median, 1) << " ms\n";
    else
        os << "skipped (" << pool_refused << ")\n";
    if (two_levels)
        os << "  the same with one level of cascade (group prefix per sequence): median " << fixed(ls.median, 3)
           << " ms (min " << fixed(ls.min, 3) << ", max " << fixed(ls.max, 3) << "), " << sig3(tokens(ls))
           << " tokens/s; CPU " << fixed(lc.median, 1) << " ms\n";
    if (cascade)
        os << "  the same without cascade (prompt per sequence): median " << fixed(fs.median, 3) << " ms (min "
           << fixed(fs.min, 3) << ", max " << fixed(fs.max, 3) << "), " << sig3(tokens(fs)) << " tokens/s; CPU "
           << fixed(fc.median, 1) << " ms\n";
    os << "  one batched paged call, pool on the host:   median " << fixed(rs.median, 3) << " ms (min "
       << fixed(rs.min, 3) << ", max " << fixed(rs.max, 3) << "), " << sig3(tokens(rs)) << " tokens/s; CPU "
       << fixed(rc.median, 1) << " ms\n"
       << "  " << B << " separate calls (kv_caches):               median " << fixed(ss.median, 3) << " ms (min "
       << fixed(ss.min, 3) << ", max " << fixed(ss.max, 3) << "), " << sig3(tokens(ss)) << " tokens/s; CPU "
       << fixed(sc.median, 1) << " ms; device " << fixed(sg.median, 1) << " ms\n";
    const summary cs = summarise(call_ms.empty() ? std::vector<double>{0} : call_ms),
                  cc = summarise(call_cpu.empty() ? std::vector<double>{0} : call_cpu),
                  qs = summarise(seq_ms.empty() ? std::vector<double>{0} : seq_ms),
                  qc = summarise(seq_cpu.empty() ? std::vector<double>{0} : seq_cpu),
                  ts = summarise(lengths_ms.empty() ? std::vector<double>{0} : lengths_ms),
                  tc = summarise(lengths_cpu.empty() ? std::vector<double>{0} : lengths_cpu);
    if (recorded)
        os << "  the same over tensors (paged_call::run):    median " << fixed(cs.median, 3) << " ms (min "
           << fixed(cs.min, 3) << ", max " << fixed(cs.max, 3) << "), " << sig3(tokens(cs)) << " tokens/s; CPU "
           << fixed(cc.median, 1) << " ms\n"
           << "  the same recorded in a sequence:            median " << fixed(qs.median, 3) << " ms (min "
           << fixed(qs.min, 3) << ", max " << fixed(qs.max, 3) << "), " << sig3(tokens(qs)) << " tokens/s; CPU "
           << fixed(qc.median, 1) << " ms; over tensors / host call " << fixed(cs.median / ds.median, 2)
           << ", sequence / host call " << fixed(qs.median / ds.median, 2) << ", "
           << (same_bits ? "the host call's bits" : "NOT the host call's bits") << "\n"
           << "  over tensors, lengths a device tensor:      median " << fixed(ts.median, 3) << " ms (min "
           << fixed(ts.min, 3) << ", max " << fixed(ts.max, 3) << "), " << sig3(tokens(ts)) << " tokens/s; CPU "
           << fixed(tc.median, 1) << " ms; tensor lengths / host lengths " << fixed(ts.median / cs.median, 2)
           << " (planned for the table rows' keys, no cascade); largest |difference| " << sig3(lengths_diff) << "\n";
    if (pad)
        os << "  one call padded to the longest:             median " << fixed(ps.median, 3) << " ms (min "
           << fixed(ps.min, 3) << ", max " << fixed(ps.max, 3) << "), " << sig3(tokens(ps)) << " tokens/s; CPU "
           << fixed(pc.median, 1) << " ms\n";
    else
        os << "  one call padded to the longest:             skipped (its K cache would take "
           << fixed(padded_bytes / 1048576.0, 0) << " MiB; the device's largest buffer holds "
           << fixed(static_cast<double>(ctx.device().max_storage_buffer_range) / 1048576.0, 0) << " MiB)\n";
    os << "  ";
    if (two_levels)
        os << "one level / two levels of cascade: " << fixed(ls.median / ds.median, 2) << " (CPU time "
           << fixed(lc.median / dc.median, 2) << "); ";
    if (cascade)
        os << "without / with cascade: " << fixed(fs.median / ds.median, 2) << " (CPU time "
           << fixed(fc.median / dc.median, 2) << "); ";
    if (pool)
        os << "separate / paged on the device: " << fixed(ss.median / ds.median, 2) << " (CPU time "
           << fixed(sc.median / dc.median, 2) << ", device time " << fixed(sg.median / dg.median, 2) << "); ";
    os << "separate / paged on the host: " << fixed(ss.median / rs.median, 2) << " (CPU time "
       << fixed(sc.median / rc.median, 2) << ")";
    if (pad) os << ", padded / paged: " << fixed(ps.median / rs.median, 2);
    os << "; largest |difference| between the forms " << sig3(max_diff) << "\n";
    json j{{"batch", B},
           {"lengths", len},
           {"keys", keys},
           {"page_size", page},
           {"shared_prefix", prompt},
           {"prefix_tree", tree},
           {"prefix_groups", groups},
           {"q_heads", Hq},
           {"kv_heads", Hkv},
           {"dim", d},
           {"precision", vc.precision == qkv::precision::fp16 ? "fp16" : "fp32"},
           {"kv_type", std::string(qkv::to_string(stored))},
           {"paged_ms", summary_json(rs)},
           {"separate_ms", summary_json(ss)},
           {"paged_cpu_ms", summary_json(rc)},
           {"separate_cpu_ms", summary_json(sc)},
           {"separate_over_paged", ss.median / rs.median},
           {"max_abs_diff", max_diff}};
    if (pool) {
        j["device_paged_ms"] = summary_json(ds);
        j["device_paged_cpu_ms"] = summary_json(dc);
        j["separate_over_device_paged"] = ss.median / ds.median;
        j["device_paged_device_ms"] = summary_json(dg);
        j["separate_device_ms"] = summary_json(sg);
        j["separate_over_device_paged_device_time"] = sg.median / dg.median;
    }
    if (recorded) {
        j["paged_call_ms"] = summary_json(cs);
        j["paged_call_cpu_ms"] = summary_json(cc);
        j["paged_call_sequence_ms"] = summary_json(qs);
        j["paged_call_sequence_cpu_ms"] = summary_json(qc);
        j["paged_call_over_device_paged"] = cs.median / ds.median;
        j["paged_call_sequence_over_device_paged"] = qs.median / ds.median;
        j["paged_call_same_bits"] = same_bits;
        j["paged_call_tensor_lengths_ms"] = summary_json(ts);
        j["paged_call_tensor_lengths_cpu_ms"] = summary_json(tc);
        j["paged_call_tensor_lengths_over_host_lengths"] = ts.median / cs.median;
        j["paged_call_tensor_lengths_max_difference"] = lengths_diff;
    }
    if (cascade) {
        j["device_paged_no_cascade_ms"] = summary_json(fs);
        j["device_paged_no_cascade_cpu_ms"] = summary_json(fc);
        j["no_cascade_over_cascade"] = fs.median / ds.median;
    }
    if (two_levels) {
        j["device_paged_one_level_ms"] = summary_json(ls);
        j["device_paged_one_level_cpu_ms"] = summary_json(lc);
        j["one_level_over_two_levels"] = ls.median / ds.median;
    }
    if (pad) {
        j["padded_ms"] = summary_json(ps);
        j["padded_cpu_ms"] = summary_json(pc);
        j["padded_over_paged"] = ps.median / rs.median;
    }
    return j;
}

}  // namespace qkv::cli::bench
