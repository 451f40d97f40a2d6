// Which entry point takes which feature of a problem: one table, consulted by every entry point
// through require_supported() before it does anything, and listed in the README ("What each entry
// point takes"). A feature an entry point lacks is refused from here with qkv::invalid_argument
// naming the entry point, the feature and why; everything the table does not refuse, the entry
// point takes. Adding an entry point is adding its enumerator, its name and its refusals here, and
// a call of require_supported at its start (docs/architecture.md, "How to add an entry point").
#pragma once

#include <span>
#include <string_view>
#include <vector>

#include "qkv/runtime/export.hpp"
#include "qkv/runtime/paged.hpp"
#include "qkv/runtime/problem.hpp"
#include "qkv/runtime/sdpa.hpp"
#include "qkv/runtime/sdpa_backward.hpp"
#include "qkv/runtime/varlen.hpp"

namespace qkv {

/// The ways of running a problem, or of appending to a K/V cache.
enum class entry_point {
    cpu_sdpa,               ///< qkv::cpu::sdpa, sdpa_f64: host data, float64
    context_sdpa,           ///< qkv::vulkan::context::sdpa(problem): Q, K and V from the host
    context_decode,         ///< context::sdpa(problem, cache): K and V in a qkv::vulkan::kv_cache
    sdpa_call,              ///< qkv::vulkan::sdpa_call over device tensors: run()
    sdpa_call_decode,       ///< sdpa_call against a kv_cache: run()
    sequence_record,        ///< qkv::vulkan::sequence::record of an sdpa_call, attention_call or paged_call
    interop_record,         ///< qkv::vulkan::record (interop.hpp) of an sdpa_call, attention_call or paged_call
    mpi_sdpa,               ///< qkv::mpi::sdpa: context parallelism across ranks
    mpi_decode,             ///< qkv::mpi::sharded_kv_cache::decode
    cpu_attention,          ///< qkv::cpu::attention
    context_attention,      ///< context::attention
    attention_call,         ///< qkv::vulkan::attention_call over device tensors: run()
    cache_append,           ///< kv_cache::append of host data
    cache_append_tensors,   ///< kv_cache::append of device tensors, sequence::record_append, record_append
    mpi_append,             ///< qkv::mpi::sharded_kv_cache::append
    cpu_sdpa_backward,      ///< qkv::cpu::sdpa_backward, sdpa_backward_f64: the float64 reference's gradients
    context_sdpa_backward,  ///< qkv::vulkan::context::sdpa_backward: the gradients from host data
    sdpa_backward_call,     ///< qkv::vulkan::sdpa_backward_call over device tensors: run()
    cpu_varlen,             ///< qkv::cpu::sdpa over a ragged batch (varlen.hpp), float64
    context_varlen,         ///< context::sdpa over a ragged batch (varlen.hpp)
    cpu_paged,              ///< qkv::cpu::sdpa over a paged K/V batch (paged.hpp), float64
    context_paged,          ///< context::sdpa over a paged K/V batch (paged.hpp)
    paged_append,           ///< context::sdpa appending a paged batch's new rows into a device pool
    paged_call,             ///< qkv::vulkan::paged_call over device tensors: run()
};

/// What a problem (or an append) may ask of an entry point, by name: an option of sdpa_options
/// set to other than its default (its field's name from the option list, qkv/runtime/
/// sdpa_options.def: "softcap", "return_weights", ...; an attention problem's run_options by the
/// same names: "causal", "return_weights", "precision", "kernel", "scale"), a value of an option
/// that is a feature of its own (`values` below), or one of the inputs below. A field added to
/// the option list is a feature without an edit here, taken by every sdpa entry point until a
/// refusal below says otherwise.
using feature = std::string_view;

/// The values of an option that are features of their own, beside the option's ("kernel"): what
/// one entry point may take and another refuse although both take the option.
namespace values {
/// kernel_family::coopmat: the matrix units (VK_KHR_cooperative_matrix), fp16 only.
inline constexpr feature coopmat = "kernel = coopmat";
}  // namespace values

/// The features that are not options: the problem's inputs and a cache's storage.
namespace inputs {
inline constexpr feature grouped_query = "grouped_query";          ///< kv_heads < q_heads
inline constexpr feature mask = "mask";                            ///< a bool mask
inline constexpr feature additive_mask = "additive_mask";          ///< an additive mask
inline constexpr feature sinks = "sinks";                          ///< sink logits
inline constexpr feature alibi_slopes = "alibi_slopes";            ///< ALiBi slopes given per query head
inline constexpr feature kv_f16 = "f16 K/V";                       ///< K and V stored as f16
inline constexpr feature kv_quantized = "q8_0/q4_0 K/V";           ///< K and V stored as q8_0 or q4_0
inline constexpr feature biases = "biases";                        ///< attention: bq, bk or bv
inline constexpr feature output_projection = "output_projection";  ///< attention: wo (and bo)
inline constexpr feature d_additive_mask = "d_additive_mask";      ///< a backward pass: the additive mask's gradient
}  // namespace inputs

/// "context::sdpa with a kv_cache", ... (the names messages and the README use).
[[nodiscard]] QKV_RUNTIME_API std::string_view name_of(entry_point e);
/// Whether `what` is something the problems of `entry` can ask for at all: an sdpa entry point's
/// problem has no output projection, an attention problem no window, an append only a storage type.
[[nodiscard]] QKV_RUNTIME_API bool applies(entry_point entry, feature what);

/// Every entry point, and every feature (the option list's fields, the values, then the inputs), in order.
[[nodiscard]] QKV_RUNTIME_API std::span<const entry_point> entry_points();
[[nodiscard]] QKV_RUNTIME_API std::span<const feature> features();

/// One refusal of the table: `entry` does not take `what`, because `why`.
struct refusal {
    entry_point entry;
    feature what;
    std::string_view why;
};

/// Whether `f` is a feature: a field of the option list, one of `values`, or one of `inputs`.
[[nodiscard]] QKV_RUNTIME_API bool is_feature(feature f);

/// The whole table: every refusal (what it does not list, the entry point takes).
[[nodiscard]] QKV_RUNTIME_API std::span<const refusal> refusals();

/// Why `entry` does not take `what` (null: it does).
[[nodiscard]] QKV_RUNTIME_API const refusal* refused(entry_point entry, feature what);

/// The features a problem asks for.
[[nodiscard]] QKV_RUNTIME_API std::vector<feature> features_of(const sdpa_problem& problem);
[[nodiscard]] QKV_RUNTIME_API std::vector<feature> features_of(const sdpa_problem_f64& problem);
[[nodiscard]] QKV_RUNTIME_API std::vector<feature> features_of(const attention_problem& problem);
/// A backward problem's: its forward problem's, and d_additive_mask where asked.
[[nodiscard]] QKV_RUNTIME_API std::vector<feature> features_of(const sdpa_backward_problem& problem);
[[nodiscard]] QKV_RUNTIME_API std::vector<feature> features_of(const sdpa_backward_problem_f64& problem);
/// A ragged batch's: its options', grouped_query, sinks and the K/V storage, as an sdpa problem's.
[[nodiscard]] QKV_RUNTIME_API std::vector<feature> features_of(const varlen_problem& problem);
[[nodiscard]] QKV_RUNTIME_API std::vector<feature> features_of(const varlen_problem_f64& problem);
/// A paged batch's: as a ragged batch's.
[[nodiscard]] QKV_RUNTIME_API std::vector<feature> features_of(const paged_problem& problem);
[[nodiscard]] QKV_RUNTIME_API std::vector<feature> features_of(const paged_problem_f64& problem);
/// The features of a K/V cache's storage (an append, a decode against it): kv_f16, kv_quantized.
[[nodiscard]] QKV_RUNTIME_API std::vector<feature> features_of(element_type stored);

/// Throws qkv::invalid_argument "<entry>: <feature> is not available: <why>" for the first feature
/// of `asked` that `entry` does not take; returns for the rest.
QKV_RUNTIME_API void require_supported(entry_point entry, std::span<const feature> asked);
/// The same for a problem's features.
QKV_RUNTIME_API void require_supported(entry_point entry, const sdpa_problem& problem);
QKV_RUNTIME_API void require_supported(entry_point entry, const sdpa_problem_f64& problem);
QKV_RUNTIME_API void require_supported(entry_point entry, const attention_problem& problem);
QKV_RUNTIME_API void require_supported(entry_point entry, const sdpa_backward_problem& problem);
QKV_RUNTIME_API void require_supported(entry_point entry, const sdpa_backward_problem_f64& problem);
QKV_RUNTIME_API void require_supported(entry_point entry, const varlen_problem& problem);
QKV_RUNTIME_API void require_supported(entry_point entry, const varlen_problem_f64& problem);
QKV_RUNTIME_API void require_supported(entry_point entry, const paged_problem& problem);
QKV_RUNTIME_API void require_supported(entry_point entry, const paged_problem_f64& problem);

}  // namespace qkv
