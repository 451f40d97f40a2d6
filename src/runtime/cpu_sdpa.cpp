// qkv::cpu::sdpa — scaled dot-product attention over caller-held Q, K, V in float64: PyTorch's
// F.scaled_dot_product_attention semantics (qkv/runtime/sdpa.hpp), GQA, NumPy-broadcast masks,
// both causal alignments. Straight loops, every sum in double and in a fixed order, the results
// rounded to the caller's type once, when stored. The arithmetic of one head follows
// qkv::cpu::attention's step for step, so attention equals projection followed by sdpa.
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

#include "qkv/runtime/cpu.hpp"
#include "qkv/runtime/error.hpp"
#include "qkv/runtime/sdpa.hpp"
#include "runtime/parallel_for.hpp"

namespace qkv::cpu {
namespace {

using detail::parallel_for;
using detail::rows_per_item;

/// `T`: the type results are stored in; `In`: the problem's element type (float or double).
template <class T, class In>
basic_sdpa_output<T> compute(const basic_sdpa_problem<In>& p) {
    validate(p);

    const sdpa_shape& s = p.shape;
    const sdpa_options& opt = p.options;
    const std::size_t B = s.batch, Hq = s.q_heads, Hkv = s.kv_heads, L = s.q_len, S = s.kv_len;
    const std::size_t E = s.d_qk, Ev = s.d_v, group = s.group();
    // The exact default scale (default_scale() returns it rounded to float).
    const double scale = opt.scale ? static_cast<double>(*opt.scale) : 1.0 / std::sqrt(static_cast<double>(E));
    const std::ptrdiff_t offset = causal_offset(s, opt.alignment);
    const std::uint8_t* const mask = p.mask.empty() ? nullptr : p.mask.data();
    const In* const additive = p.additive_mask.empty() ? nullptr : p.additive_mask.data();
    const mask_strides ms = (mask || additive) ? broadcast_strides(p.mask_shape, s) : mask_strides{};
    constexpr double neg_inf = -std::numeric_limits<double>::infinity();
    constexpr double pos_inf = std::numeric_limits<double>::infinity();
    constexpr double nan = std::numeric_limits<double>::quiet_NaN();

    basic_sdpa_output<T> r;
    r.output.assign(B * Hq * L * Ev, T{});  // zero: a fully masked row stays zero
    if (opt.return_weights) r.weights.assign(B * Hq * L * S, T{});
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
        const In* const qh = p.q.data() + (b * Hq + h) * L * E;
        const In* const kh = p.k.data() + (b * Hkv + kvh) * S * E;
        const In* const vh = p.v.data() + (b * Hkv + kvh) * S * Ev;
        const std::size_t mask_base = b * ms.batch + h * ms.head;

        std::vector<double> score(S);           // this row's scores; then exp(score - max)
        std::vector<unsigned char> allowed(S);  // not vector<bool>: plain bytes
        std::vector<double> acc(Ev);
        for (std::size_t i = first; i < last; ++i) {
            // Keys j < visible pass the causal rule (all of them without it).
            std::size_t visible = S;
            if (opt.causal) {
                const std::ptrdiff_t end = static_cast<std::ptrdiff_t>(i) + offset + 1;
                visible = end <= 0 ? 0 : std::min(S, static_cast<std::size_t>(end));
            }
            const In* const qi = qh + i * E;
            bool any = false, has_nan = false;
            double max = neg_inf;
            for (std::size_t j = 0; j < S; ++j) {
                const std::size_t m = mask_base + i * ms.row + j * ms.col;
                bool ok = j < visible && (!mask || mask[m] != 0);
                double sc = 0.0;
                if (ok) {
                    const In* const kj = kh + j * E;
                    for (std::size_t c = 0; c < E; ++c) sc += static_cast<double>(qi[c]) * static_cast<double>(kj[c]);
                    sc = sc * scale + (additive ? static_cast<double>(additive[m]) : 0.0);
                    ok = sc != neg_inf;
                }
                score[j] = sc;
                allowed[j] = ok;
                if (!ok) continue;
                if (std::isnan(sc) || sc == pos_inf) has_nan = true;  // as PyTorch: +inf - +inf is NaN
                if (!any || sc > max) max = sc;
                any = true;
            }

            T* const wrow = r.weights.empty() ? nullptr : r.weights.data() + ((b * Hq + h) * L + i) * S;
            T* const out = r.output.data() + ((b * Hq + h) * L + i) * Ev;
            if (!any) continue;  // nothing to attend to: zero weights, zero output (already zero)
            if (has_nan) {       // as PyTorch: a NaN or +inf among the allowed scores poisons the row
                if (wrow) std::fill(wrow, wrow + S, static_cast<T>(nan));
                std::fill(out, out + Ev, static_cast<T>(nan));
                continue;
            }

            // Stable softmax: subtracting the row's max keeps every exponent <= 0.
            double sum = 0.0;
            for (std::size_t j = 0; j < S; ++j) {
                score[j] = allowed[j] ? std::exp(score[j] - max) : 0.0;
                sum += score[j];
            }
            // out = Σ_j w_j · v_j over the allowed j only (a masked v_j may hold NaN or inf).
            std::fill(acc.begin(), acc.end(), 0.0);
            for (std::size_t j = 0; j < S; ++j) {
                if (!allowed[j]) continue;
                const double w = score[j] / sum;
                if (wrow) wrow[j] = static_cast<T>(w);
                const In* const vj = vh + j * Ev;
                for (std::size_t c = 0; c < Ev; ++c) acc[c] += w * static_cast<double>(vj[c]);
            }
            std::transform(acc.begin(), acc.end(), out, [](double e) { return static_cast<T>(e); });
        }
    });
    return r;
}

/// compute<T>(p), with a failed allocation reported with the sizes that caused it.
template <class T, class In>
basic_sdpa_output<T> compute_or_explain(const basic_sdpa_problem<In>& p) {
    try {
        return compute<T>(p);
    } catch (const std::bad_alloc&) {
        const sdpa_shape& s = p.shape;
        const auto gib = [](double bytes) {
            char text[40];
            std::snprintf(text, sizeof text, "%.1f GiB", bytes / 1073741824.0);
            return std::string(text);
        };
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
