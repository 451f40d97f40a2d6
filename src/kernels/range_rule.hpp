// The overflow rule of the Vulkan backend (README, Guarantees), written once for every call path:
// the attention's range guard (range_guard.hpp: bounds from the device, or proven on the host) and
// sdpa's and decode's host checks (src/run/sdpa_guard.hpp) build their verdicts here.
//
// With every input finite a call returns the answer or throws numeric_overflow. The kernels keep
// scores and value sums in float32, so for each (batch, head):
//   - max(1, |scale|) · max ||q_i|| (and ||k_j||) <= 2^127: kernels may scale Q or K first;
//   - max(1, |scale|) · max ||q_i|| · max ||k_j|| <= 2^127 (it bounds every partial sum of every
//     dot product and every scaled score, by Cauchy-Schwarz), and that plus the largest finite
//     |additive mask entry| stays within float32 (sum_limit);
//   - kv_len · max |v| <= 2^127 (the online softmax adds up to kv_len values weighted by at most 1),
//     or the values are accumulated scaled by a power of two (sdpa_guard.hpp).
// 2^127 leaves a factor 2 of headroom for the kernels (differences of scores, exp2 with a log2(e)
// factor).
#pragma once

#include <cfloat>
#include <cstdint>
#include <string>

namespace qkv::vulkan::detail {

inline constexpr double score_limit = 0x1p127;  // scores and value sums: FLT_MAX / 2, a factor 2 of headroom
inline constexpr double float_max = FLT_MAX;
// A float32 sum rounds to inf only from FLT_MAX + half an ulp (2^103) on; a quarter ulp keeps a
// margin. So a mask of -FLT_MAX (torch.finfo(float32).min) stays legal next to ordinary scores.
inline constexpr double sum_limit = float_max + 0x1p102;

/// Three significant digits, as the messages print every magnitude.
std::string format_number(double v);

/// Bounds of one (batch, head)'s scores, with any margin already applied.
struct score_bounds {
    double q = 0, k = 0;     ///< largest row norms of Q and K
    double scaled_rows = 0;  ///< max(1, |scale|) · max(q, k)
    double scores = 0;       ///< max(1, |scale|) · q · k
};

/// Empty where the scores of `where` ("batch 0, head 3") stay in range, else the message saying
/// what overflows (the caller adds "every input is finite" and its advice).
std::string score_verdict(const score_bounds& b, float scale, double additive_max, const std::string& where);

/// Empty where `keys` · `v` (the bound `values`, margin applied) stays in range, else the message.
std::string value_verdict(std::uint64_t keys, double v, double values, const std::string& where);

}  // namespace qkv::vulkan::detail
