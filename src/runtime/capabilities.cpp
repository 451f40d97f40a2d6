// The one table of what each entry point takes (qkv/runtime/capabilities.hpp).
#include "qkv/runtime/capabilities.hpp"

#include <algorithm>
#include <string>

#include "qkv/runtime/error.hpp"

namespace qkv {
namespace {

constexpr std::string_view no_weights_in_decode =
    "the split-S decode kernels never form the weights (B, Hq, L, S); context::sdpa with host K/V, or an "
    "sdpa_call without a cache, returns them";
constexpr std::string_view no_weights_across_ranks =
    "the weights of a row span every rank; return_lse gives what merging needs";

constexpr refusal table[] = {
    {entry_point::context_decode, feature::weights, no_weights_in_decode},
    {entry_point::sdpa_call_decode, feature::weights, no_weights_in_decode},
    {entry_point::mpi_sdpa, feature::weights, no_weights_across_ranks},
    {entry_point::mpi_decode, feature::weights, no_weights_across_ranks},
    {entry_point::attention_call, feature::weights,
     "the weights (B, H, N, N) are the staged route's scores buffer, which a call over tensors does not "
     "keep; context::attention returns them"},
};

constexpr entry_point all_entries[] = {entry_point::cpu_sdpa,          entry_point::context_sdpa,
                                       entry_point::context_decode,    entry_point::sdpa_call,
                                       entry_point::sdpa_call_decode,  entry_point::sequence_record,
                                       entry_point::interop_record,    entry_point::mpi_sdpa,
                                       entry_point::mpi_decode,        entry_point::cpu_attention,
                                       entry_point::context_attention, entry_point::attention_call,
                                       entry_point::cache_append,      entry_point::cache_append_tensors,
                                       entry_point::mpi_append};

constexpr feature all_features[] = {
    feature::grouped_query,   feature::causal,       feature::bool_mask, feature::additive_mask,
    feature::window,          feature::softcap,      feature::alibi,     feature::sinks,
    feature::position_offset, feature::weights,      feature::lse,       feature::fp16,
    feature::kv_f16,          feature::kv_quantized, feature::biases,    feature::output_projection};

template <class T>
std::vector<feature> sdpa_features(const basic_sdpa_problem<T>& p) {
    const sdpa_options& o = p.options;
    std::vector<feature> f;
    const auto add = [&](bool on, feature what) {
        if (on) f.push_back(what);
    };
    add(p.shape.kv_heads != p.shape.q_heads, feature::grouped_query);
    add(o.causal, feature::causal);
    add(!p.mask.empty(), feature::bool_mask);
    add(!p.additive_mask.empty(), feature::additive_mask);
    add(o.window_left >= 0 || o.window_right >= 0, feature::window);
    add(o.softcap != 0, feature::softcap);
    add(o.alibi_max_bias != 0, feature::alibi);
    add(!p.sinks.empty(), feature::sinks);
    add(o.position_offset.has_value(), feature::position_offset);
    add(o.return_weights, feature::weights);
    add(o.return_lse, feature::lse);
    add(o.precision == precision::fp16, feature::fp16);
    for (const feature s : features_of(stored_kv_type(o))) f.push_back(s);
    return f;
}

}  // namespace

std::string_view name_of(entry_point e) {
    switch (e) {
        case entry_point::cpu_sdpa:
            return "cpu::sdpa";
        case entry_point::context_sdpa:
            return "context::sdpa";
        case entry_point::context_decode:
            return "context::sdpa with a kv_cache";
        case entry_point::sdpa_call:
            return "sdpa_call";
        case entry_point::sdpa_call_decode:
            return "sdpa_call against a kv_cache";
        case entry_point::sequence_record:
            return "sequence::record";
        case entry_point::interop_record:
            return "record (interop)";
        case entry_point::mpi_sdpa:
            return "mpi::sdpa";
        case entry_point::mpi_decode:
            return "mpi::sharded_kv_cache::decode";
        case entry_point::cpu_attention:
            return "cpu::attention";
        case entry_point::context_attention:
            return "context::attention";
        case entry_point::attention_call:
            return "attention_call";
        case entry_point::cache_append:
            return "kv_cache::append (host data)";
        case entry_point::cache_append_tensors:
            return "kv_cache::append (tensors), record_append";
        case entry_point::mpi_append:
            return "mpi::sharded_kv_cache::append";
    }
    return "an unknown entry point";
}

std::string_view name_of(feature f) {
    switch (f) {
        case feature::grouped_query:
            return "grouped_query";
        case feature::causal:
            return "causal";
        case feature::bool_mask:
            return "mask";
        case feature::additive_mask:
            return "additive_mask";
        case feature::window:
            return "window";
        case feature::softcap:
            return "softcap";
        case feature::alibi:
            return "alibi";
        case feature::sinks:
            return "sinks";
        case feature::position_offset:
            return "position_offset";
        case feature::weights:
            return "return_weights";
        case feature::lse:
            return "return_lse";
        case feature::fp16:
            return "fp16";
        case feature::kv_f16:
            return "f16 K/V";
        case feature::kv_quantized:
            return "q8_0/q4_0 K/V";
        case feature::biases:
            return "biases";
        case feature::output_projection:
            return "output_projection";
    }
    return "an unknown feature";
}

bool applies(entry_point entry, feature what) {
    const bool storage = what == feature::kv_f16 || what == feature::kv_quantized;
    switch (entry) {
        case entry_point::cache_append:
        case entry_point::cache_append_tensors:
        case entry_point::mpi_append:
            return storage;
        case entry_point::cpu_attention:
        case entry_point::context_attention:
        case entry_point::attention_call:
            return what == feature::causal || what == feature::bool_mask || what == feature::additive_mask ||
                   what == feature::weights || what == feature::fp16 || what == feature::biases ||
                   what == feature::output_projection;
        case entry_point::sequence_record:
        case entry_point::interop_record:
            return true;  // they record either kind of call
        default:
            return what != feature::biases && what != feature::output_projection;
    }
}

std::span<const entry_point> entry_points() { return all_entries; }
std::span<const feature> features() { return all_features; }
std::span<const refusal> refusals() { return table; }

const refusal* refused(entry_point entry, feature what) {
    for (const refusal& r : table)
        if (r.entry == entry && r.what == what) return &r;
    return nullptr;
}

std::vector<feature> features_of(const sdpa_problem& problem) { return sdpa_features(problem); }
std::vector<feature> features_of(const sdpa_problem_f64& problem) { return sdpa_features(problem); }

std::vector<feature> features_of(const attention_problem& p) {
    std::vector<feature> f;
    const auto add = [&](bool on, feature what) {
        if (on) f.push_back(what);
    };
    add(p.options.causal, feature::causal);
    add(!p.mask.empty(), feature::bool_mask);
    add(!p.additive_mask.empty(), feature::additive_mask);
    add(p.options.return_weights, feature::weights);
    add(p.options.precision == precision::fp16, feature::fp16);
    add(!p.bq.empty() || !p.bk.empty() || !p.bv.empty(), feature::biases);
    add(p.shape.d_out != 0, feature::output_projection);
    return f;
}

std::vector<feature> features_of(element_type stored) {
    if (stored == element_type::f16) return {feature::kv_f16};
    if (is_quantized(stored)) return {feature::kv_quantized};
    return {};
}

void require_supported(entry_point entry, std::span<const feature> asked) {
    for (const feature f : asked)
        if (const refusal* r = refused(entry, f))
            throw invalid_argument(std::string(name_of(entry)) + ": " + std::string(name_of(f)) +
                                   " is not available: " + std::string(r->why));
}

void require_supported(entry_point entry, const sdpa_problem& problem) {
    require_supported(entry, features_of(problem));
}
void require_supported(entry_point entry, const sdpa_problem_f64& problem) {
    require_supported(entry, features_of(problem));
}
void require_supported(entry_point entry, const attention_problem& problem) {
    require_supported(entry, features_of(problem));
}

}  // namespace qkv
