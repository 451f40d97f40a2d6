// `qkv bench --decode --layers N`: one token of an N-layer decoder's attention, timed two ways on
// the same device, data and kernels: N host calls (context::sdpa against each layer's kv_cache:
// q up, the output down, a submit and a fence wait each), and N planned calls recorded into one
// command buffer (qkv::vulkan::sequence over device tensors: q already on the device, one submit).
#include <chrono>
#include <ctime>
#include <iostream>
#include <random>
#include <vector>

#include "bench.hpp"
#include "qkv/vulkan/kv_cache.hpp"
#include "qkv/vulkan/sequence.hpp"

namespace qkv::cli::bench {

json run_layers(qkv::vulkan::context& ctx, const layers_config& lc, int warmup, int repeat, std::uint64_t seed,
                std::ostream& os) {
    const std::size_t N = lc.layers, Hq = lc.q_heads, Hkv = lc.kv_heads, S = lc.kv_len, d = lc.dim;
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const auto values = [&](std::size_t n) {
        std::vector<float> v(n);
        for (float& x : v) x = normal(rng);
        return v;
    };
    qkv::sdpa_problem desc;
    desc.shape = {.batch = 1, .q_heads = Hq, .kv_heads = Hkv, .q_len = 1, .kv_len = 0, .d_qk = d, .d_v = d};
    desc.options.precision = lc.precision;
    const qkv::element_type type =
        lc.precision == qkv::precision::fp16 ? qkv::element_type::f16 : qkv::element_type::f32;
    std::vector<qkv::vulkan::kv_cache> caches;
    std::vector<qkv::vulkan::sdpa_call> calls;
    std::vector<qkv::vulkan::tensor> qs, outs;
    std::vector<std::vector<float>> host_q;
    for (std::size_t l = 0; l < N; ++l) {
        caches.emplace_back(
            ctx, qkv::kv_layout{.batch = 1, .kv_heads = Hkv, .capacity = S, .d_qk = d, .d_v = d, .type = type});
        caches.back().append(values(Hkv * S * d), values(Hkv * S * d), S);
        calls.emplace_back(ctx, desc, caches.back());
        host_q.push_back(values(Hq * d));
        qs.emplace_back(ctx, std::vector<std::size_t>{1, Hq, 1, d}, type);
        qs.back().upload(host_q.back());
        outs.emplace_back(ctx, std::vector<std::size_t>{1, Hq, 1, d});
    }
    using clock = std::chrono::steady_clock;
    // One token both ways, alternating, so both see the same machine load.
    std::vector<double> host_ms, recorded_ms, host_cpu, recorded_cpu;
    // Process CPU time beside the wall times: on a shared, loaded machine the scheduler moves the
    // wall times of the two forms differently (a long submit competes as one CPU-bound task; a call
    // that waits on each fence is woken with priority), while their CPU times do not move.
    qkv::vulkan::sequence seq(ctx);
    for (int i = 0; i < warmup + repeat; ++i) {
        auto t = clock::now();
        std::clock_t c = std::clock();
        for (std::size_t l = 0; l < N; ++l) {
            qkv::sdpa_problem p = desc;
            p.q = host_q[l];
            (void)ctx.sdpa(p, caches[l]);
        }
        const double host = ms_since(t), host_c = cpu_ms_since(c);
        t = clock::now();
        c = std::clock();
        for (std::size_t l = 0; l < N; ++l) seq.record(calls[l], {.q = &qs[l], .out = &outs[l]});
        seq.run();
        const double recorded = ms_since(t), recorded_c = cpu_ms_since(c);
        if (i >= warmup) {
            host_ms.push_back(host), recorded_ms.push_back(recorded);
            host_cpu.push_back(host_c), recorded_cpu.push_back(recorded_c);
        }
    }
    const summary host = summarise(host_ms), recorded = summarise(recorded_ms);
    const summary host_c = summarise(host_cpu), recorded_c = summarise(recorded_cpu);
    os << "Decode, " << N << " layers per token (L = 1, S = " << S << ", Hq = " << Hq << ", Hkv = " << Hkv
       << ", d = " << d << ", " << (lc.precision == qkv::precision::fp16 ? "fp16" : "fp32") << "), per token:\n"
       << "  " << N << " host calls (q up, output down, a submit each):   median " << fixed(host.median, 3)
       << " ms (min " << fixed(host.min, 3) << ", max " << fixed(host.max, 3) << ")\n"
       << "  recorded into one command buffer, one submit:    median " << fixed(recorded.median, 3) << " ms (min "
       << fixed(recorded.min, 3) << ", max " << fixed(recorded.max, 3) << ")\n"
       << "  recorded / host: " << fixed(recorded.median / host.median, 2) << "\n";
    os << "  process CPU time (every thread), median: host calls " << fixed(host_c.median, 3) << " ms, recorded "
       << fixed(recorded_c.median, 3) << " ms, recorded / host " << fixed(recorded_c.median / host_c.median, 2) << "\n";
    const json cpu{{"host_ms", summary_json(host_c)},
                   {"recorded_ms", summary_json(recorded_c)},
                   {"recorded_over_host", recorded_c.median / host_c.median}};
    return json{{"layers", N},
                {"kv_len", S},
                {"q_heads", Hq},
                {"kv_heads", Hkv},
                {"dim", d},
                {"precision", lc.precision == qkv::precision::fp16 ? "fp16" : "fp32"},
                {"host_ms", summary_json(host)},
                {"recorded_ms", summary_json(recorded)},
                {"recorded_over_host", recorded.median / host.median},
                {"process_cpu", cpu}};
}

}  // namespace qkv::cli::bench
