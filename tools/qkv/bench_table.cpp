// `qkv bench`: the printed tables and the ratios measured in the run.
#include <iomanip>
#include <map>
#include <ostream>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "bench.hpp"
#include "names.hpp"
#include "printing.hpp"

namespace qkv::cli::bench {

std::string fixed(double value, int decimals) {
    std::ostringstream os;
    os << std::fixed << std::setprecision(decimals) << value;
    return os.str();
}

std::string sig3(double value) {
    const double a = std::fabs(value);
    if (a >= 100) return fixed(value, 0);
    if (a >= 10) return fixed(value, 1);
    if (a >= 1) return fixed(value, 2);
    return fixed(value, 3);
}

namespace {

std::string mebibytes(std::uint64_t bytes) { return fixed(static_cast<double>(bytes) / (1024.0 * 1024.0), 1); }

/// The cells every table starts a result's timing with: "skipped: why" (false), or the median, the
/// range and the GFLOP/s of the attention (true: the table adds its own).
bool timing_cells(std::vector<std::string>& row, const result& r) {
    if (!r.ran) {
        row.push_back("skipped: " + r.skipped);
        return false;
    }
    row.push_back(sig3(r.attention_ms.median));
    row.push_back(sig3(r.attention_ms.min) + "–" + sig3(r.attention_ms.max));
    row.push_back(sig3(r.attention_gflops));
    return true;
}

/// The decode rows: their own table (query rows, keys, K/V heads, K/V bandwidth), then split
/// against one chunk where both ran.
json print_decode(std::ostream& os, const qkv::vulkan::device_info& info, const std::vector<result>& results,
                  json& window_ratios) {
    const std::string clock = info.timestamps ? "" : " (host)";
    std::vector<std::vector<std::string>> rows;
    for (const result& r : results) {
        if (!r.c.decode) continue;
        const config& c = r.c;
        const std::string d = std::to_string(c.dim) + (c.ev() != c.dim ? "/" + std::to_string(c.ev()) : "");
        std::vector<std::string> row{std::to_string(c.batch),         std::to_string(c.heads),
                                     std::to_string(c.kv_heads),      std::to_string(c.seq),
                                     std::to_string(c.kv_seq),        d,
                                     c.options.causal ? "yes" : "no", name_of(c.options.precision),
                                     impl_name(c, r.ran_kernel),      rules_of(c)};
        if (timing_cells(row, r)) {
            row.push_back(sig3(r.kv_gb_per_s));
            row.push_back(sig3(r.call_ms.median));
            row.push_back(mebibytes(r.peak_bytes));
        }
        rows.push_back(std::move(row));
    }
    json ratios = json::array();
    if (rows.empty()) return ratios;
    os << "sdpa: decode against a kv_cache (K/V resident on the device, only q uploaded per call), or q, k, v "
          "from the host (impl sdpa)\n";
    print_table(os,
                {"B", "Hq", "Hkv", "L", "S", "d", "causal", "prec", "impl", "rules", "attn ms" + clock, "range",
                 "GFLOP/s", "K/V GB/s", "call ms", "peak MiB"},
                rows);
    // A sliding window against the same call without one, measured in this run.
    for (const result& w : results) {
        if (!w.ran || !w.c.decode || !w.c.windowed()) continue;
        for (const result& full : results) {
            config a = w.c;
            a.options.window_left = a.options.window_right = -1;
            const config& b = full.c;
            if (!full.ran || !b.decode || b.windowed() || describe(a) != describe(b) ||
                a.options.kernel != b.options.kernel)
                continue;
            const double ratio = w.attention_ms.median / full.attention_ms.median;
            os << "  window " << w.c.options.window_left << "," << w.c.options.window_right
               << " against the full call, " << describe(b) << ": " << sig3(w.attention_ms.median) << " ms against "
               << sig3(full.attention_ms.median) << " ms (" << fixed(ratio, 3) << " of the full call's time)\n";
            window_ratios.push_back({{"config", describe(w.c)},
                                     {"window_ms", w.attention_ms.median},
                                     {"full_ms", full.attention_ms.median},
                                     {"window_over_full", ratio}});
        }
    }
    for (const result& split : results) {
        if (!split.ran || !split.c.decode || !split.c.split) continue;
        for (const result& one : results) {
            const config &a = split.c, &b = one.c;
            if (!one.ran || !b.decode || b.split || a.host_kv || b.host_kv || a.batch != b.batch ||
                a.heads != b.heads || a.kv_heads != b.kv_heads || a.seq != b.seq || a.kv_seq != b.kv_seq ||
                a.dim != b.dim || !qkv::same_options(a.options, b.options) || a.sinks != b.sinks || a.ev() != b.ev())
                continue;
            const double speedup = one.call_ms.median / split.call_ms.median;
            os << "  " << describe(a) << ": split " << sig3(split.call_ms.median) << " ms per call, one chunk "
               << sig3(one.call_ms.median) << " ms, the split is " << fixed(speedup, 2) << "x "
               << (speedup >= 1 ? "faster" : "slower") << "\n";
            ratios.push_back({{"config", describe(a)},
                              {"split_call_ms", split.call_ms.median},
                              {"unsplit_call_ms", one.call_ms.median},
                              {"unsplit_over_split", speedup}});
        }
    }
    os << "\nDecode GFLOP/s counts 2·B·Hq·L·S·(E + Ev) (the whole S, with a window too); K/V GB/s the K and V "
          "bytes of the cache (as stored: f32, f16, q8_0, q4_0) read once per call.\n";
    return ratios;
}

}  // namespace

json print_results(std::ostream& std_out, const options& o, const qkv::vulkan::device_info& info,
                   const std::vector<result>& all) {
    json window_ratios = json::array();
    json decode_ratios = print_decode(std_out, info, all, window_ratios);
    std::vector<result> results;
    for (const result& r : all)
        if (!r.c.decode) results.push_back(r);
    json out = {{"decode_split_vs_unsplit", decode_ratios},
                {"window_vs_full", window_ratios},
                {"fused_vs_staged", json::array()}};
    if (results.empty()) return out;
    std::ostream& cout_ = std_out;
    const std::string clock = info.timestamps ? "" : " (host)";
    std::vector<std::vector<std::string>> rows;
    for (const result& r : results) {
        const config& c = r.c;
        std::vector<std::string> row{std::to_string(c.batch),         std::to_string(c.heads),
                                     std::to_string(c.seq),           std::to_string(c.dim),
                                     c.options.causal ? "yes" : "no", name_of(c.options.precision),
                                     impl_name(c, r.ran_kernel)};
        if (timing_cells(row, r)) {
            row.push_back(o.skip_ceiling ? "-" : fixed(r.percent_of_fma, 1));
            row.push_back(info.timestamps ? sig3(r.projection_ms.median) : "-");
            row.push_back(info.timestamps ? sig3(r.projection_gflops) : "-");
            row.push_back(sig3(r.call_ms.median));
            row.push_back(mebibytes(r.peak_bytes));
        }
        rows.push_back(std::move(row));
    }
    print_table(cout_,
                {"B", "H", "N", "d", "causal", "prec", "impl", "attn ms" + clock, "range", "GFLOP/s", "% FMA",
                 "proj ms", "proj GFLOP/s", "call ms", "peak MiB"},
                rows);

    // Fused against staged, same shape and precision, measured in this run.
    std::map<std::tuple<std::size_t, std::size_t, std::size_t, std::size_t, bool, int, int>, std::pair<double, double>>
        pairs;  // per fused kernel family that ran
    for (const result& r : results)
        if (r.ran && r.c.impl == qkv::implementation::fused)
            pairs[{r.c.batch, r.c.heads, r.c.seq, r.c.dim, r.c.options.causal, static_cast<int>(r.c.options.precision),
                   static_cast<int>(r.ran_kernel)}]
                .first = r.attention_ms.median;
    for (const result& r : results)
        if (r.ran && r.c.impl == qkv::implementation::staged)
            for (auto& [key, times] : pairs)
                if (key == decltype(pairs)::key_type{r.c.batch, r.c.heads, r.c.seq, r.c.dim, r.c.options.causal,
                                                     static_cast<int>(r.c.options.precision), std::get<6>(key)})
                    times.second = r.attention_ms.median;
    json ratios = json::array();
    bool header = false;
    for (const auto& [key, times] : pairs) {
        if (times.first <= 0 || times.second <= 0) continue;
        if (!header) cout_ << "\nFused against staged (attention phase, median times of this run):\n";
        header = true;
        const auto& [b, h, n, d, causal, prec, kernel] = key;
        const double speedup = times.second / times.first;
        cout_ << "  B=" << b << " H=" << h << " N=" << n << " d=" << d << (causal ? " causal" : "") << " "
              << name_of(static_cast<qkv::precision>(prec)) << ": fused ("
              << name_of(static_cast<qkv::kernel_family>(kernel)) << " family) " << sig3(times.first) << " ms, staged "
              << sig3(times.second) << " ms, fused is " << fixed(speedup, 2) << "x "
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
    cout_ << "\nGFLOP/s counts 4·B·H·N²·d for the attention (half when causal) and 2·B·N·(H·d)·3·(H·d) for the "
             "Q|K|V projection; % FMA is the attention's share of the measured FMA ceiling.\n";

    out["fused_vs_staged"] = std::move(ratios);
    return out;
}

}  // namespace qkv::cli::bench
