// Ragged batches (qkv/runtime/varlen.hpp): their validation, the one split into per-sequence SDPA
// problems and the scatter of their results, and the float64 CPU reference over them, which runs
// each sequence through qkv::cpu::sdpa, the one reference.
#include "qkv/runtime/varlen.hpp"

#include <algorithm>
#include <limits>
#include <new>
#include <string>
#include <vector>

#include "qkv/runtime/capabilities.hpp"
#include "qkv/runtime/cpu.hpp"
#include "qkv/runtime/error.hpp"
#include "runtime/ragged_checks.hpp"
#include "runtime/shape_checks.hpp"

namespace qkv {
namespace {

using shape_checks::checked_product;
using shape_checks::expect_size;
using shape_checks::fail;

/// Checks one offset list; returns its largest step (the longest sequence).
std::size_t check_offsets(const char* name, std::span<const std::int32_t> cu) {
    std::size_t longest = 0;
    if (cu[0] != 0) fail(std::string(name) + "[0] is " + std::to_string(cu[0]) + ": the offsets must start at 0");
    for (std::size_t b = 1; b < cu.size(); ++b) {
        if (cu[b] < cu[b - 1])
            fail(std::string(name) + " must be nondecreasing: " + name + "[" + std::to_string(b) +
                 "] = " + std::to_string(cu[b]) + " is below " + name + "[" + std::to_string(b - 1) +
                 "] = " + std::to_string(cu[b - 1]));
        longest = std::max(longest, static_cast<std::size_t>(cu[b] - cu[b - 1]));
    }
    return longest;
}

template <class T>
void check_varlen(const basic_varlen_problem<T>& p) {
    if (p.q_heads == 0 || p.kv_heads == 0 || p.d_qk == 0 || p.d_v == 0)
        fail("q_heads, kv_heads, d_qk and d_v must be at least 1 (they are " + std::to_string(p.q_heads) + ", " +
             std::to_string(p.kv_heads) + ", " + std::to_string(p.d_qk) + ", " + std::to_string(p.d_v) + ")");
    if (p.cu_seqlens_q.size() < 2)
        fail("cu_seqlens_q has " + std::to_string(p.cu_seqlens_q.size()) +
             " entries: a batch of B >= 1 sequences has B + 1 offsets");
    if (p.cu_seqlens_k.size() != p.cu_seqlens_q.size())
        fail("cu_seqlens_k has " + std::to_string(p.cu_seqlens_k.size()) + " entries, cu_seqlens_q " +
             std::to_string(p.cu_seqlens_q.size()) + ": both are B + 1 offsets");
    const std::size_t longest_q = check_offsets("cu_seqlens_q", p.cu_seqlens_q);
    const std::size_t longest_k = check_offsets("cu_seqlens_k", p.cu_seqlens_k);
    if (p.max_seqlen_q < longest_q)
        fail("max_seqlen_q is " + std::to_string(p.max_seqlen_q) + ", below the longest sequence's " +
             std::to_string(longest_q) + " queries");
    if (p.max_seqlen_k < longest_k)
        fail("max_seqlen_k is " + std::to_string(p.max_seqlen_k) + ", below the longest sequence's " +
             std::to_string(longest_k) + " keys");
    const auto total_q = static_cast<std::size_t>(p.cu_seqlens_q.back());
    const auto total_k = static_cast<std::size_t>(p.cu_seqlens_k.back());
    expect_size("q", p.q, {{"total_q = cu_seqlens_q[B]", total_q}, {"q_heads", p.q_heads}, {"d_qk", p.d_qk}});
    expect_size("k", p.k, {{"total_k = cu_seqlens_k[B]", total_k}, {"kv_heads", p.kv_heads}, {"d_qk", p.d_qk}});
    expect_size("v", p.v, {{"total_k = cu_seqlens_k[B]", total_k}, {"kv_heads", p.kv_heads}, {"d_v", p.d_v}});
    (void)checked_product({{"total_q", total_q}, {"q_heads", p.q_heads}, {"d_v", p.d_v}});
    validate_per_sequence_rules<T>(p);
}

/// Rows [first, first + n) of a packed (total, H, D) array, in (H, n, D) order.
template <class T>
std::vector<T> gather(std::span<const T> packed, std::size_t first, std::size_t n, std::size_t heads, std::size_t d) {
    std::vector<T> out(heads * n * d);
    for (std::size_t h = 0; h < heads; ++h)
        for (std::size_t i = 0; i < n; ++i)
            std::copy_n(packed.begin() + static_cast<std::ptrdiff_t>(((first + i) * heads + h) * d), d,
                        out.begin() + static_cast<std::ptrdiff_t>((h * n + i) * d));
    return out;
}

template <class T>
basic_varlen_sequence<T> sequence_at(const basic_varlen_problem<T>& p, std::size_t b) {
    basic_varlen_sequence<T> s;
    const sdpa_shape shape = sequence_shape(p, b);
    const auto q0 = static_cast<std::size_t>(p.cu_seqlens_q[b]), k0 = static_cast<std::size_t>(p.cu_seqlens_k[b]);
    s.q = gather(p.q, q0, shape.q_len, p.q_heads, p.d_qk);
    s.k = gather(p.k, k0, shape.kv_len, p.kv_heads, p.d_qk);
    s.v = gather(p.v, k0, shape.kv_len, p.kv_heads, p.d_v);
    s.problem.shape = shape;
    s.problem.q = s.q, s.problem.k = s.k, s.problem.v = s.v;
    s.problem.options = p.options;
    s.problem.sinks = p.sinks;
    s.problem.alibi_slopes = p.alibi_slopes;
    return s;
}

template <class T>
sdpa_shape shape_at(const basic_varlen_problem<T>& p, std::size_t b) {
    if (b + 1 >= p.cu_seqlens_q.size() || b + 1 >= p.cu_seqlens_k.size())
        throw invalid_argument("sequence " + std::to_string(b) + " of a batch of " +
                               std::to_string(p.cu_seqlens_q.size() ? p.cu_seqlens_q.size() - 1 : 0));
    return {.batch = 1,
            .q_heads = p.q_heads,
            .kv_heads = p.kv_heads,
            .q_len = static_cast<std::size_t>(p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b]),
            .kv_len = static_cast<std::size_t>(p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b]),
            .d_qk = p.d_qk,
            .d_v = p.d_v};
}

}  // namespace

void validate(const varlen_problem& problem) { check_varlen(problem); }
void validate(const varlen_problem_f64& problem) { check_varlen(problem); }

std::size_t batch_of(const varlen_problem& problem) { return problem.cu_seqlens_q.size() - 1; }
std::size_t batch_of(const varlen_problem_f64& problem) { return problem.cu_seqlens_q.size() - 1; }

sdpa_shape sequence_shape(const varlen_problem& problem, std::size_t b) { return shape_at(problem, b); }
sdpa_shape sequence_shape(const varlen_problem_f64& problem, std::size_t b) { return shape_at(problem, b); }

basic_varlen_sequence<float> sequence_of(const varlen_problem& problem, std::size_t b) {
    return sequence_at(problem, b);
}
basic_varlen_sequence<double> sequence_of(const varlen_problem_f64& problem, std::size_t b) {
    return sequence_at(problem, b);
}

template <class T>
basic_varlen_output<T> empty_output(const basic_varlen_problem<T>& p) {
    basic_varlen_output<T> out;
    const auto total_q = static_cast<std::size_t>(p.cu_seqlens_q.back());
    out.output.assign(total_q * p.q_heads * p.d_v, T{0});
    if (p.options.return_lse) out.lse.assign(p.q_heads * total_q, T{0});
    return out;
}

template <class T>
void scatter_sequence(const basic_varlen_problem<T>& p, std::size_t b, std::span<const T> output,
                      std::span<const T> lse, basic_varlen_output<T>& into) {
    const sdpa_shape s = sequence_shape(p, b);
    const std::size_t L = s.q_len, H = p.q_heads, Ev = p.d_v, q0 = static_cast<std::size_t>(p.cu_seqlens_q[b]);
    const auto total_q = static_cast<std::size_t>(p.cu_seqlens_q.back());
    const bool keyless = output.empty();
    if ((!keyless && output.size() != H * L * Ev) || (p.options.return_lse && !keyless && lse.size() != H * L))
        throw error("internal: sequence " + std::to_string(b) + "'s result does not fit its shape");
    for (std::size_t h = 0; h < H; ++h)
        for (std::size_t i = 0; i < L; ++i) {
            T* to = into.output.data() + ((q0 + i) * H + h) * Ev;
            if (keyless)
                std::fill_n(to, Ev, T{0});
            else
                std::copy_n(output.data() + (h * L + i) * Ev, Ev, to);
            if (p.options.return_lse)
                into.lse[h * total_q + q0 + i] = keyless ? -std::numeric_limits<T>::infinity() : lse[h * L + i];
        }
}

template QKV_RUNTIME_API void scatter_sequence(const varlen_problem&, std::size_t, std::span<const float>,
                                               std::span<const float>, varlen_output&);
template QKV_RUNTIME_API void scatter_sequence(const varlen_problem_f64&, std::size_t, std::span<const double>,
                                               std::span<const double>, varlen_output_f64&);
template QKV_RUNTIME_API varlen_output empty_output(const varlen_problem&);
template QKV_RUNTIME_API varlen_output_f64 empty_output(const varlen_problem_f64&);

}  // namespace qkv

namespace qkv::cpu {
namespace {

/// Each sequence through the one reference (qkv::cpu::sdpa over its float64 problem).
varlen_output_f64 compute_f64(const varlen_problem_f64& p) {
    validate(p);
    require_supported(entry_point::cpu_varlen, p);
    varlen_output_f64 out = empty_output(p);
    for (std::size_t b = 0; b < batch_of(p); ++b) {
        const basic_varlen_sequence<double> s = sequence_of(p, b);
        if (s.problem.shape.q_len == 0) continue;
        if (s.problem.shape.kv_len == 0) {
            scatter_sequence<double>(p, b, {}, {}, out);
            continue;
        }
        const sdpa_output_f64 r = sdpa(s.problem);
        scatter_sequence<double>(p, b, r.output, r.lse, out);
    }
    out.device = "cpu reference";
    return out;
}

/// A float32 problem widened exactly to float64.
struct widened {
    std::vector<double> q, k, v, sinks, slopes;
    varlen_problem_f64 problem;
    explicit widened(const varlen_problem& p)
        : q(p.q.begin(), p.q.end()),
          k(p.k.begin(), p.k.end()),
          v(p.v.begin(), p.v.end()),
          sinks(p.sinks.begin(), p.sinks.end()),
          slopes(p.alibi_slopes.begin(), p.alibi_slopes.end()),
          problem{.q_heads = p.q_heads,
                  .kv_heads = p.kv_heads,
                  .d_qk = p.d_qk,
                  .d_v = p.d_v,
                  .cu_seqlens_q = p.cu_seqlens_q,
                  .cu_seqlens_k = p.cu_seqlens_k,
                  .max_seqlen_q = p.max_seqlen_q,
                  .max_seqlen_k = p.max_seqlen_k,
                  .q = q,
                  .k = k,
                  .v = v,
                  .options = p.options,
                  .sinks = sinks,
                  .alibi_slopes = slopes} {}
    widened(const widened&) = delete;
    widened& operator=(const widened&) = delete;
};

}  // namespace

varlen_output_f64 sdpa(const varlen_problem_f64& problem) { return compute_f64(problem); }

varlen_output_f64 sdpa_f64(const varlen_problem& problem) {
    validate(problem);
    require_supported(entry_point::cpu_varlen, problem);
    const widened w(problem);
    return compute_f64(w.problem);
}

varlen_output sdpa(const varlen_problem& problem) {
    const varlen_output_f64 r = sdpa_f64(problem);
    varlen_output out;
    out.output.assign(r.output.begin(), r.output.end());
    out.lse.assign(r.lse.begin(), r.lse.end());
    out.device = r.device;
    return out;
}

}  // namespace qkv::cpu
