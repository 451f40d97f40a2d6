// qkv::cpu — the float64 reference backend. Straight loops, every sum in double, results rounded
// to the caller's type once, when stored. No state outside a call. attention is the projections,
// then SDPA per head by the one float64 row (runtime/sdpa_rows.hpp, as qkv::cpu::sdpa), then the
// output projection.
#include "qkv/runtime/capabilities.hpp"
#include "qkv/runtime/cpu.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <new>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "qkv/runtime/error.hpp"
#include "runtime/parallel_for.hpp"
#include "runtime/sdpa_rows.hpp"
#include "runtime/shape_checks.hpp"

namespace qkv::cpu {
namespace {

using detail::parallel_for;
using detail::rows_per_item;

/// out (rows x d) = in (rows x d_in) · w (d_in x d) + b, row by row, in double. `In` is float
/// or double (the caller's inputs, or the concatenated heads); `W`, the caller's weight type.
/// For each output element the sum runs over k in order, starting from the bias.
template <class In, class W>
void project(std::span<const In> in, std::size_t rows, std::size_t d_in, std::span<const W> w, std::span<const W> b,
             std::size_t d, std::span<double> out) {
    const std::size_t work = rows * d_in * d;
    const std::size_t items = (rows + rows_per_item - 1) / rows_per_item;
    parallel_for(items, work, [&](std::size_t item) {
        const std::size_t first = item * rows_per_item, last = std::min(rows, first + rows_per_item);
        for (std::size_t i = first; i < last; ++i) {
            double* acc = out.data() + i * d;
            for (std::size_t c = 0; c < d; ++c) acc[c] = b.empty() ? 0.0 : static_cast<double>(b[c]);
            // i-k-c order: row k of w is read contiguously.
            for (std::size_t k = 0; k < d_in; ++k) {
                const double xv = static_cast<double>(in[i * d_in + k]);
                const W* wk = w.data() + k * d;
                for (std::size_t c = 0; c < d; ++c) acc[c] += xv * static_cast<double>(wk[c]);
            }
        }
    });
}

/// The shared computation: `T` is the type results are stored in (float or double).
template <class T>
struct results {
    std::vector<T> output;
    std::vector<T> weights;
};

/// `T`: the type results are stored in; `Problem`: attention_problem or attention_problem_f64.
template <class T, class Problem>
results<T> compute(const Problem& p) {
    using input = typename decltype(p.x)::value_type;  // float or double
    validate(p);
    if constexpr (std::is_same_v<Problem, attention_problem>) require_supported(entry_point::cpu_attention, p);

    const attention_shape& s = p.shape;
    const run_options& opt = p.options;
    const std::size_t B = s.batch, N = s.seq, H = s.heads;
    const std::size_t dk = s.d_k, dv = s.d_v;
    const std::size_t dkh = dk / H, dvh = dv / H;  // per-head widths
    const std::size_t rows = B * N;
    const bool batched_mask = p.mask.size() == B * N * N;
    const bool batched_additive = p.additive_mask.size() == B * N * N;

    // Projections for every batch element: Q, K (rows x d_k) and V (rows x d_v).
    std::vector<double> q(rows * dk), k(rows * dk), v(rows * dv);
    project<input, input>(p.x, rows, s.d_in, p.wq, p.bq, dk, q);
    project<input, input>(p.x, rows, s.d_in, p.wk, p.bk, dk, k);
    project<input, input>(p.x, rows, s.d_in, p.wv, p.bv, dv, v);
    // Kᵀ per batch element (d_k x seq): the layout the SDPA row reads K in.
    std::vector<double> kt(k.size());
    for (std::size_t b = 0; b < B; ++b)
        for (std::size_t j = 0; j < N; ++j)
            for (std::size_t c = 0; c < dk; ++c) kt[(b * dk + c) * N + j] = k[(b * N + j) * dk + c];
    k = {};

    // Each head is SDPA over its slice of the projections (qkv/runtime/sdpa.hpp): N queries and
    // keys, per-head widths, causal top-left, the masks broadcast over the heads.
    detail::head_rules rules;
    rules.shape = {.batch = B, .q_heads = H, .kv_heads = H, .q_len = N, .kv_len = N, .d_qk = dkh, .d_v = dvh};
    rules.options.causal = opt.causal;
    rules.options.alignment = causal_alignment::top_left;
    // The exact default scale (default_scale() returns it rounded to float).
    rules.scale = opt.scale ? static_cast<double>(*opt.scale) : 1.0 / std::sqrt(static_cast<double>(dkh));

    results<T> r;
    if (opt.return_weights) r.weights.assign(B * H * N * N, T{});
    std::vector<double> concat(rows * dv);  // head outputs side by side

    // Work item = (batch element, head, block of query rows); items write disjoint rows of
    // `concat` and `r.weights`.
    const std::size_t blocks = (N + rows_per_item - 1) / rows_per_item;
    const std::size_t items = B * H * blocks;
    const std::size_t work = B * H * N * N * (dkh + dvh + 1);
    parallel_for(items, work, [&](std::size_t item) {
        const std::size_t b = item / (H * blocks), h = (item / blocks) % H, block = item % blocks;
        const std::size_t first = block * rows_per_item, last = std::min(N, first + rows_per_item);
        detail::head_data<double, double, double, input> data;
        data.q = q.data() + b * N * dk + h * dkh;  // row i of head h: + i * dk
        data.q_stride = dk;
        data.kt = kt.data() + (b * dk + h * dkh) * N;  // column c of head h's keys: + c * N
        data.kt_stride = N;
        data.v = v.data() + b * N * dv + h * dvh;
        data.v_stride = dv;
        // A mask is seq x seq (shared by the batch) or batch x seq x seq: this batch element's slice.
        data.mask = p.mask.empty() ? nullptr : p.mask.data() + (batched_mask ? b * N * N : 0);
        data.additive = p.additive_mask.empty() ? nullptr : p.additive_mask.data() + (batched_additive ? b * N * N : 0);
        data.mask_row = N;
        data.mask_col = 1;

        detail::row_scratch scratch(N, dvh);
        for (std::size_t i = first; i < last; ++i) {
            T* const weights = r.weights.empty() ? nullptr : r.weights.data() + ((b * H + h) * N + i) * N;
            detail::attend_row(data, rules, i, scratch, concat.data() + (b * N + i) * dv + h * dvh, weights,
                               static_cast<double*>(nullptr));
        }
    });

    // Optional output projection, then the single rounding to T.
    if (s.d_out) {
        std::vector<double> projected(rows * s.d_out);
        project<double, input>(concat, rows, dv, p.wo, p.bo, s.d_out, projected);
        concat = std::move(projected);
    }
    r.output.resize(concat.size());
    std::transform(concat.begin(), concat.end(), r.output.begin(), [](double e) { return static_cast<T>(e); });
    return r;
}

/// compute<T>(p), with a failed allocation reported with the sizes that caused it.
template <class T, class Problem>
results<T> compute_or_explain(const Problem& p) {
    try {
        return compute<T>(p);
    } catch (const std::bad_alloc&) {
        const attention_shape& s = p.shape;
        using shape_checks::gib;
        const double n = static_cast<double>(s.batch) * static_cast<double>(s.seq);
        std::string what = "cpu backend: out of host memory for batch " + std::to_string(s.batch) + ", seq " +
                           std::to_string(s.seq) + ", d_in " + std::to_string(s.d_in) + ", d_k " +
                           std::to_string(s.d_k) + ", d_v " + std::to_string(s.d_v) + ", heads " +
                           std::to_string(s.heads) + ": Q, K, V in double need " +
                           gib(n * static_cast<double>(2 * s.d_k + s.d_v) * 8.0);
        if (p.options.return_weights)
            what += ", the weights (batch x heads x seq x seq) " +
                    gib(static_cast<double>(s.batch) * static_cast<double>(s.heads) * static_cast<double>(s.seq) *
                        static_cast<double>(s.seq) * static_cast<double>(sizeof(T)));
        throw error(what);
    }
}

}  // namespace

attention_output attention(const attention_problem& problem) {
    results<float> r = compute_or_explain<float>(problem);
    attention_output out;
    out.output = std::move(r.output);
    out.weights = std::move(r.weights);
    out.shape = problem.shape;
    out.implementation = resolve_implementation(problem.options);
    out.device = "CPU reference (float64)";
    return out;
}

attention_output_f64 attention_f64(const attention_problem& problem) {
    results<double> r = compute_or_explain<double>(problem);
    return {std::move(r.output), std::move(r.weights)};
}

attention_output_f64 attention(const attention_problem_f64& problem) {
    results<double> r = compute_or_explain<double>(problem);
    return {std::move(r.output), std::move(r.weights)};
}

}  // namespace qkv::cpu
