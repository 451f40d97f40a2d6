// `qkv bench --varlen B`: a ragged batch of B causal self-attention sequences (prefill, L_b = S_b)
// whose lengths are drawn log-uniform in [16, --seq] from the seed, timed three ways on the same
// device and data: one ragged call (context::sdpa over a varlen_problem: every sequence in one
// command buffer), B separate context::sdpa calls, and one call padded to the longest (B, Hq,
// max L, max S) with a bool mask on the padded keys. Tokens per second are the batch's real tokens
// (sum of L_b) over the median time. Each form's process CPU time (std::clock: the host thread and
// lavapipe's worker threads alike) is printed beside its wall time: on a CPU device shared with
// other work, it is the work done, where the wall time is mostly the wait for a core.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <iostream>
#include <random>
#include <vector>

#include "bench.hpp"
#include "qkv/runtime/varlen.hpp"

namespace qkv::cli::bench {

std::vector<std::size_t> batch_draws::lengths(const varlen_config& c) {
    std::uniform_real_distribution<double> log_len(std::log(16.0), std::log(static_cast<double>(c.max_len)));
    std::vector<std::size_t> len(c.batch);
    for (std::size_t& l : len)
        l = std::clamp<std::size_t>(static_cast<std::size_t>(std::exp(log_len(rng))), 16, c.max_len);
    return len;
}

std::vector<float> batch_draws::values(std::size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = normal(rng);
    return v;
}

qkv::sdpa_options batch_options(const varlen_config& c) {
    qkv::sdpa_options options;
    options.causal = true;
    options.alignment = qkv::causal_alignment::bottom_right;
    options.precision = c.precision;
    options.kv_type = c.kv_type;
    return options;
}

double ms_since(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

double cpu_ms_since(std::clock_t c) {
    return 1000.0 * static_cast<double>(std::clock() - c) / static_cast<double>(CLOCKS_PER_SEC);
}

json run_varlen(qkv::vulkan::context& ctx, const varlen_config& vc, int warmup, int repeat, std::uint64_t seed,
                std::ostream& os) {
    const std::size_t B = vc.batch, Hq = vc.q_heads, Hkv = vc.kv_heads, d = vc.dim;
    batch_draws draw(seed);
    const std::vector<std::size_t> len = draw.lengths(vc);
    std::vector<std::int32_t> cu{0};
    for (const std::size_t l : len) cu.push_back(cu.back() + static_cast<std::int32_t>(l));
    const std::size_t total = static_cast<std::size_t>(cu.back()), longest = *std::max_element(len.begin(), len.end());
    const std::vector<float> q = draw.values(total * Hq * d), k = draw.values(total * Hkv * d),
                             v = draw.values(total * Hkv * d);
    const qkv::sdpa_options options = batch_options(vc);
    const qkv::varlen_problem ragged{.q_heads = Hq,
                                     .kv_heads = Hkv,
                                     .d_qk = d,
                                     .d_v = d,
                                     .cu_seqlens_q = cu,
                                     .cu_seqlens_k = cu,
                                     .max_seqlen_q = longest,
                                     .max_seqlen_k = longest,
                                     .q = q,
                                     .k = k,
                                     .v = v,
                                     .options = options};
    // The separate calls' problems, and the padded batch: each sequence's rows at the start of its
    // (Hq, longest, d) block, the padded keys masked (the padded queries computed and dropped).
    std::vector<qkv::basic_varlen_sequence<float>> one;
    for (std::size_t b = 0; b < B; ++b) one.push_back(qkv::sequence_of(ragged, b));
    std::vector<float> pq(B * Hq * longest * d, 0.0f), pk(B * Hkv * longest * d, 0.0f), pv(pk.size(), 0.0f);
    std::vector<std::uint8_t> mask(B * longest, 0);
    for (std::size_t b = 0; b < B; ++b) {
        const auto place = [&](const std::vector<float>& from, std::vector<float>& to, std::size_t heads) {
            for (std::size_t h = 0; h < heads; ++h)
                std::copy_n(from.begin() + static_cast<std::ptrdiff_t>(h * len[b] * d), len[b] * d,
                            to.begin() + static_cast<std::ptrdiff_t>(((b * heads + h) * longest) * d));
        };
        place(one[b].q, pq, Hq), place(one[b].k, pk, Hkv), place(one[b].v, pv, Hkv);
        std::fill_n(mask.begin() + static_cast<std::ptrdiff_t>(b * longest), len[b], std::uint8_t{1});
    }
    qkv::sdpa_problem padded;
    padded.shape = {
        .batch = B, .q_heads = Hq, .kv_heads = Hkv, .q_len = longest, .kv_len = longest, .d_qk = d, .d_v = d};
    padded.q = pq, padded.k = pk, padded.v = pv;
    padded.mask = mask;
    padded.mask_shape = {B, 1, 1, longest};
    padded.options = options;

    using clock = std::chrono::steady_clock;
    // The three forms in turn, so that all see the same machine load.
    std::vector<double> ragged_ms, separate_ms, padded_ms, ragged_cpu, separate_cpu, padded_cpu;
    double max_diff = 0;
    for (int i = 0; i < warmup + repeat; ++i) {
        auto t = clock::now();
        std::clock_t cpu = std::clock();
        const qkv::varlen_output r = ctx.sdpa(ragged);
        const double a = ms_since(t), a_cpu = cpu_ms_since(cpu);
        t = clock::now(), cpu = std::clock();
        for (const auto& s : one) (void)ctx.sdpa(s.problem);
        const double b = ms_since(t), b_cpu = cpu_ms_since(cpu);
        t = clock::now(), cpu = std::clock();
        const qkv::sdpa_output p = ctx.sdpa(padded);
        const double c = ms_since(t), c_cpu = cpu_ms_since(cpu);
        if (i >= warmup) {
            ragged_ms.push_back(a), separate_ms.push_back(b), padded_ms.push_back(c);
            ragged_cpu.push_back(a_cpu), separate_cpu.push_back(b_cpu), padded_cpu.push_back(c_cpu);
        }
        if (i == 0)  // the ragged and padded forms agree on the real rows
            for (std::size_t s = 0; s < B; ++s)
                for (std::size_t h = 0; h < Hq; ++h)
                    for (std::size_t row = 0; row < len[s]; ++row)
                        for (std::size_t e = 0; e < d; ++e)
                            max_diff = std::max<double>(
                                max_diff,
                                std::abs(r.output[((static_cast<std::size_t>(cu[s]) + row) * Hq + h) * d + e] -
                                         p.output[((s * Hq + h) * longest + row) * d + e]));
    }
    const summary rs = summarise(ragged_ms), ss = summarise(separate_ms), ps = summarise(padded_ms);
    const summary rc = summarise(ragged_cpu), sc = summarise(separate_cpu), pc = summarise(padded_cpu);
    const auto tokens = [&](const summary& s) { return static_cast<double>(total) / (s.median / 1000.0); };
    std::size_t shortest = *std::min_element(len.begin(), len.end());
    os << "Ragged batch: " << B << " causal sequences, lengths log-uniform in [16, " << vc.max_len << "] (shortest "
       << shortest << ", longest " << longest << ", " << total << " tokens; padded: " << B * longest << "), Hq = " << Hq
       << ", Hkv = " << Hkv << ", d = " << d << ", " << (vc.precision == qkv::precision::fp16 ? "fp16" : "fp32")
       << ":\n"
       << "  one ragged call (one command buffer):  median " << fixed(rs.median, 3) << " ms (min " << fixed(rs.min, 3)
       << ", max " << fixed(rs.max, 3) << "), " << sig3(tokens(rs)) << " tokens/s; CPU " << fixed(rc.median, 1)
       << " ms\n"
       << "  " << B << " separate calls:                   median " << fixed(ss.median, 3) << " ms (min "
       << fixed(ss.min, 3) << ", max " << fixed(ss.max, 3) << "), " << sig3(tokens(ss)) << " tokens/s; CPU "
       << fixed(sc.median, 1) << " ms\n"
       << "  one call padded to the longest:         median " << fixed(ps.median, 3) << " ms (min " << fixed(ps.min, 3)
       << ", max " << fixed(ps.max, 3) << "), " << sig3(tokens(ps)) << " tokens/s; CPU " << fixed(pc.median, 1)
       << " ms\n"
       << "  ragged / separate: " << fixed(rs.median / ss.median, 2)
       << ", ragged / padded: " << fixed(rs.median / ps.median, 2) << " (CPU time: " << fixed(rc.median / sc.median, 2)
       << ", " << fixed(rc.median / pc.median, 2) << "); largest |ragged - padded| " << sig3(max_diff) << "\n";
    return json{{"batch", B},
                {"lengths", len},
                {"tokens", total},
                {"q_heads", Hq},
                {"kv_heads", Hkv},
                {"dim", d},
                {"precision", vc.precision == qkv::precision::fp16 ? "fp16" : "fp32"},
                {"ragged_ms", summary_json(rs)},
                {"separate_ms", summary_json(ss)},
                {"padded_ms", summary_json(ps)},
                {"ragged_cpu_ms", summary_json(rc)},
                {"separate_cpu_ms", summary_json(sc)},
                {"padded_cpu_ms", summary_json(pc)},
                {"ragged_over_separate", rs.median / ss.median},
                {"ragged_over_padded", rs.median / ps.median},
                {"max_abs_diff_ragged_padded", max_diff}};
}

}  // namespace qkv::cli::bench
