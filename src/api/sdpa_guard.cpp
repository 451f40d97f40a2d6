#include "api/sdpa_guard.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <string>

#include "kernels/range_rule.hpp"
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
    float largest = 0.0f;
    for (const float a : problem.additive_mask) {
        const float m = std::fabs(a);
        if (m <= FLT_MAX)
            largest = std::max(largest, m);
        else if (!(a < 0.0f))
            f.additive_nan_or_pos_inf = true;  // NaN or +inf (-inf masks)
    }
    f.additive_max = largest;
}

}  // namespace

void kv_stats::add(std::span<const float> k, std::span<const float> v, std::size_t groups, std::size_t rows,
                   std::size_t d_qk, std::size_t d_v) {
    if (k_norm.size() != groups) k_norm.assign(groups, 0.0);
    if (rows == 0) return;
    finite = fold_row_norms(k, d_qk, rows, k_norm) && finite;
    (void)d_v;
    finite = fold_abs_max(v, v_max) && finite;
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
