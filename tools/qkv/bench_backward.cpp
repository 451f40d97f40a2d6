// `qkv bench --backward`: the backward pass (context::sdpa_backward, FlashAttention-2's algorithm)
// beside the forward (context::sdpa with its lse) on the same data and device, alternating so both
// see the same machine load: each one's device time (GPU timestamps, else the host clock around
// the call) and the ratio backward / forward, FlashAttention-2's figure of merit (about 2.5 on its
// GPUs); with timestamps also the dq kernel's and the dk/dv kernel's medians over the forward's
// (call_stats::backward_dq_ms, backward_dkdv_ms), where the backward's time goes.
#include <algorithm>
#include <cmath>
#include <iostream>
#include <random>
#include <utility>
#include <vector>

#include "bench.hpp"
#include "names.hpp"
#include "qkv/vulkan/error.hpp"

namespace qkv::cli::bench {

json run_backward(qkv::vulkan::context& ctx, const backward_config& bc, int warmup, int repeat, std::uint64_t seed,
                  std::ostream& os) {
    const bool device_clock = ctx.device().timestamps;
    os << "Backward beside forward (B = " << bc.batch << ", H = " << bc.heads << ", Hkv = " << bc.kv_heads
       << ", L = S = N, Ev = d), " << (device_clock ? "device time of the kernels" : "host clock around each call")
       << ", median (min-max) ms:\n\n"
       << "|     N |   d | causal | prec | kernel      | forward ms          | backward ms         "
          "| backward / forward |   dq / forward | dk/dv / forward |\n"
       << "|------:|----:|:------:|:----:|:------------|:--------------------|:--------------------"
          "|-------------------:|---------------:|----------------:|\n";
    json rows = json::array();
    for (const std::size_t n : bc.seq)
        for (const std::size_t d : bc.dim)
            for (const qkv::sdpa_options& options : bc.options) {
                std::mt19937_64 rng(seed + n * 131 + d);
                std::normal_distribution<float> unit(0.0f, 1.0f);
                const auto values = [&](std::size_t count) {
                    std::vector<float> v(count);
                    for (float& x : v) x = unit(rng);
                    return v;
                };
                const std::vector<float> q = values(bc.batch * bc.heads * n * d),
                                         k = values(bc.batch * bc.kv_heads * n * d),
                                         v = values(bc.batch * bc.kv_heads * n * d),
                                         d_out = values(bc.batch * bc.heads * n * d);
                qkv::sdpa_problem p{.shape = {.batch = bc.batch,
                                              .q_heads = bc.heads,
                                              .kv_heads = bc.kv_heads,
                                              .q_len = n,
                                              .kv_len = n,
                                              .d_qk = d,
                                              .d_v = d},
                                    .q = q,
                                    .k = k,
                                    .v = v,
                                    .options = options};
                p.options.return_lse = true;
                std::vector<double> forward_ms, backward_ms, dq_ms, dkdv_ms;
                char lead[80];
                std::snprintf(lead, sizeof lead, "| %5zu | %3zu | %-6s | %-4s | %-11s | ", n, d,
                              options.causal ? "yes" : "no", name_of(options.precision), name_of(options.kernel));
                json row{{"seq", n},
                         {"dim", d},
                         {"causal", options.causal},
                         {"precision", name_of(options.precision)},
                         {"kernel", name_of(options.kernel)}};
                // A configuration the device cannot take (a kernel family it lacks, fp32 with the
                // cooperative-matrix family, its limits or memory) is a skipped row that says why.
                const auto skip = [&](const std::exception& e) {
                    os << lead << "skipped: " << e.what() << " |\n";
                    os.flush();
                    row["skipped"] = e.what();
                    rows.push_back(row);
                };
                try {
                    for (int i = 0; i < warmup + repeat; ++i) {
                        const qkv::sdpa_output out = ctx.sdpa(p);
                        const double f = device_clock ? ctx.last_call().attention_ms : ctx.last_call().host_ms;
                        const qkv::sdpa_backward_problem b{
                            .forward = p, .out = out.output, .lse = out.lse, .d_out = d_out};
                        const qkv::sdpa_gradients g = ctx.sdpa_backward(b);
                        const double bw = device_clock ? ctx.last_call().attention_ms : ctx.last_call().host_ms;
                        if (i == 0)  // time only calls that compute something real
                            for (const std::vector<float>* t : {&g.dq, &g.dk, &g.dv})
                                if (!std::all_of(t->begin(), t->end(), [](float x) { return std::isfinite(x); }))
                                    throw qkv::vulkan::error("a gradient has NaN or Inf: not timing a broken result");
                        if (i >= warmup) {
                            forward_ms.push_back(f), backward_ms.push_back(bw);
                            dq_ms.push_back(ctx.last_call().backward_dq_ms);
                            dkdv_ms.push_back(ctx.last_call().backward_dkdv_ms);
                        }
                    }
                } catch (const qkv::vulkan::limit_exceeded& e) {
                    skip(e);
                    continue;
                } catch (const qkv::vulkan::out_of_memory& e) {
                    skip(e);
                    continue;
                } catch (const qkv::vulkan::unavailable& e) {
                    skip(e);
                    continue;
                }
                const summary f = summarise(forward_ms), b = summarise(backward_ms);
                const summary dq = summarise(dq_ms), dkdv = summarise(dkdv_ms);
                // No split where the backward does not measure one (call_stats::backward_dq_ms).
                const bool split = device_clock && dq.max > 0 && dkdv.max > 0;
                const auto part = [&](const summary& s, std::size_t width) {
                    std::string t = split ? fixed(s.median / f.median, 2) + "x" : "-";
                    if (t.size() < width) t.insert(0, width - t.size(), ' ');
                    return t;
                };
                const auto cell = [](const summary& s) {
                    std::string t = sig3(s.median) + " (" + sig3(s.min) + "-" + sig3(s.max) + ")";
                    t.resize(std::max<std::size_t>(t.size(), 19), ' ');
                    return t;
                };
                os << lead << cell(f) << " | " << cell(b) << " | " << fixed(b.median / f.median, 2) << "x | "
                   << part(dq, 14) << " | " << part(dkdv, 15) << " |\n";
                os.flush();
                row["forward_ms"] = summary_json(f), row["backward_ms"] = summary_json(b);
                row["backward_over_forward"] = b.median / f.median;
                if (split) {
                    row["backward_dq_ms"] = summary_json(dq), row["backward_dkdv_ms"] = summary_json(dkdv);
                    row["dq_over_forward"] = dq.median / f.median, row["dkdv_over_forward"] = dkdv.median / f.median;
                }
                rows.push_back(std::move(row));
            }
    return json{{"batch", bc.batch},
                {"heads", bc.heads},
                {"kv_heads", bc.kv_heads},
                {"device_clock", device_clock},
                {"rows", rows}};
}

}  // namespace qkv::cli::bench
