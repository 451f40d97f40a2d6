// `qkv bench --json`: every number of the run as JSON.
#include <string>
#include <vector>

#include "bench.hpp"
#include "names.hpp"

namespace qkv::cli::bench {

namespace {

/// "16x16x16 f16*f16+f32->f32", one per entry of the device's VkCooperativeMatrixPropertiesKHR list.
json matrices_json(const qkv::vulkan::device_info& d) {
    json list = json::array();
    for (const auto& m : d.cooperative_matrices)
        list.push_back(std::to_string(m.m) + "x" + std::to_string(m.n) + "x" + std::to_string(m.k) + " " +
                       qkv::vulkan::to_string(m.a) + "*" + qkv::vulkan::to_string(m.b) + "+" +
                       qkv::vulkan::to_string(m.c) + "->" + qkv::vulkan::to_string(m.result) +
                       (m.subgroup_scope ? "" : " (not subgroup scope)"));
    return list;
}

}  // namespace

json device_json(const qkv::vulkan::device_info& d) {
    return {{"name", d.name},
            {"type", qkv::vulkan::to_string(d.type)},
            {"driver", d.driver},
            {"vulkan", d.api_version_string},
            {"vendor_id", d.vendor_id},
            {"subgroup_size", d.subgroup_size},
            {"subgroup_arithmetic", d.subgroup_arithmetic},
            {"subgroup_shuffle", d.subgroup_shuffle},
            {"subgroup_vote", d.subgroup_vote},
            {"shared_memory_bytes", d.max_shared_memory},
            {"device_local_bytes", d.device_local_memory},
            {"fp16_storage", d.fp16_storage},
            {"fp16_arithmetic", d.fp16_arithmetic},
            {"timestamps", d.timestamps},
            {"cooperative_matrix", d.cooperative_matrix},
            {"cooperative_matrices", matrices_json(d)}};
}

json summary_json(const summary& s) { return {{"median", s.median}, {"min", s.min}, {"max", s.max}}; }

json results_json(const options& o, const qkv::vulkan::device_info& info, const std::vector<result>& results) {
    json list = json::array();
    for (const result& r : results) {
        json e = {{"batch", r.c.batch},
                  {"heads", r.c.heads},
                  {"seq", r.c.seq},
                  {"dim", r.c.dim},
                  {"impl", r.c.host_kv  ? "sdpa"
                           : r.c.decode ? "decode"
                                        : name_of(r.c.impl)},
                  {"kernel", r.c.decode || r.c.impl == qkv::implementation::fused ? name_of(r.ran_kernel) : "-"},
                  {"options", options_json(r.c.options)},  // every field of sdpa_options, by its name
                  {"attention_flop", attention_flops(r.c)},
                  {"projection_flop", projection_flops(r.c)}};
        if (r.c.decode) {
            e["dim_v"] = r.c.ev();
            e["sinks"] = r.c.sinks;
            e["kv_seq"] = r.c.kv_seq;
            e["kv_heads"] = r.c.kv_heads;
            e["split"] = r.c.split;
            e["kv_bytes"] = kv_bytes(r.c);
            if (r.ran) e["kv_gb_per_s"] = r.kv_gb_per_s;
        }
        if (!r.ran) {
            e["skipped"] = r.skipped;
        } else {
            e["attention_ms"] = summary_json(r.attention_ms);
            e["attention_gflops"] = r.attention_gflops;
            if (!o.skip_ceiling) e["percent_of_fma_ceiling"] = r.percent_of_fma;
            if (info.timestamps && !r.c.decode) {
                e["projection_ms"] = summary_json(r.projection_ms);
                e["projection_gflops"] = r.projection_gflops;
            }
            e["call_ms"] = summary_json(r.call_ms);
            e["peak_device_bytes"] = r.peak_bytes;
        }
        list.push_back(std::move(e));
    }
    return list;
}

}  // namespace qkv::cli::bench
