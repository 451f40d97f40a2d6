// `qkv bench`: timing one configuration (attention(), or sdpa against a kv_cache), and the
// tutorial's tiny call.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "bench.hpp"
#include "names.hpp"
#include "qkv/tutorial.hpp"
#include "qkv/vulkan/error.hpp"
#include "qkv/vulkan/kv_cache.hpp"

namespace qkv::cli::bench {

summary summarise(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    const double median = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    return {median, v.front(), v.back()};
}

double attention_flops(const config& c) {
    if (c.decode)  // 2·L·S·(E + Ev) per query head; causal (bottom-right) hides little when L << S; a window
                   // is counted as the whole S (so its GFLOP/s is the full call's work over its time)
        return 2.0 * static_cast<double>(c.batch * c.heads * c.seq * c.kv_seq * (c.dim + c.ev()));
    const double n = static_cast<double>(c.seq);
    const double f = 4.0 * static_cast<double>(c.batch * c.heads * c.dim) * n * n;
    return c.options.causal ? f / 2 : f;
}
double projection_flops(const config& c) {
    if (c.decode) return 0;
    const double width = static_cast<double>(c.heads * c.dim);
    return 2.0 * static_cast<double>(c.batch * c.seq) * width * 3.0 * width;
}
double kv_bytes(const config& c) {
    const qkv::element_type t = qkv::stored_kv_type(c.options);
    const double element = static_cast<double>(qkv::bytes_per_block(t)) / static_cast<double>(qkv::block_size(t));
    return static_cast<double>(c.batch * c.kv_heads * c.kv_seq * (c.dim + c.ev())) * element;
}

qkv::sdpa_options sdpa_base() {
    qkv::sdpa_options o;
    o.alignment = qkv::causal_alignment::bottom_right;
    return o;
}

std::string rules_of(const config& c) {
    // causal, precision and the kernel have columns of their own.
    std::string s =
        options_label(c.options, c.decode ? sdpa_base() : qkv::sdpa_options{}, {"causal", "precision", "kernel"});
    if (c.sinks) s += (s.empty() ? "" : " ") + std::string("sinks");
    return s.empty() ? "-" : s;
}

/// "staged", "fused cpu" (the family that ran), "decode cpu split", or "fused auto" for a
/// configuration not yet run.
std::string impl_name(const config& c, qkv::kernel_family ran) {
    const char* family = name_of(ran == qkv::kernel_family::automatic ? c.options.kernel : ran);
    if (c.decode && c.host_kv) return std::string("sdpa ") + family;
    if (c.decode) return std::string("decode ") + family + (c.split ? " split" : " P=1");
    if (c.impl != qkv::implementation::fused) return name_of(c.impl);
    return std::string("fused ") + family;
}

std::string describe(const config& c) {
    std::string s = "B=" + std::to_string(c.batch) + " H=" + std::to_string(c.heads) + " N=" + std::to_string(c.seq);
    if (c.decode) s += " S=" + std::to_string(c.kv_seq) + " Hkv=" + std::to_string(c.kv_heads);
    s += " d=" + std::to_string(c.dim);
    if (c.ev() != c.dim) s += "/" + std::to_string(c.ev());
    s += std::string(c.options.causal ? " causal " : " ") + name_of(c.options.precision) + " " +
         impl_name(c, qkv::kernel_family::automatic);
    if (const std::string r = rules_of(c); r != "-") s += " " + r;
    return s;
}

namespace {

/// Inputs of N(0, 1) and weights of N(0, 1/d_in), as in a trained model: scores of order one.
struct bench_problem {
    qkv::attention_shape shape;
    std::vector<float> x, wq, wk, wv;

    bench_problem(const config& c, std::uint64_t seed) {
        const std::size_t width = c.heads * c.dim;
        shape = {.batch = c.batch, .seq = c.seq, .d_in = width, .d_k = width, .d_v = width, .heads = c.heads};
        std::mt19937_64 rng(seed);
        std::normal_distribution<float> unit(0.0f, 1.0f);
        const float w_scale = 1.0f / std::sqrt(static_cast<float>(width));
        const auto fill = [&](std::vector<float>& v, std::size_t n, float s) {
            v.resize(n);
            for (float& e : v) e = unit(rng) * s;
        };
        fill(x, c.batch * c.seq * width, 1.0f);
        fill(wq, width * width, w_scale);
        fill(wk, width * width, w_scale);
        fill(wv, width * width, w_scale);
    }
    [[nodiscard]] qkv::attention_problem view(const config& c) const {
        qkv::attention_problem p{.shape = shape, .x = x, .wq = wq, .wk = wk, .wv = wv};
        p.options.scale = c.options.scale;
        p.options.causal = c.options.causal;
        p.options.precision = c.options.precision;
        p.options.implementation = c.impl;
        p.options.kernel = c.options.kernel;
        return p;
    }
};

/// Runs `measure` (a configuration's timed calls) and says whether it ran; where the device cannot
/// take the configuration (its limits, its memory, a feature it lacks such as 16-bit storage for
/// fp16) the result is skipped, saying why, instead.
template <class F>
bool measured(result& r, F&& measure) {
    try {
        measure();
        return true;
    } catch (const qkv::vulkan::limit_exceeded& e) {
        r.skipped = e.what();
    } catch (const qkv::vulkan::out_of_memory& e) {
        r.skipped = e.what();
    } catch (const qkv::vulkan::unavailable& e) {
        r.skipped = e.what();
    }
    return false;
}

std::vector<float> normal(std::size_t n, std::mt19937_64& rng) {
    std::normal_distribution<float> unit(0.0f, 1.0f);
    std::vector<float> v(n);
    for (float& e : v) e = unit(rng);
    return v;
}

}  // namespace

result run_config(qkv::vulkan::context& ctx, const config& c, int warmup, int repeat, std::uint64_t seed,
                  double fma_gflops) {
    result r;
    r.c = c;
    const bench_problem problem(c, seed);
    const qkv::attention_problem view = problem.view(c);
    const bool device_clock = ctx.device().timestamps;
    r.device_clock = device_clock;
    std::vector<double> attention, projection, call;
    if (!measured(r, [&] {
            ctx.trim();  // the peak is this configuration's alone
            ctx.reset_peak();
            for (int i = 0; i < warmup + repeat; ++i) {
                const qkv::attention_output out = ctx.attention(view);
                if (i == 0) {  // time only calls that compute something real
                    r.ran_kernel = out.kernel;
                    const bool finite =
                        std::all_of(out.output.begin(), out.output.end(), [](float v) { return std::isfinite(v); });
                    if (!finite) throw qkv::vulkan::error("the output has NaN or Inf: not timing a broken result");
                }
                if (i < warmup) continue;
                const qkv::vulkan::call_stats s = ctx.last_call();
                call.push_back(s.host_ms);
                attention.push_back(device_clock ? s.attention_ms : s.host_ms);
                projection.push_back(device_clock ? s.projection_ms : 0.0);
            }
            r.peak_bytes = ctx.peak_device_memory();
        }))
        return r;
    r.ran = true;
    r.attention_ms = summarise(attention);
    r.projection_ms = summarise(projection);
    r.call_ms = summarise(call);
    r.attention_gflops = attention_flops(c) / (r.attention_ms.median * 1e6);
    if (device_clock && r.projection_ms.median > 0)
        r.projection_gflops = projection_flops(c) / (r.projection_ms.median * 1e6);
    if (fma_gflops > 0) r.percent_of_fma = 100.0 * r.attention_gflops / fma_gflops;
    return r;
}

namespace {

/// Times sdpa: against a kv_cache (K/V appended once, before the timed calls), or with K and V
/// from the host on every call (host_kv).
result time_sdpa(qkv::vulkan::context& ctx, const config& c, int warmup, int repeat, std::uint64_t seed,
                 double fma_gflops) {
    result r;
    r.c = c;
    const bool device_clock = ctx.device().timestamps;
    r.device_clock = device_clock;
    std::vector<double> attention, call;
    if (!measured(r, [&] {
            ctx.trim();
            ctx.reset_peak();
            std::mt19937_64 rng(seed);
            std::optional<qkv::vulkan::kv_cache> cache;
            std::vector<float> host_k, host_v;  // host_kv: K and V of every call
            const std::size_t ev = c.ev();
            if (!c.host_kv)
                cache.emplace(ctx, qkv::kv_layout{.batch = c.batch,
                                                  .kv_heads = c.kv_heads,
                                                  .capacity = c.kv_seq,
                                                  .d_qk = c.dim,
                                                  .d_v = ev,
                                                  .type = qkv::stored_kv_type(c.options)});
            // The keys arrive in a few appends, as a decoder's would (K/V of N(0, 1), like q).
            const std::size_t groups = c.batch * c.kv_heads, pieces = std::min<std::size_t>(4, c.kv_seq);
            for (std::size_t done = 0, i = 0; i < pieces; ++i) {
                const std::size_t rows = i + 1 == pieces ? c.kv_seq - done : c.kv_seq / pieces;
                const std::vector<float> k = normal(groups * rows * c.dim, rng), v = normal(groups * rows * ev, rng);
                if (cache) {
                    cache->append(k, v, rows);
                } else {  // the same values in (B, Hkv, S, d) order
                    host_k.resize(groups * c.kv_seq * c.dim), host_v.resize(groups * c.kv_seq * ev);
                    for (std::size_t z = 0; z < groups; ++z) {
                        for (std::size_t t = 0; t < rows * c.dim; ++t)
                            host_k[(z * c.kv_seq + done) * c.dim + t] = k[z * rows * c.dim + t];
                        for (std::size_t t = 0; t < rows * ev; ++t)
                            host_v[(z * c.kv_seq + done) * ev + t] = v[z * rows * ev + t];
                    }
                }
                done += rows;
            }
            const std::vector<float> q = normal(c.batch * c.heads * c.seq * c.dim, rng);
            qkv::sdpa_problem p;
            p.shape = c.decode_shape();
            p.q = q;
            p.options = c.options;
            const std::vector<float> sinks = c.sinks ? normal(c.heads, rng) : std::vector<float>{};
            p.sinks = sinks;
            p.k = host_k;
            p.v = host_v;
            for (int i = 0; i < warmup + repeat; ++i) {
                const qkv::sdpa_output out = cache ? ctx.sdpa(p, *cache) : ctx.sdpa(p);
                if (i == 0) {
                    r.ran_kernel = out.kernel;
                    if (!std::all_of(out.output.begin(), out.output.end(), [](float x) { return std::isfinite(x); }))
                        throw qkv::vulkan::error("the output has NaN or Inf: not timing a broken result");
                }
                if (i < warmup) continue;
                const qkv::vulkan::call_stats s = ctx.last_call();
                call.push_back(s.host_ms);
                attention.push_back(device_clock ? s.attention_ms : s.host_ms);
            }
            r.peak_bytes = ctx.peak_device_memory();
        }))
        return r;
    r.ran = true;
    r.attention_ms = summarise(attention);
    r.call_ms = summarise(call);
    r.attention_gflops = attention_flops(c) / (r.attention_ms.median * 1e6);
    r.kv_gb_per_s = kv_bytes(c) / (r.attention_ms.median * 1e6);
    if (fma_gflops > 0) r.percent_of_fma = 100.0 * r.attention_gflops / fma_gflops;
    return r;
}

}  // namespace

result run_decode(qkv::vulkan::context& ctx, const config& c, int warmup, int repeat, std::uint64_t seed,
                  double fma_gflops) {
    return time_sdpa(ctx, c, warmup, repeat, seed, fma_gflops);
}

result run_sdpa_host(qkv::vulkan::context& ctx, const config& c, int warmup, int repeat, std::uint64_t seed,
                     double fma_gflops) {
    return time_sdpa(ctx, c, warmup, repeat, seed, fma_gflops);
}

/// The tutorial's 3 x 4 example, called repeatedly: the fixed cost of one call.
summary tiny_example(qkv::vulkan::context& ctx, int calls) {
    const auto flat = [](const auto& m) {
        std::vector<float> v;
        for (std::size_t r = 0; r < m.rows; ++r)
            for (std::size_t c = 0; c < m.cols; ++c) v.push_back(m(r, c));
        return v;
    };
    const std::vector<float> x = flat(qkv::tutorial::inputs), wq = flat(qkv::tutorial::w_query),
                             wk = flat(qkv::tutorial::w_key), wv = flat(qkv::tutorial::w_value);
    qkv::attention_problem p{.shape = {.seq = 3, .d_in = 4, .d_k = 3, .d_v = 3}, .x = x, .wq = wq, .wk = wk, .wv = wv};
    p.options.scale = 1.0f;
    std::vector<double> host;
    for (int i = 0; i < calls + 3; ++i) {
        const auto start = std::chrono::steady_clock::now();
        const qkv::attention_output out = ctx.attention(p);
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
        if (i >= 3) host.push_back(ms);
        // The tutorial's first output row, as a guard against timing something wrong.
        if (std::fabs(out.output[0] - qkv::tutorial::plain.output(0, 0)) > 1e-3f)
            throw qkv::vulkan::error("the tiny example's result is wrong; not timing it");
    }
    return summarise(host);
}

}  // namespace qkv::cli::bench
