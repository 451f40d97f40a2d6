// `qkv bench`: how fast qkv's attention runs on a Vulkan device, and how close that is to what the
// device itself can do.
//
// For every configuration of the sweep (B, H, N, d, causal, precision, implementation) it runs
// warm-up calls, then timed calls, and reports the median and the range of the device time of the
// attention phase (GPU timestamps, or the host clock around the whole call where the device has
// none), its throughput in the FlashAttention convention (4·B·H·N²·d FLOP, halved when causal),
// the Q|K|V projection's time and throughput separately (2·B·N·d_in·3·H·d FLOP), and the peak
// device memory the context held. In the same process it measures the device's ceiling (an FMA
// chain and a copy shader) and states each kernel's throughput as a share of it, and it times the
// tutorial's tiny example call against an empty submit-and-wait to show the fixed cost of a call.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <ctime>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "commands.hpp"
#include "errors.hpp"
#include "npy/npy.hpp"
#include "printing.hpp"
#include "qkv/tutorial.hpp"
#include "qkv/version.hpp"
#include "qkv/vulkan/context.hpp"
#include "qkv/vulkan/error.hpp"

namespace qkv::cli {
namespace {

using json = nlohmann::ordered_json;

struct bench_options {
    std::vector<std::size_t> batch, heads, seq, dim;
    std::vector<std::string> causal, precision, impl, kernel;
    int repeat = 0;   // 0: chosen for the device
    int warmup = -1;  // -1: chosen for the device
    std::string device, json_file;
    bool skip_ceiling = false;
    std::uint64_t seed = 20261122;
};

struct config {
    std::size_t batch, heads, seq, dim;
    bool causal;
    qkv::precision precision;
    qkv::implementation impl;
    qkv::kernel_family kernel = qkv::kernel_family::automatic;  // fused only
};

struct summary {
    double median = 0, min = 0, max = 0;
};

struct result {
    config c{};
    bool ran = false;
    std::string skipped;  // why not, when !ran
    summary attention_ms, projection_ms, call_ms;
    double attention_gflops = 0, projection_gflops = 0;
    double percent_of_fma = 0;
    std::uint64_t peak_bytes = 0;
    bool device_clock = false;
    qkv::kernel_family ran_kernel = qkv::kernel_family::automatic;  // the fused family that ran
};

summary summarise(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    const double median = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    return {median, v.front(), v.back()};
}

std::string fixed(double value, int decimals) {
    std::ostringstream os;
    os << std::fixed << std::setprecision(decimals) << value;
    return os.str();
}

/// Three significant digits, without exponent for the sizes a benchmark prints.
std::string sig3(double value) {
    const double a = std::fabs(value);
    if (a >= 100) return fixed(value, 0);
    if (a >= 10) return fixed(value, 1);
    if (a >= 1) return fixed(value, 2);
    return fixed(value, 3);
}

std::string mebibytes(std::uint64_t bytes) { return fixed(static_cast<double>(bytes) / (1024.0 * 1024.0), 1); }

const char* name_of(qkv::precision p) { return p == qkv::precision::fp16 ? "fp16" : "fp32"; }
const char* name_of(qkv::implementation i) {
    return i == qkv::implementation::fused ? "fused" : i == qkv::implementation::staged ? "staged" : "auto";
}
const char* name_of(qkv::kernel_family k) {
    return k == qkv::kernel_family::cpu ? "cpu" : k == qkv::kernel_family::gpu ? "gpu" : "auto";
}
/// "staged", "fused cpu" (the family that ran), or "fused auto" for a configuration not yet run.
std::string impl_name(const config& c, qkv::kernel_family ran) {
    if (c.impl != qkv::implementation::fused) return name_of(c.impl);
    return std::string("fused ") + name_of(ran == qkv::kernel_family::automatic ? c.kernel : ran);
}

std::string utc_now() {
    const std::time_t t = std::time(nullptr);
    std::tm tm{};
#ifdef _WIN32
    gmtime_s(&tm, &t);
#else
    gmtime_r(&t, &tm);
#endif
    char text[32];
    std::strftime(text, sizeof text, "%Y-%m-%d %H:%M UTC", &tm);
    return text;
}

double attention_flops(const config& c) {
    const double n = static_cast<double>(c.seq);
    const double f = 4.0 * static_cast<double>(c.batch * c.heads * c.dim) * n * n;
    return c.causal ? f / 2 : f;
}
double projection_flops(const config& c) {
    const double width = static_cast<double>(c.heads * c.dim);
    return 2.0 * static_cast<double>(c.batch * c.seq) * width * 3.0 * width;
}

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
        p.options.causal = c.causal;
        p.options.precision = c.precision;
        p.options.implementation = c.impl;
        p.options.kernel = c.kernel;
        return p;
    }
};

/// Progress on stderr, one line per configuration, so stdout holds only the results.
class progress {
public:
    explicit progress(std::size_t total) : total_(total) {}
    void show(std::size_t i, const std::string& what) {
        std::cerr << "qkv bench: [" << i << "/" << total_ << "] " << what << "\n";
        std::cerr.flush();
    }

private:
    std::size_t total_;
};

std::string describe(const config& c) {
    return "B=" + std::to_string(c.batch) + " H=" + std::to_string(c.heads) + " N=" + std::to_string(c.seq) +
           " d=" + std::to_string(c.dim) + (c.causal ? " causal " : " ") + name_of(c.precision) + " " +
           impl_name(c, qkv::kernel_family::automatic);
}

result run_config(qkv::vulkan::context& ctx, const config& c, int warmup, int repeat, std::uint64_t seed,
                  double fma_gflops) {
    result r;
    r.c = c;
    const bench_problem problem(c, seed);
    const qkv::attention_problem view = problem.view(c);
    const bool device_clock = ctx.device().timestamps;
    r.device_clock = device_clock;
    std::vector<double> attention, projection, call;
    try {
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
    } catch (const qkv::vulkan::limit_exceeded& e) {
        r.skipped = e.what();
        return r;
    } catch (const qkv::vulkan::out_of_memory& e) {
        r.skipped = e.what();
        return r;
    } catch (const qkv::vulkan::unavailable& e) {  // fp16 on a device without 16-bit storage
        r.skipped = e.what();
        return r;
    }
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

std::vector<config> sweep(const bench_options& o, const qkv::vulkan::device_info& info) {
    const auto parse_bool = [](const std::string& s) { return s == "yes"; };
    std::vector<bool> causal_values;
    for (const auto& s : o.causal) causal_values.push_back(parse_bool(s));
    std::vector<qkv::precision> precisions;
    for (const auto& s : o.precision) precisions.push_back(s == "fp16" ? qkv::precision::fp16 : qkv::precision::fp32);
    if (o.precision.empty()) {
        precisions.push_back(qkv::precision::fp32);
        if (info.fp16_storage) precisions.push_back(qkv::precision::fp16);
    }
    std::vector<qkv::implementation> impls;
    for (const auto& s : o.impl)
        impls.push_back(s == "staged" ? qkv::implementation::staged : qkv::implementation::fused);
    std::vector<qkv::kernel_family> kernels;
    for (const auto& s : o.kernel)
        kernels.push_back(s == "cpu"   ? qkv::kernel_family::cpu
                          : s == "gpu" ? qkv::kernel_family::gpu
                                       : qkv::kernel_family::automatic);
    std::vector<config> out;
    for (std::size_t b : o.batch)
        for (std::size_t h : o.heads)
            for (std::size_t n : o.seq)
                for (std::size_t d : o.dim)
                    for (bool causal : causal_values)
                        for (qkv::precision p : precisions)
                            for (qkv::implementation i : impls) {
                                if (i != qkv::implementation::fused)
                                    out.push_back({b, h, n, d, causal, p, i});
                                else
                                    for (qkv::kernel_family k : kernels) out.push_back({b, h, n, d, causal, p, i, k});
                            }
    return out;
}

void fill_defaults(bench_options& o, const qkv::vulkan::device_info& info) {
    // lavapipe and other CPU implementations manage a few GFLOP/s: a sweep that ends in minutes.
    const bool slow = info.type == qkv::vulkan::device_type::cpu;
    if (o.batch.empty()) o.batch = {1};
    if (o.heads.empty()) o.heads = {slow ? 1u : 8u};
    if (o.seq.empty())
        o.seq = slow ? std::vector<std::size_t>{128, 512, 1024} : std::vector<std::size_t>{512, 1024, 2048, 4096, 8192};
    if (o.dim.empty()) o.dim = {64};
    if (o.causal.empty()) o.causal = {"no", "yes"};
    if (o.impl.empty()) o.impl = {"staged", "fused"};
    if (o.kernel.empty()) o.kernel = {"auto"};
    if (o.repeat <= 0) o.repeat = slow ? 5 : 20;
    if (o.warmup < 0) o.warmup = slow ? 1 : 3;
}

json device_json(const qkv::vulkan::device_info& d) {
    return {{"name", d.name},
            {"type", qkv::vulkan::to_string(d.type)},
            {"driver", d.driver},
            {"vulkan", d.api_version_string},
            {"vendor_id", d.vendor_id},
            {"subgroup_size", d.subgroup_size},
            {"subgroup_arithmetic", d.subgroup_arithmetic},
            {"shared_memory_bytes", d.max_shared_memory},
            {"device_local_bytes", d.device_local_memory},
            {"fp16_storage", d.fp16_storage},
            {"fp16_arithmetic", d.fp16_arithmetic},
            {"timestamps", d.timestamps}};
}

json summary_json(const summary& s) { return {{"median", s.median}, {"min", s.min}, {"max", s.max}}; }

void run(bench_options o) {
    std::optional<std::string> device;
    if (!o.device.empty()) device = o.device;
    qkv::vulkan::context ctx({.device = device});
    const qkv::vulkan::device_info& info = ctx.device();
    fill_defaults(o, info);
    const std::vector<config> configs = sweep(o, info);
    const std::string date = utc_now();

    std::ofstream json_out;  // opened first: a bad path fails before minutes of benchmarking
    if (!o.json_file.empty()) {
        json_out.open(qkv::npy::path_from_utf8(o.json_file), std::ios::binary);  // UTF-8 names on Windows too
        if (!json_out) throw qkv::vulkan::error("cannot write " + o.json_file);
    }

    std::cout << "qkv " << qkv::version_string << " bench, " << date << "\n"
              << "Device: " << info.name << " — " << qkv::vulkan::to_string(info.type) << ", Vulkan "
              << info.api_version_string << ", driver " << info.driver << ", subgroup " << info.subgroup_size << "\n"
              << "Timing: " << o.warmup << " warm-up + " << o.repeat << " timed calls per row; "
              << (info.timestamps ? "device timestamps per phase" : "host clock around each whole call (no timestamps)")
              << "\n\n";

    qkv::vulkan::device_ceiling ceiling;
    if (!o.skip_ceiling) {
        std::cerr << "qkv bench: measuring the device's ceiling (FMA and copy shaders)\n";
        ceiling = ctx.measure_ceiling();
        std::cout << "Device ceiling, measured now: FMA " << sig3(ceiling.fma_gflops) << " GFLOP/s, copy "
                  << sig3(ceiling.copy_gb_per_s) << " GB/s, empty submit-and-wait " << fixed(ceiling.empty_submit_ms, 3)
                  << " ms\n";
    }
    std::cerr << "qkv bench: timing the tutorial's 3 x 4 example\n";
    const summary tiny = tiny_example(ctx, 50);
    std::cout << "Tutorial example (N=3, d_in=4, d=3), host call to result: median " << fixed(tiny.median, 3)
              << " ms (min " << fixed(tiny.min, 3) << ", max " << fixed(tiny.max, 3) << ")";
    if (!o.skip_ceiling)
        std::cout << "; an empty submit-and-wait takes " << fixed(ceiling.empty_submit_ms, 3) << " ms, so qkv adds "
                  << fixed(tiny.median - ceiling.empty_submit_ms, 3) << " ms per call";
    std::cout << "\n\n";

    std::vector<result> results;
    progress bar(configs.size());
    for (std::size_t i = 0; i < configs.size(); ++i) {
        bar.show(i + 1, describe(configs[i]));
        results.push_back(run_config(ctx, configs[i], o.warmup, o.repeat, o.seed + i, ceiling.fma_gflops));
    }

    const std::string clock = info.timestamps ? "" : " (host)";
    std::vector<std::vector<std::string>> rows;
    for (const result& r : results) {
        const config& c = r.c;
        std::vector<std::string> row{std::to_string(c.batch),   std::to_string(c.heads), std::to_string(c.seq),
                                     std::to_string(c.dim),     c.causal ? "yes" : "no", name_of(c.precision),
                                     impl_name(c, r.ran_kernel)};
        if (!r.ran) {
            row.push_back("skipped: " + r.skipped);
        } else {
            row.push_back(sig3(r.attention_ms.median));
            row.push_back(sig3(r.attention_ms.min) + "–" + sig3(r.attention_ms.max));
            row.push_back(sig3(r.attention_gflops));
            row.push_back(o.skip_ceiling ? "-" : fixed(r.percent_of_fma, 1));
            row.push_back(info.timestamps ? sig3(r.projection_ms.median) : "-");
            row.push_back(info.timestamps ? sig3(r.projection_gflops) : "-");
            row.push_back(sig3(r.call_ms.median));
            row.push_back(mebibytes(r.peak_bytes));
        }
        rows.push_back(std::move(row));
    }
    print_table(std::cout,
                {"B", "H", "N", "d", "causal", "prec", "impl", "attn ms" + clock, "range", "GFLOP/s", "% FMA",
                 "proj ms", "proj GFLOP/s", "call ms", "peak MiB"},
                rows);

    // Fused against staged, same shape and precision, measured in this run.
    std::map<std::tuple<std::size_t, std::size_t, std::size_t, std::size_t, bool, int, int>, std::pair<double, double>>
        pairs;  // per fused kernel family that ran
    for (const result& r : results)
        if (r.ran && r.c.impl == qkv::implementation::fused)
            pairs[{r.c.batch, r.c.heads, r.c.seq, r.c.dim, r.c.causal, static_cast<int>(r.c.precision),
                   static_cast<int>(r.ran_kernel)}]
                .first = r.attention_ms.median;
    for (const result& r : results)
        if (r.ran && r.c.impl == qkv::implementation::staged)
            for (auto& [key, times] : pairs)
                if (key == decltype(pairs)::key_type{r.c.batch, r.c.heads, r.c.seq, r.c.dim, r.c.causal,
                                                     static_cast<int>(r.c.precision), std::get<6>(key)})
                    times.second = r.attention_ms.median;
    json ratios = json::array();
    bool header = false;
    for (const auto& [key, times] : pairs) {
        if (times.first <= 0 || times.second <= 0) continue;
        if (!header) std::cout << "\nFused against staged (attention phase, median times of this run):\n";
        header = true;
        const auto& [b, h, n, d, causal, prec, kernel] = key;
        const double speedup = times.second / times.first;
        std::cout << "  B=" << b << " H=" << h << " N=" << n << " d=" << d << (causal ? " causal" : "") << " "
                  << name_of(static_cast<qkv::precision>(prec)) << ": fused ("
                  << name_of(static_cast<qkv::kernel_family>(kernel)) << " family) " << sig3(times.first)
                  << " ms, staged " << sig3(times.second) << " ms, fused is " << fixed(speedup, 2) << "x "
                  << (speedup >= 1 ? "faster" : "slower") << "\n";
        ratios.push_back({{"batch", b},
                          {"heads", h},
                          {"seq", n},
                          {"dim", d},
                          {"causal", causal},
                          {"precision", name_of(static_cast<qkv::precision>(prec))},
                          {"kernel", name_of(static_cast<qkv::kernel_family>(kernel))},
                          {"fused_ms", times.first},
                          {"staged_ms", times.second},
                          {"staged_over_fused", speedup}});
    }
    std::cout << "\nGFLOP/s counts 4·B·H·N²·d for the attention (half when causal) and 2·B·N·(H·d)·3·(H·d) for the "
                 "Q|K|V projection; % FMA is the attention's share of the measured FMA ceiling.\n";

    if (!o.json_file.empty()) {
        json j;
        j["qkv_version"] = qkv::version_string;
        j["date"] = date;
        j["device"] = device_json(info);
        j["timing"] = {
            {"warmup", o.warmup}, {"repeat", o.repeat}, {"clock", info.timestamps ? "device timestamps" : "host"}};
        if (!o.skip_ceiling)
            j["ceiling"] = {{"fma_gflops", ceiling.fma_gflops},
                            {"copy_gb_per_s", ceiling.copy_gb_per_s},
                            {"empty_submit_ms", ceiling.empty_submit_ms},
                            {"device_timestamps", ceiling.device_timestamps}};
        j["tiny_example_call_ms"] = summary_json(tiny);
        json list = json::array();
        for (const result& r : results) {
            json e = {{"batch", r.c.batch},
                      {"heads", r.c.heads},
                      {"seq", r.c.seq},
                      {"dim", r.c.dim},
                      {"causal", r.c.causal},
                      {"precision", name_of(r.c.precision)},
                      {"impl", name_of(r.c.impl)},
                      {"kernel", r.c.impl == qkv::implementation::fused ? name_of(r.ran_kernel) : "-"},
                      {"attention_flop", attention_flops(r.c)},
                      {"projection_flop", projection_flops(r.c)}};
            if (!r.ran) {
                e["skipped"] = r.skipped;
            } else {
                e["attention_ms"] = summary_json(r.attention_ms);
                e["attention_gflops"] = r.attention_gflops;
                if (!o.skip_ceiling) e["percent_of_fma_ceiling"] = r.percent_of_fma;
                if (info.timestamps) {
                    e["projection_ms"] = summary_json(r.projection_ms);
                    e["projection_gflops"] = r.projection_gflops;
                }
                e["call_ms"] = summary_json(r.call_ms);
                e["peak_device_bytes"] = r.peak_bytes;
            }
            list.push_back(std::move(e));
        }
        j["results"] = std::move(list);
        j["fused_vs_staged"] = std::move(ratios);
        json_out << j.dump(2) << "\n";
        if (!json_out.flush()) throw qkv::vulkan::error("cannot write " + o.json_file);
        std::cerr << "qkv bench: wrote " << o.json_file << "\n";
    }
}

}  // namespace

void add_bench(CLI::App& app) {
    auto o = std::make_shared<bench_options>();
    CLI::App* cmd = app.add_subcommand(
        "bench", "Time attention on a Vulkan device over a sweep of shapes, against the device's own ceiling");
    const auto positive = CLI::PositiveNumber;
    cmd->add_option("--batch", o->batch, "Batch sizes B (comma-separated; default 1)")->delimiter(',')->check(positive);
    cmd->add_option("--heads", o->heads, "Head counts H (default 1 on a CPU device, 8 on a GPU)")
        ->delimiter(',')
        ->check(positive);
    cmd->add_option("--seq", o->seq, "Sequence lengths N (default 128,512,1024 on a CPU device, 512..8192 on a GPU)")
        ->delimiter(',')
        ->check(positive);
    cmd->add_option("--dim", o->dim, "Head widths d (default 64)")->delimiter(',')->check(positive);
    cmd->add_option("--causal", o->causal, "no, yes, or both as no,yes (default no,yes)")
        ->delimiter(',')
        ->check(CLI::IsMember({"no", "yes"}))
        ->type_name("no|yes");
    cmd->add_option("--precision", o->precision, "fp32, fp16 (default both where the device stores 16-bit)")
        ->delimiter(',')
        ->check(CLI::IsMember({"fp32", "fp16"}))
        ->type_name("fp32|fp16");
    cmd->add_option("--impl", o->impl, "staged, fused (default both)")
        ->delimiter(',')
        ->check(CLI::IsMember({"staged", "fused"}))
        ->type_name("staged|fused");
    cmd->add_option("--kernel", o->kernel,
                    "Fused kernel families: cpu, gpu, auto (default auto: cpu on a CPU device, gpu elsewhere)")
        ->delimiter(',')
        ->check(CLI::IsMember({"cpu", "gpu", "auto"}))
        ->type_name("cpu|gpu|auto");
    cmd->add_option("--repeat", o->repeat, "Timed calls per row (default 5 on a CPU device, 20 on a GPU)")
        ->check(CLI::Range(1, 100000));
    cmd->add_option("--warmup", o->warmup, "Untimed calls before them (default 1 / 3)")->check(CLI::Range(0, 100000));
    cmd->add_option("--device", o->device, "Device index or part of its name (default: QKV_DEVICE, else the best)")
        ->type_name("INDEX|NAME");
    cmd->add_option("--json", o->json_file, "Also write every number to FILE as JSON")->type_name("FILE");
    cmd->add_flag("--no-ceiling", o->skip_ceiling, "Skip measuring the device's FMA and copy ceiling");
    cmd->add_option("--seed", o->seed, "Seed of the random inputs");
    cmd->callback([o] { run(*o); });
}

}  // namespace qkv::cli
