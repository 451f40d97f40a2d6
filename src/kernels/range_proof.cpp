// The host's side of the range guard (range_guard.hpp): what one pass over a call's host inputs
// proves, so that the device guard need not run, and the verdicts the host gives by itself. Pure
// functions of the plan and the host data (part of qkv_plan: no Vulkan).
#include "kernels/range_proof.hpp"

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <span>
#include <string>
#include <vector>

#include "kernels/range_rule.hpp"
#include "qkv/vulkan/error.hpp"

namespace qkv::vulkan::detail {
namespace {

bool all_finite(std::span<const float> values) {
    // Branch-free over the bits, so the compiler can vectorise it: exponent all ones = inf or NaN.
    std::uint32_t bad = 0;
    for (const float f : values) {
        const auto u = std::bit_cast<std::uint32_t>(f);
        bad |= static_cast<std::uint32_t>((u & 0x7f800000u) == 0x7f800000u);
    }
    return bad == 0;
}

/// The largest Euclidean norm of the rows of a row-major matrix `cols` wide, in float64: +inf or
/// NaN where an element is not finite (a float's square cannot overflow a double).
double largest_row_norm(std::span<const float> m, std::size_t cols) {
    double largest = 0.0;
    for (std::size_t at = 0; cols > 0 && at + cols <= m.size(); at += cols) {
        double s[4] = {0.0, 0.0, 0.0, 0.0};  // four independent sums, so the loop vectorises
        std::size_t k = 0;
        for (; k + 4 <= cols; k += 4)
            for (std::size_t j = 0; j < 4; ++j) s[j] += static_cast<double>(m[at + k + j]) * m[at + k + j];
        for (; k < cols; ++k) s[0] += static_cast<double>(m[at + k]) * m[at + k];
        const double row = (s[0] + s[1]) + (s[2] + s[3]);
        if (!std::isfinite(row)) return row;  // inf or NaN: some element is not finite
        largest = std::max(largest, row);
    }
    return std::sqrt(largest);
}

/// The squared Euclidean norm of each column of a row-major matrix `cols` wide, in float64.
std::vector<double> column_squares(std::span<const float> m, std::size_t cols) {
    std::vector<double> s(cols, 0.0);
    for (std::size_t at = 0; cols > 0 && at + cols <= m.size(); at += cols)
        for (std::size_t c = 0; c < cols; ++c) s[c] += static_cast<double>(m[at + c]) * m[at + c];
    return s;
}

}  // namespace

const char* advice(const plan& p) {
    return p.fp16 ? "use precision fp32 instead of fp16, scale the inputs down, or use the float64 cpu backend "
                    "(qkv::cpu::attention; qkv attention --backend cpu)"
                  : "scale the inputs down, or use the float64 cpu backend (qkv::cpu::attention; qkv attention "
                    "--backend cpu)";
}

/// The exact (float64) value of element `col` of projected row `row`: Q, K or V.
double exact_projection(const attention_problem& problem, std::size_t row, std::size_t col) {
    const attention_shape& s = problem.shape;
    std::span<const float> w = problem.wq, b = problem.bq;
    std::size_t width = s.d_k;
    if (col >= 2 * s.d_k) {
        col -= 2 * s.d_k;
        w = problem.wv, b = problem.bv, width = s.d_v;
    } else if (col >= s.d_k) {
        col -= s.d_k;
        w = problem.wk, b = problem.bk;
    }
    double sum = b.empty() ? 0.0 : static_cast<double>(b[col]);
    for (std::size_t k = 0; k < s.d_in; ++k)
        sum += static_cast<double>(problem.x[row * s.d_in + k]) * static_cast<double>(w[k * width + col]);
    return sum;
}

void nonfinite_projection(const plan& p, const attention_problem* problem, std::uint32_t index) {
    const std::size_t row = index / p.ld, col = index % p.ld;
    const std::size_t b = row / p.seq, i = row % p.seq;
    const char* which = col < p.d_k ? "Q" : col < 2ull * p.d_k ? "K" : "V";
    const std::size_t c = col < p.d_k ? col : col < 2ull * p.d_k ? col - p.d_k : col - 2ull * p.d_k;
    const std::string where = std::string("numeric overflow in the Q|K|V projection: ") + which + "[batch " +
                              std::to_string(b) + ", position " + std::to_string(i) + ", column " + std::to_string(c) +
                              "]";
    if (!problem)  // device tensors: the host never saw the inputs
        throw numeric_overflow(where + " is not finite in " + (p.fp16 ? "float16" : "float32") +
                               " though every input is finite; " + advice(p));
    const double exact = exact_projection(*problem, row, col);
    const double limit = p.fp16 ? 65504.0 : float_max;
    std::string message = where + " is " + format_number(exact) + " (computed in float64)";
    if (std::fabs(exact) > limit)
        message += p.fp16 ? ", beyond float16's largest value 65504, so it cannot be stored in fp16"
                          : ", beyond float32's largest value " + format_number(float_max);
    else
        message += ", but its float32 sum over d_in overflowed on the way (a partial sum beyond " +
                   format_number(float_max) + ")";
    throw numeric_overflow(message + "; every input is finite; " + advice(p));
}

input_facts scan_inputs(const attention_problem& problem) {
    input_facts f;
    // One pass over x gives both its finiteness and the norm that range_proven_on_host needs.
    f.x_row_norm = largest_row_norm(problem.x, problem.shape.d_in);
    f.projection_inputs_finite = std::isfinite(f.x_row_norm) && all_finite(problem.wq) && all_finite(problem.wk) &&
                                 all_finite(problem.wv) && all_finite(problem.bq) && all_finite(problem.bk) &&
                                 all_finite(problem.bv);
    f.output_inputs_finite = all_finite(problem.wo) && all_finite(problem.bo);
    float largest = 0.0f;
    bool poison = false;
    for (const float a : problem.additive_mask) {
        const float m = std::fabs(a);
        if (m <= FLT_MAX) {
            largest = std::max(largest, m);
        } else if (!(a < 0.0f)) {
            poison = true;  // NaN or +inf (-inf masks)
        }
    }
    f.additive_max = largest;
    f.additive_nan_or_pos_inf = poison;
    return f;
}

bool range_proven_on_host(const plan& p, const attention_problem& problem, const input_facts& facts) {
    if (!facts.projection_inputs_finite) return false;  // the documented NaN rules: the device's verdicts
    // float16 rounds every partial sum of a split projection once more: leave those to the device.
    if (p.fp16 && p.project.chunk_k < p.d_in) return false;
    const double x = facts.x_row_norm;
    // The device's float32 sums differ from the exact ones by at most (d_in + 1)·2^-24 of the sum
    // of |terms| (plus the bias), which Cauchy-Schwarz bounds too; float16 storage rounds once more
    // (2^-11). The margin covers both, and the float64 arithmetic here, with room to spare.
    const double margin = (1.0 + (static_cast<double>(p.d_in) + 8.0) * 0x1p-23) * (p.fp16 ? 1.0 + 0x1p-10 : 1.0);
    double element = 0.0, q = 0.0, k = 0.0, v = 0.0;  // bounds on |element|, ||q_i||, ||k_j||, |v_jc|
    // One of Q, K, V: `w` d_in x width, `b` empty or width; heads of width / p.heads columns.
    const auto bound = [&](std::span<const float> w, std::span<const float> b, std::uint32_t width, double* norm) {
        const std::vector<double> cols = column_squares(w, width);
        const std::uint32_t head_width = width / p.heads;
        for (std::uint32_t h = 0; h < p.heads; ++h) {
            double w_sq = 0.0, b_sq = 0.0;
            for (std::uint32_t c = h * head_width; c < (h + 1) * head_width; ++c) {
                const double bias = b.empty() ? 0.0 : std::fabs(static_cast<double>(b[c]));
                const double e = x * std::sqrt(cols[c]) + bias;
                element = std::max(element, e);
                if (!norm) v = std::max(v, e);
                w_sq += cols[c];
                b_sq += bias * bias;
            }
            if (norm) *norm = std::max(*norm, x * std::sqrt(w_sq) + std::sqrt(b_sq));
        }
    };
    bound(problem.wq, problem.bq, p.d_k, &q);
    bound(problem.wk, problem.bk, p.d_k, &k);
    bound(problem.wv, problem.bv, p.d_v, nullptr);
    element *= margin, q *= margin, k *= margin, v *= margin;
    const double scale = std::max(1.0, std::fabs(static_cast<double>(p.scale)));
    const double scores = scale * q * k;
    const bool elements = element <= (p.fp16 ? 65504.0 : score_limit);  // check 1 (every partial sum too)
    const bool rows = scale * std::max(q, k) <= score_limit;            // check 2: Q or K scaled first,
    const bool dots = scores <= score_limit && scores + facts.additive_max <= sum_limit;  // and the scores
    const bool sums = static_cast<double>(p.seq) * v <= score_limit;                      // check 3
    return elements && rows && dots && sums;
}

void check_outputs(const attention_output& result, const plan& p, const input_facts& facts) {
    if (!facts.every_output_defined()) return;
    const auto bad = [](float f) { return !std::isfinite(f); };
    if (const auto it = std::find_if(result.output.begin(), result.output.end(), bad); it != result.output.end()) {
        const std::size_t index = static_cast<std::size_t>(it - result.output.begin());
        const std::size_t width = result.shape.out_width();
        throw numeric_overflow("numeric overflow: output[batch " + std::to_string(index / width / p.seq) +
                               ", position " + std::to_string(index / width % p.seq) + ", column " +
                               std::to_string(index % width) + "] is " + format_number(*it) +
                               " though every input is finite (" +
                               (p.d_out ? "the output projection or an earlier float32 sum" : "a float32 sum") +
                               " left float32's range); " + advice(p));
    }
    if (std::any_of(result.weights.begin(), result.weights.end(), bad))
        throw numeric_overflow(std::string("numeric overflow: a returned attention weight is not finite though every "
                                           "input is finite; ") +
                               advice(p));
}

}  // namespace qkv::vulkan::detail
