// qkv::cpu::sdpa — scaled dot-product attention over caller-held Q, K, V in float64: PyTorch's
// F.scaled_dot_product_attention semantics and the options beyond it (qkv/runtime/sdpa.hpp), GQA,
// NumPy-broadcast masks, both causal alignments, dropout. Every row is computed by the one float64 row of
// runtime/sdpa_rows.hpp, which qkv::cpu::attention runs on its projections too; the results are
// rounded to the caller's type once, when stored.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <new>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "qkv/runtime/capabilities.hpp"
#include "qkv/runtime/cpu.hpp"
#include "qkv/runtime/error.hpp"
#include "qkv/runtime/sdpa.hpp"
#include "runtime/parallel_for.hpp"
#include "runtime/sdpa_rows.hpp"
#include "runtime/shape_checks.hpp"
#include "runtime/stored_kv.hpp"

namespace qkv::cpu {
namespace {

using detail::parallel_for;
using detail::rows_per_item;
using detail::stored_as;

/// `T`: the type results are stored in; `In`: the problem's element type (float or double);
/// `KV`: K and V's (In, or float when they are stored as options.kv_type).
template <class T, class In, class KV>
basic_sdpa_output<T> compute_over(const basic_sdpa_problem<In>& p, std::span<const KV> k, std::span<const KV> v) {
    const sdpa_shape& s = p.shape;
    const sdpa_options& opt = p.options;
    const std::size_t B = s.batch, Hq = s.q_heads, Hkv = s.kv_heads, L = s.q_len, S = s.kv_len;
    const std::size_t E = s.d_qk, Ev = s.d_v, group = s.group();
    const mask_strides ms =
        (!p.mask.empty() || !p.additive_mask.empty()) ? broadcast_strides(p.mask_shape, s) : mask_strides{};

    const detail::head_rules rules = detail::problem_rules(s, opt, !p.sinks.empty());

    // Kᵀ per (batch element, K/V head): E x S, so a row's scores are built a column at a time.
    std::vector<KV> kt(k.size());
    for (std::size_t bh = 0; bh < B * Hkv; ++bh)
        for (std::size_t j = 0; j < S; ++j)
            for (std::size_t c = 0; c < E; ++c) kt[(bh * E + c) * S + j] = k[(bh * S + j) * E + c];

    basic_sdpa_output<T> r;
    r.output.assign(B * Hq * L * Ev, T{});
    if (opt.return_weights) r.weights.assign(B * Hq * L * S, T{});
    if (opt.return_lse) r.lse.assign(B * Hq * L, T{});
    r.shape = s;
    r.kernel = kernel_family::automatic;
    r.device = "CPU reference (float64)";

    // Work item = (batch element, query head, block of query rows): disjoint rows of the results.
    const std::size_t blocks = (L + rows_per_item - 1) / rows_per_item;
    const std::size_t items = B * Hq * blocks;
    const std::size_t work = B * Hq * L * S * (E + Ev + 1);
    parallel_for(items, work, [&](std::size_t item) {
        const std::size_t b = item / (Hq * blocks), h = (item / blocks) % Hq, block = item % blocks;
        const std::size_t kvh = h / group;  // GQA: query head h reads K/V head h / (Hq / Hkv)
        const std::size_t first = block * rows_per_item, last = std::min(L, first + rows_per_item);

        const detail::head_rules head =
            detail::head_rules_for(rules, b, h, p.sinks.empty() ? 0.0 : static_cast<double>(p.sinks[h]),
                                   detail::given_slope(p.alibi_slopes, h));
        detail::head_data<In, KV, KV, In> data;
        data.q = p.q.data() + (b * Hq + h) * L * E;
        data.q_stride = E;
        data.kt = kt.data() + (b * Hkv + kvh) * E * S;
        data.kt_stride = S;
        data.v = v.data() + (b * Hkv + kvh) * S * Ev;
        data.v_stride = Ev;
        data.mask = p.mask.empty() ? nullptr : p.mask.data();
        data.additive = p.additive_mask.empty() ? nullptr : p.additive_mask.data();
        data.mask_base = b * ms.batch + h * ms.head;
        data.mask_row = ms.row;
        data.mask_col = ms.col;

        detail::row_scratch scratch(S, Ev);
        std::vector<double> out(Ev);
        for (std::size_t i = first; i < last; ++i) {
            const std::size_t row = (b * Hq + h) * L + i;
            T* const weights = r.weights.empty() ? nullptr : r.weights.data() + row * S;
            double lse = 0;
            detail::attend_row(data, head, i, scratch, out.data(), weights, opt.return_lse ? &lse : nullptr);
            std::transform(out.begin(), out.end(), r.output.begin() + static_cast<std::ptrdiff_t>(row * Ev),
                           [](double e) { return static_cast<T>(e); });
            if (opt.return_lse) r.lse[row] = static_cast<T>(lse);
        }
    });
    return r;
}

template <class T, class In>
basic_sdpa_output<T> compute(const basic_sdpa_problem<In>& p) {
    validate(p);
    require_supported(entry_point::cpu_sdpa, p);
    if (!p.options.kv_type) return compute_over<T, In, In>(p, p.k, p.v);
    const std::vector<float> k = stored_as(*p.options.kv_type, p.k, "k");
    const std::vector<float> v = stored_as(*p.options.kv_type, p.v, "v");
    return compute_over<T, In, float>(p, k, v);
}

/// compute<T>(p), with a failed allocation reported with the sizes that caused it.
template <class T, class In>
basic_sdpa_output<T> compute_or_explain(const basic_sdpa_problem<In>& p) {
    try {
        return compute<T>(p);
    } catch (const std::bad_alloc&) {
        const sdpa_shape& s = p.shape;
        using shape_checks::gib;
        const double rows =
            static_cast<double>(s.batch) * static_cast<double>(s.q_heads) * static_cast<double>(s.q_len);
        std::string what = "cpu backend: out of host memory for sdpa with batch " + std::to_string(s.batch) +
                           ", q_heads " + std::to_string(s.q_heads) + ", q_len " + std::to_string(s.q_len) +
                           ", kv_len " + std::to_string(s.kv_len) + ", d_v " + std::to_string(s.d_v) +
                           ": the output needs " +
                           gib(rows * static_cast<double>(s.d_v) * static_cast<double>(sizeof(T)));
        if (p.options.return_weights)
            what += ", the weights (batch x q_heads x q_len x kv_len) " +
                    gib(rows * static_cast<double>(s.kv_len) * static_cast<double>(sizeof(T)));
        throw error(what);
    }
}

}  // namespace

sdpa_output sdpa(const sdpa_problem& problem) { return compute_or_explain<float>(problem); }

sdpa_output_f64 sdpa_f64(const sdpa_problem& problem) { return compute_or_explain<double>(problem); }

sdpa_output_f64 sdpa(const sdpa_problem_f64& problem) { return compute_or_explain<double>(problem); }

}  // namespace qkv::cpu
