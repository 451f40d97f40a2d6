// The overflow rule (kernels/range_rule.hpp) for sdpa and decode calls, whose Q, K and V the host
// holds (or, for a kv_cache, saw when they were appended): one pass over the inputs gives their
// finiteness and the row norms the rule needs, exactly, so no device pass is needed. Where
// kv_len · max|v| could leave float32, the values are accumulated scaled by a power of two
// (exact) and the output scaled back when read, so a finite answer comes back finite.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "qkv/runtime/sdpa.hpp"

namespace qkv::vulkan::detail {

/// What an additive mask brings to the overflow rule: its largest |finite entry|, and whether an
/// entry is NaN or +inf (which makes its row NaN; -inf only masks).
struct additive_facts {
    double max = 0;
    bool nan_or_pos_inf = false;
};
[[nodiscard]] additive_facts scan_additive(std::span<const float> additive);

/// What the host knows of an sdpa call's inputs.
struct sdpa_facts {
    bool inputs_finite = true;             ///< every element of q, k and v is finite
    bool additive_nan_or_pos_inf = false;  ///< an additive-mask entry that makes its row NaN
    double additive_max = 0;               ///< largest |finite additive-mask entry|
    std::vector<double> q_norm;            ///< (B·Hq): largest row norm of q's finite elements
    std::vector<double> k_norm;            ///< (B·Hkv): the same for k
    double v_max = 0;                      ///< largest |finite element of v|
    [[nodiscard]] bool every_output_defined() const { return inputs_finite && !additive_nan_or_pos_inf; }
};

/// What a kv_cache keeps of the rows appended to it (the same facts, for K and V).
struct kv_stats {
    bool finite = true;
    std::vector<double> k_norm;  ///< (B·Hkv)
    double v_max = 0;
    void add(std::span<const float> k, std::span<const float> v, std::size_t groups, std::size_t rows, std::size_t d_qk,
             std::size_t d_v);
    /// The same of float16 values given as their bits: the facts of their float32 values (exact),
    /// widened a few rows at a time (no float32 copy of them all).
    void add_f16(std::span<const std::uint16_t> k, std::span<const std::uint16_t> v, std::size_t groups,
                 std::size_t rows, std::size_t d_qk, std::size_t d_v);
};

/// The words of the overflow rule's device pass (shaders/sdpa_guard.comp, contract/tensor.h): its
/// flags, then the largest q norm per (batch, query head), k norm and |v| per (batch, K/V head).
struct guard_words {
    std::uint32_t flags = 0;
    std::vector<float> q_norm, k_norm, v_max;
    [[nodiscard]] static std::uint64_t bytes(std::size_t q_groups, std::size_t kv_groups);
    /// Reads them from `words` (host-visible, after the device is done).
    static guard_words read(const std::byte* words, std::size_t q_groups, std::size_t kv_groups);
};

/// A kv_cache's statistics as the device pass (and host appends) keep them: words with no q
/// groups. fold_host_rows adds the host-computed facts of appended rows to them.
kv_stats stats_of(const guard_words& words);
void fold_host_rows(std::byte* words, const kv_stats& rows, std::size_t kv_groups);

/// The facts of a call over device tensors: q, k, v from the device pass (a cache's k and v from
/// its statistics), the masks from the host (they are host data in a planned call).
sdpa_facts facts_from_device(const guard_words& call, const kv_stats* cache, const additive_facts& additive);

/// Throws numeric_overflow where the value sums could leave float32: a planned call over device
/// tensors accumulates them unscaled (the host paths scale them instead, value_scale).
void check_value_sums(const sdpa_facts& facts, std::uint64_t kv_len);

/// Throws numeric_overflow where the device found a non-finite output though every input was finite.
void check_output_flag(const sdpa_facts& facts, bool output_nonfinite);

/// The backward pass's verdict (contract/backward.h: the flags and the first row whose saved
/// tensors are not the forward's): throws qkv::invalid_argument for saved out or lse that are not
/// this problem's forward results (naming the row), and numeric_overflow for a non-finite gradient
/// where every input was finite (`inputs_finite`: the host's scan; for device tensors, with the
/// prep kernel's flag for dO, out and lse).
void check_backward_verdict(std::uint32_t flags, std::uint32_t row, bool inputs_finite);

/// One pass over q, k, v and the additive mask.
sdpa_facts scan_sdpa(const sdpa_problem& problem);
/// One pass over q and the additive mask; k and v as a cache saw them.
sdpa_facts scan_sdpa(const sdpa_problem& problem, const kv_stats& cache);

/// Throws numeric_overflow where a score could leave float32 (the rule, per batch and head).
/// `fp16`: Q, K and V are stored as float16 (a margin for their rounding).
void check_sdpa_scores(const sdpa_facts& facts, const sdpa_shape& shape, float scale, bool fp16);

/// The power of two the values are multiplied by while accumulated: 1 where kv_len · max|v| stays
/// within 2^126, else the largest that brings it there.
float value_scale(const sdpa_facts& facts, std::uint64_t kv_len);

/// After the readback: multiplies the output by 1 / `scale` (exact), then throws numeric_overflow
/// for a non-finite element where every input was finite (the result left float32's range).
void finish_sdpa_output(std::vector<float>& out, const sdpa_facts& facts, float scale, const sdpa_shape& shape);

}  // namespace qkv::vulkan::detail
