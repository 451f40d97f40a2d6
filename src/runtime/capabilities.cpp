// The one table of what each entry point takes (qkv/runtime/capabilities.hpp).
#include "qkv/runtime/capabilities.hpp"

#include <algorithm>
#include <iterator>
#include <string>

#include "qkv/runtime/error.hpp"

namespace qkv {
namespace {

constexpr std::string_view no_weights_in_decode =
    "the split-S decode kernels never form the weights (B, Hq, L, S); context::sdpa with host K/V, or an "
    "sdpa_call without a cache, returns them";
constexpr std::string_view no_weights_in_ragged =
    "a ragged batch has no (B, Hq, L, S) weights; return_lse gives each row's normaliser";
constexpr std::string_view no_weights_across_ranks =
    "the weights of a row span every rank; return_lse gives what merging needs";
constexpr std::string_view no_slopes_across_ranks =
    "the ranks receive the options, not per-head data (mpi::cp_problem has no field for them); "
    "options.alibi_max_bias gives ggml's slopes";
constexpr std::string_view no_dropout_in_ragged =
    "dropout's mask is drawn per row of a (B, Hq, L) batch, which a ragged batch does not have; run "
    "its sequences as sdpa problems with their own dropout_offset";
constexpr std::string_view no_dropout_in_decode =
    "dropout is a training option and the split-S decode kernels do not draw its mask; context::sdpa with "
    "host K/V (the fused kernels) computes it";
constexpr std::string_view one_type_over_tensors =
    "q, k, v and d_out come as tensors of the precision's type (f32, or f16); K and V of another type, or "
    "as ggml's blocks (a decode cache's storage), only from the host (context::sdpa_backward rounds them)";
constexpr std::string_view no_dropout_across_ranks =
    "the mask is defined by each row's and key's place in the whole call, which a rank's block call does not "
    "carry; qkv::cpu::sdpa and context::sdpa compute it on one process";

// Options by their field's name in the option list (tests/capabilities_test.cpp checks each is one).
constexpr refusal table[] = {
    {entry_point::context_decode, "return_weights", no_weights_in_decode},
    {entry_point::sdpa_call_decode, "return_weights", no_weights_in_decode},
    {entry_point::mpi_sdpa, "return_weights", no_weights_across_ranks},
    {entry_point::mpi_decode, "return_weights", no_weights_across_ranks},
    {entry_point::mpi_sdpa, inputs::alibi_slopes, no_slopes_across_ranks},
    {entry_point::mpi_decode, inputs::alibi_slopes, no_slopes_across_ranks},
    {entry_point::attention_call, "return_weights",
     "the weights (B, H, N, N) are the staged route's scores buffer, which a call over tensors does not "
     "keep; context::attention returns them"},
    {entry_point::context_decode, "dropout_p", no_dropout_in_decode},
    {entry_point::sdpa_call_decode, "dropout_p", no_dropout_in_decode},
    {entry_point::mpi_sdpa, "dropout_p", no_dropout_across_ranks},
    {entry_point::mpi_decode, "dropout_p", no_dropout_across_ranks},
    {entry_point::sdpa_backward_call, "kv_type", one_type_over_tensors},
    {entry_point::sdpa_backward_call, inputs::kv_quantized, one_type_over_tensors},
    {entry_point::cpu_varlen, "return_weights", no_weights_in_ragged},
    {entry_point::context_varlen, "return_weights", no_weights_in_ragged},
    {entry_point::cpu_varlen, "dropout_p", no_dropout_in_ragged},
    {entry_point::context_varlen, "dropout_p", no_dropout_in_ragged},
    {entry_point::cpu_paged, "return_weights", no_weights_in_ragged},
    {entry_point::cpu_paged, "dropout_p", no_dropout_in_ragged},
    {entry_point::context_paged, "return_weights", no_weights_in_ragged},
    {entry_point::context_paged, "dropout_p", no_dropout_in_ragged},
    {entry_point::paged_call, "return_weights", no_weights_in_ragged},
    {entry_point::paged_call, "dropout_p", no_dropout_in_ragged},
};

constexpr entry_point all_entries[] = {entry_point::cpu_sdpa,
                                       entry_point::context_sdpa,
                                       entry_point::context_decode,
                                       entry_point::sdpa_call,
                                       entry_point::sdpa_call_decode,
                                       entry_point::sequence_record,
                                       entry_point::interop_record,
                                       entry_point::mpi_sdpa,
                                       entry_point::mpi_decode,
                                       entry_point::cpu_attention,
                                       entry_point::context_attention,
                                       entry_point::attention_call,
                                       entry_point::cache_append,
                                       entry_point::cache_append_tensors,
                                       entry_point::mpi_append,
                                       entry_point::cpu_sdpa_backward,
                                       entry_point::context_sdpa_backward,
                                       entry_point::sdpa_backward_call,
                                       entry_point::cpu_varlen,
                                       entry_point::context_varlen,
                                       entry_point::cpu_paged,
                                       entry_point::context_paged,
                                       entry_point::paged_append,
                                       entry_point::paged_call};

constexpr feature value_features[] = {values::coopmat};

constexpr feature input_features[] = {inputs::grouped_query,  inputs::mask,         inputs::additive_mask,
                                      inputs::sinks,          inputs::alibi_slopes, inputs::kv_f16,
                                      inputs::kv_quantized,   inputs::biases,       inputs::output_projection,
                                      inputs::d_additive_mask};

/// The option list's fields, the values, then the inputs.
const std::vector<feature>& all_features() {
    static const std::vector<feature> all = [] {
        std::vector<feature> f;
        for (const option_field& o : sdpa_option_fields) f.push_back(o.name);
        f.insert(f.end(), std::begin(value_features), std::end(value_features));
        f.insert(f.end(), std::begin(input_features), std::end(input_features));
        return f;
    }();
    return all;
}

/// The fields of an attention problem's run_options, by the option list's names.
constexpr feature attention_options[] = {"scale", "causal", "return_weights", "precision", "kernel"};

template <class T>
std::vector<feature> sdpa_features(const basic_sdpa_problem<T>& p) {
    std::vector<feature> f;
    for (const option_field* o : changed_fields(p.options)) f.push_back(o->name);
    const auto add = [&](bool on, feature what) {
        if (on) f.push_back(what);
    };
    add(p.options.kernel == kernel_family::coopmat, values::coopmat);
    add(p.shape.kv_heads != p.shape.q_heads, inputs::grouped_query);
    add(!p.mask.empty(), inputs::mask);
    add(!p.additive_mask.empty(), inputs::additive_mask);
    add(!p.sinks.empty(), inputs::sinks);
    add(!p.alibi_slopes.empty(), inputs::alibi_slopes);
    for (const feature s : features_of(stored_kv_type(p.options))) f.push_back(s);
    return f;
}

/// A ragged or a paged batch's: its options', grouped_query, sinks, slopes and the K/V storage.
template <class P>
std::vector<feature> varlen_features(const P& p) {
    std::vector<feature> f;
    for (const option_field* o : changed_fields(p.options)) f.push_back(o->name);
    if (p.options.kernel == kernel_family::coopmat) f.push_back(values::coopmat);
    if (p.kv_heads != p.q_heads) f.push_back(inputs::grouped_query);
    if (!p.sinks.empty()) f.push_back(inputs::sinks);
    if (!p.alibi_slopes.empty()) f.push_back(inputs::alibi_slopes);
    for (const feature s : features_of(stored_kv_type(p.options))) f.push_back(s);
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
        case entry_point::cpu_sdpa_backward:
            return "cpu::sdpa_backward";
        case entry_point::context_sdpa_backward:
            return "context::sdpa_backward";
        case entry_point::sdpa_backward_call:
            return "sdpa_backward_call";
        case entry_point::cpu_varlen:
            return "cpu::sdpa over a ragged batch";
        case entry_point::context_varlen:
            return "context::sdpa over a ragged batch";
        case entry_point::cpu_paged:
            return "cpu::sdpa over a paged K/V batch";
        case entry_point::context_paged:
            return "context::sdpa over a paged K/V batch";
        case entry_point::paged_append:
            return "context::sdpa appending into a paged K/V pool";
        case entry_point::paged_call:
            return "paged_call";
    }
    return "an unknown entry point";
}

bool applies(entry_point entry, feature what) {
    const bool storage = what == inputs::kv_f16 || what == inputs::kv_quantized;
    const bool attention_only = what == inputs::biases || what == inputs::output_projection;
    const bool backward_only = what == inputs::d_additive_mask;
    switch (entry) {
        case entry_point::cache_append:
        case entry_point::cache_append_tensors:
        case entry_point::mpi_append:
        case entry_point::paged_append:
            return storage;
        case entry_point::cpu_attention:
        case entry_point::context_attention:
        case entry_point::attention_call:
            return attention_only || what == inputs::mask || what == inputs::additive_mask || what == values::coopmat ||
                   std::find(std::begin(attention_options), std::end(attention_options), what) !=
                       std::end(attention_options);
        case entry_point::sequence_record:
        case entry_point::interop_record:
            return true;  // they record every kind of call
        case entry_point::cpu_varlen:
        case entry_point::context_varlen:
        case entry_point::cpu_paged:
        case entry_point::context_paged:
        case entry_point::paged_call:
            return !attention_only && !backward_only && what != inputs::mask &&
                   what != inputs::additive_mask;  // no masks
        case entry_point::cpu_sdpa_backward:
        case entry_point::context_sdpa_backward:
        case entry_point::sdpa_backward_call:
            return !attention_only;
        default:
            return !attention_only && !backward_only;
    }
}

bool is_feature(feature f) {
    const std::vector<feature>& all = all_features();
    return std::find(all.begin(), all.end(), f) != all.end();
}

std::span<const entry_point> entry_points() { return all_entries; }
std::span<const feature> features() { return all_features(); }
std::span<const refusal> refusals() { return table; }

const refusal* refused(entry_point entry, feature what) {
    for (const refusal& r : table)
        if (r.entry == entry && r.what == what) return &r;
    return nullptr;
}

std::vector<feature> features_of(const sdpa_problem& problem) { return sdpa_features(problem); }
std::vector<feature> features_of(const sdpa_problem_f64& problem) { return sdpa_features(problem); }

std::vector<feature> features_of(const varlen_problem& problem) { return varlen_features(problem); }
std::vector<feature> features_of(const varlen_problem_f64& problem) { return varlen_features(problem); }
std::vector<feature> features_of(const paged_problem& problem) { return varlen_features(problem); }
std::vector<feature> features_of(const paged_problem_f64& problem) { return varlen_features(problem); }

std::vector<feature> features_of(const attention_problem& p) {
    // run_options' fields by the option list's names (attention_options), set to other than
    // their defaults.
    std::vector<feature> f;
    const auto add = [&](bool on, feature what) {
        if (on) f.push_back(what);
    };
    const run_options defaults;
    add(p.options.scale.has_value(), "scale");
    add(p.options.causal != defaults.causal, "causal");
    add(p.options.return_weights != defaults.return_weights, "return_weights");
    add(p.options.precision != defaults.precision, "precision");
    add(p.options.kernel != defaults.kernel, "kernel");
    add(p.options.kernel == kernel_family::coopmat, values::coopmat);
    add(!p.mask.empty(), inputs::mask);
    add(!p.additive_mask.empty(), inputs::additive_mask);
    add(!p.bq.empty() || !p.bk.empty() || !p.bv.empty(), inputs::biases);
    add(p.shape.d_out != 0, inputs::output_projection);
    return f;
}

template <class T>
std::vector<feature> backward_features(const basic_sdpa_backward_problem<T>& p) {
    std::vector<feature> f = sdpa_features(p.forward);
    if (p.return_d_additive_mask) f.push_back(inputs::d_additive_mask);
    return f;
}

std::vector<feature> features_of(const sdpa_backward_problem& problem) { return backward_features(problem); }
std::vector<feature> features_of(const sdpa_backward_problem_f64& problem) { return backward_features(problem); }

std::vector<feature> features_of(element_type stored) {
    if (stored == element_type::f16) return {inputs::kv_f16};
    if (is_quantized(stored)) return {inputs::kv_quantized};
    return {};
}

void require_supported(entry_point entry, std::span<const feature> asked) {
    for (const feature f : asked)
        if (const refusal* r = refused(entry, f))
            throw invalid_argument(std::string(name_of(entry)) + ": " + std::string(f) +
                                   " is not available: " + std::string(r->why));
}

void require_supported(entry_point entry, const sdpa_problem& problem) {
    require_supported(entry, features_of(problem));
}
void require_supported(entry_point entry, const sdpa_problem_f64& problem) {
    require_supported(entry, features_of(problem));
}
void require_supported(entry_point entry, const sdpa_backward_problem& problem) {
    require_supported(entry, features_of(problem));
}
void require_supported(entry_point entry, const sdpa_backward_problem_f64& problem) {
    require_supported(entry, features_of(problem));
}
void require_supported(entry_point entry, const attention_problem& problem) {
    require_supported(entry, features_of(problem));
}
void require_supported(entry_point entry, const varlen_problem& problem) {
    require_supported(entry, features_of(problem));
}
void require_supported(entry_point entry, const varlen_problem_f64& problem) {
    require_supported(entry, features_of(problem));
}
void require_supported(entry_point entry, const paged_problem& problem) {
    require_supported(entry, features_of(problem));
}
void require_supported(entry_point entry, const paged_problem_f64& problem) {
    require_supported(entry, features_of(problem));
}

}  // namespace qkv
