#include "run/sdpa_guard.hpp"

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "contract/backward.h"
#include "contract/tensor.h"
#include "kernels/range_rule.hpp"
#include "qkv/runtime/half.hpp"
#include "qkv/vulkan/error.hpp"

namespace qkv::vulkan::detail {
namespace {

constexpr const char* advice =
    "scale the inputs down, or use the float64 cpu backend (qkv::cpu::sdpa; qkv sdpa --backend cpu)";

/// Squared norms of each row of `rows` rows of `width` (finite elements only) folded into
/// `norms[row / rows_per_group]` as the largest; returns whether every element was finite.
bool fold_row_norms(std::span<const float> m, std::size_t width, std::size_t rows_per_group,
                    std::vector<double>& norms) {
    bool finite = true;
    const std::size_t rows = width ? m.size() / width : 0;
    for (std::size_t r = 0; r < rows; ++r) {
        double s = 0.0;
        for (std::size_t c = 0; c < width; ++c) {
            const float x = m[r * width + c];
            if (std::isfinite(x))
                s += static_cast<double>(x) * x;
            else
                finite = false;
        }
        double& n = norms[r / rows_per_group];
        n = std::max(n, std::sqrt(s));
    }
    return finite;
}

bool fold_abs_max(std::span<const float> v, double& largest) {
    bool finite = true;
    float m = 0.0f;
    for (const float x : v) {
        if (std::isfinite(x))
            m = std::max(m, std::fabs(x));
        else
            finite = false;
    }
    largest = std::max(largest, static_cast<double>(m));
    return finite;
}

void scan_queries(sdpa_facts& f, const sdpa_problem& problem) {
    const sdpa_shape& s = problem.shape;
    f.q_norm.assign(s.batch * s.q_heads, 0.0);
    f.inputs_finite = fold_row_norms(problem.q, s.d_qk, s.q_len, f.q_norm) && f.inputs_finite;
    const additive_facts a = scan_additive(problem.additive_mask);
    f.additive_max = a.max;
    f.additive_nan_or_pos_inf = a.nan_or_pos_inf;
}

}  // namespace

std::uint64_t guard_words::bytes(std::size_t q_groups, std::size_t kv_groups) {
    return 4 * (contract::GUARD_HEADER_WORDS + q_groups + 2 * kv_groups);
}

guard_words guard_words::read(const std::byte* words, std::size_t q_groups, std::size_t kv_groups) {
    guard_words g;
    const auto word = [&](std::size_t i) {
        std::uint32_t w = 0;
        std::memcpy(&w, words + 4 * i, 4);
        return w;
    };
    const auto value = [&](std::size_t i) { return std::bit_cast<float>(word(i)); };
    g.flags = word(contract::GUARD_WORD_FLAGS);
    std::size_t at = contract::GUARD_HEADER_WORDS;
    for (std::size_t i = 0; i < q_groups; ++i) g.q_norm.push_back(value(at++));
    for (std::size_t i = 0; i < kv_groups; ++i) g.k_norm.push_back(value(at++));
    for (std::size_t i = 0; i < kv_groups; ++i) g.v_max.push_back(value(at++));
    return g;
}

kv_stats stats_of(const guard_words& w) {
    kv_stats s;
    s.finite = (w.flags & contract::GUARD_FLAG_INPUT_NONFINITE) == 0;
    s.k_norm.assign(w.k_norm.begin(), w.k_norm.end());
    for (const float v : w.v_max) s.v_max = std::max(s.v_max, static_cast<double>(v));
    return s;
}

void fold_host_rows(std::byte* words, const kv_stats& rows, std::size_t kv_groups) {
    // As the device pass keeps them: float bits, the larger kept; rounded up so the bound holds.
    const auto fold = [&](std::size_t i, double value) {
        float f = static_cast<float>(value);
        if (static_cast<double>(f) < value) f = std::nextafter(f, std::numeric_limits<float>::infinity());
        std::uint32_t old = 0;
        std::memcpy(&old, words + 4 * i, 4);
        if (std::bit_cast<std::uint32_t>(f) > old) std::memcpy(words + 4 * i, &f, 4);
    };
    const std::size_t k_at = contract::GUARD_HEADER_WORDS, v_at = k_at + kv_groups;
    for (std::size_t z = 0; z < kv_groups && z < rows.k_norm.size(); ++z) {
        fold(k_at + z, rows.k_norm[z]);
        fold(v_at + z, rows.v_max);
    }
    if (!rows.finite) {
        std::uint32_t flags = 0;
        std::memcpy(&flags, words, 4);
        flags |= contract::GUARD_FLAG_INPUT_NONFINITE;
        std::memcpy(words, &flags, 4);
    }
}

additive_facts scan_additive(std::span<const float> additive) {
    additive_facts a;
    float largest = 0.0f;
    for (const float x : additive) {
        const float m = std::fabs(x);
        if (m <= FLT_MAX)
            largest = std::max(largest, m);
        else if (!(x < 0.0f))
            a.nan_or_pos_inf = true;  // NaN or +inf (-inf masks)
    }
    a.max = largest;
    return a;
}

sdpa_facts facts_from_device(const guard_words& call, const kv_stats* cache, const additive_facts& additive) {
    sdpa_facts f;
    f.q_norm.assign(call.q_norm.begin(), call.q_norm.end());
    f.inputs_finite = (call.flags & contract::GUARD_FLAG_INPUT_NONFINITE) == 0;
    if (cache) {
        f.k_norm = cache->k_norm;
        f.v_max = cache->v_max;
        f.inputs_finite = f.inputs_finite && cache->finite;
    } else {
        f.k_norm.assign(call.k_norm.begin(), call.k_norm.end());
        for (const float v : call.v_max) f.v_max = std::max(f.v_max, static_cast<double>(v));
    }
    f.additive_max = additive.max;
    f.additive_nan_or_pos_inf = additive.nan_or_pos_inf;
    return f;
}

void check_value_sums(const sdpa_facts& f, std::uint64_t kv_len) {
    const double margin = 1.0 + 0x1p-20;
    const double values = static_cast<double>(kv_len) * f.v_max * margin;
    if (std::string why = value_verdict(kv_len, f.v_max, values, "the call"); !why.empty())
        throw numeric_overflow("sdpa: " + why +
                               " (a call over device tensors accumulates the values unscaled); every input is "
                               "finite; " +
                               advice);
}

void check_output_flag(const sdpa_facts& f, bool output_nonfinite) {
    if (output_nonfinite && f.every_output_defined())
        throw numeric_overflow(std::string("sdpa: an output element is not finite though every input is finite (a "
                                           "float32 sum left its range); ") +
                               advice);
}

void check_backward_verdict(std::uint32_t flags, std::uint32_t row, bool inputs_finite) {
    const std::uint32_t saved = contract::BWD_FLAG_BAD_LSE | contract::BWD_FLAG_BAD_OUT | contract::BWD_FLAG_NO_KEY;
    if ((flags & saved) != 0) {
        std::string why;
        if (flags & contract::BWD_FLAG_NO_KEY)
            why = "its lse says -inf (no key) where it attends to keys, or the reverse";
        else if (flags & contract::BWD_FLAG_BAD_LSE)
            why = "the probabilities recomputed from its lse do not sum to 1 with the sink's";
        else
            why = "its rowsum(d_out * out) differs from the one its recomputed probabilities give";
        throw qkv::invalid_argument("sdpa_backward: row " + std::to_string(row) +
                                    " (b·q_heads·q_len + h·q_len + i): " + why +
                                    ": out and lse must be this problem's forward results, to within 1 % (empty, "
                                    "they are recomputed)");
    }
    if ((flags & contract::BWD_FLAG_NONFINITE_GRADIENT) != 0 && inputs_finite &&
        (flags & contract::BWD_FLAG_NONFINITE_INPUT) == 0)
        throw numeric_overflow(
            "sdpa_backward: a gradient is not finite though every input is finite: the inputs are too large for "
            "these gradients in float32; scale them down, or use the float64 cpu reference "
            "(qkv::cpu::sdpa_backward_f64)");
}

void kv_stats::add(std::span<const float> k, std::span<const float> v, std::size_t groups, std::size_t rows,
                   std::size_t d_qk, std::size_t d_v) {
    if (k_norm.size() != groups) k_norm.assign(groups, 0.0);
    if (rows == 0) return;
    finite = fold_row_norms(k, d_qk, rows, k_norm) && finite;
    (void)d_v;
    finite = fold_abs_max(v, v_max) && finite;
}

void kv_stats::add_f16(std::span<const std::uint16_t> k, std::span<const std::uint16_t> v, std::size_t groups,
                       std::size_t rows, std::size_t d_qk, std::size_t d_v) {
    if (k_norm.size() != groups) k_norm.assign(groups, 0.0);
    if (rows == 0) return;
    constexpr std::size_t block = 4096;  // values widened at a time
    std::vector<float> wide;
    // Each group's rows a block of whole rows at a time: the same row sums as add().
    const std::size_t per = std::max<std::size_t>(1, block / std::max<std::size_t>(d_qk, 1));
    std::vector<double> norm(1);
    for (std::size_t z = 0; z < groups; ++z) {
        norm[0] = k_norm[z];
        for (std::size_t r = 0; r < rows; r += per) {
            const std::size_t n = std::min(per, rows - r);
            wide.resize(n * d_qk);
            qkv::from_half_bits(k.subspan((z * rows + r) * d_qk, n * d_qk), wide);
            finite = fold_row_norms(wide, d_qk, n, norm) && finite;
        }
        k_norm[z] = norm[0];
    }
    for (std::size_t at = 0; at < v.size(); at += block) {
        const std::size_t n = std::min(block, v.size() - at);
        wide.resize(n);
        qkv::from_half_bits(v.subspan(at, n), wide);
        finite = fold_abs_max(wide, v_max) && finite;
    }
    (void)d_v;
}

sdpa_facts scan_sdpa(const sdpa_problem& problem) {
    const sdpa_shape& s = problem.shape;
    sdpa_facts f;
    scan_queries(f, problem);
    f.k_norm.assign(s.batch * s.kv_heads, 0.0);
    f.inputs_finite = fold_row_norms(problem.k, s.d_qk, s.kv_len, f.k_norm) && f.inputs_finite;
    f.inputs_finite = fold_abs_max(problem.v, f.v_max) && f.inputs_finite;
    return f;
}

sdpa_facts scan_sdpa(const sdpa_problem& problem, const kv_stats& cache) {
    sdpa_facts f;
    scan_queries(f, problem);
    f.k_norm = cache.k_norm;
    f.v_max = cache.v_max;
    f.inputs_finite = f.inputs_finite && cache.finite;
    return f;
}

void check_sdpa_scores(const sdpa_facts& f, const sdpa_shape& s, float scale, bool fp16) {
    // The host's norms are exact to double rounding; float16 storage rounds each element by up to
    // 2^-11 of itself, and the kernels' float32 sums are covered by the rule's factor 2.
    const double margin = fp16 ? 1.0 + 0x1p-10 : 1.0 + 0x1p-20;
    const double sc = std::max(1.0, std::fabs(static_cast<double>(scale)));
    const std::size_t group = s.q_heads / s.kv_heads;
    for (std::size_t b = 0; b < s.batch; ++b)
        for (std::size_t h = 0; h < s.q_heads; ++h) {
            const double q = f.q_norm[b * s.q_heads + h] * margin;
            const double k = f.k_norm[b * s.kv_heads + h / group] * margin;
            const score_bounds bounds{q, k, sc * std::max(q, k), sc * q * k};
            const std::string where = "batch " + std::to_string(b) + ", head " + std::to_string(h);
            if (std::string why = score_verdict(bounds, scale, f.additive_max, where); !why.empty())
                throw numeric_overflow("sdpa: " + why + "; " + advice);
        }
}

float value_scale(const sdpa_facts& f, std::uint64_t kv_len) {
    const double sums = static_cast<double>(kv_len) * f.v_max;
    if (!(sums > 0x1p126)) return 1.0f;
    const int e = static_cast<int>(std::ceil(std::log2(sums))) - 126;  // sums · 2^-e <= 2^126
    return std::ldexp(1.0f, -e);
}

void finish_sdpa_output(std::vector<float>& out, const sdpa_facts& f, float scale, const sdpa_shape& s) {
    if (scale != 1.0f) {
        const float back = 1.0f / scale;  // a power of two: exact
        for (float& o : out) o *= back;
    }
    if (!f.every_output_defined()) return;
    const auto bad = std::find_if(out.begin(), out.end(), [](float x) { return !std::isfinite(x); });
    if (bad == out.end()) return;
    const std::size_t i = static_cast<std::size_t>(bad - out.begin());
    const std::size_t row = i / s.d_v, L = s.q_len;
    throw numeric_overflow("sdpa: output[batch " + std::to_string(row / L / s.q_heads) + ", head " +
                           std::to_string(row / L % s.q_heads) + ", row " + std::to_string(row % L) + ", column " +
                           std::to_string(i % s.d_v) + "] is " + format_number(*bad) +
                           ": the weighted sum of the values leaves float32's range (" + format_number(float_max) +
                           ") though every input is finite; " + advice);
}

}  // namespace qkv::vulkan::detail
