// qkv::cpu::sdpa_backward — the gradients of scaled dot-product attention in float64
// (qkv/runtime/sdpa_backward.hpp), FlashAttention-2's algorithm over the forward's own rows: the
// scores and allowed keys of a row come from score_row (runtime/sdpa_rows.hpp), the forward's first
// half, so both passes see the same logits, masks and dropout mask.
//
// Three passes, each over disjoint outputs, so the threads need no atomics and the order of every
// sum is fixed whatever their number:
//   rows   (batch element, query head, block of rows): each row's lse' (from the saved lse, or
//          recomputed), D (from the saved output, or Σ_j P·dP), dq, its sink term, and the checks
//          that the saved tensors are the forward's;
//   keys   (batch element, K/V head, block of keys): dk and dv, over the group's query heads and
//          their rows in order, each (i, j) recomputed from the row's lse' and D;
//   mask   (one row of the additive mask at a time, when asked): dS summed over the (b, h, i) the
//          row serves, in order.
// Then the sinks' sums, the finiteness rule and the rounding, once.
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
#include "qkv/runtime/sdpa_backward.hpp"
#include "runtime/parallel_for.hpp"
#include "runtime/sdpa_rows.hpp"
#include "runtime/stored_kv.hpp"

namespace qkv::cpu {
namespace {

using detail::head_data;
using detail::head_rules;
using detail::parallel_for;
using detail::row_scores;
using detail::row_scratch;
using detail::rows_per_item;
using detail::stored_as;

constexpr double neg_inf = -std::numeric_limits<double>::infinity();
constexpr double nan = std::numeric_limits<double>::quiet_NaN();

/// Keys per work item of the key pass (a multiple of the four keys of a Philox counter).
constexpr std::size_t keys_per_item = 64;

/// How far saved tensors may be from the forward's own before they are refused: 1 % (a float32 or
/// float16 forward is far closer; a tensor of another call or row is far off).
constexpr double saved_tolerance = 0.01;

std::string number(double value) {
    char text[32];
    std::snprintf(text, sizeof text, "%.9g", value);
    return text;
}

/// Per-thread buffers: the forward row's (scores, allowed keys, dropout's z), and P, Z·dP and the
/// softcap's derivative of each key.
struct backward_scratch {
    backward_scratch(std::size_t kv_len, std::size_t d_v) : row(kv_len, d_v), p(kv_len), dp(kv_len), slope(kv_len) {}
    row_scratch row;
    std::vector<double> p;      ///< P_j = e^(s_j - lse')
    std::vector<double> dp;     ///< Z_j · d_out_i · v_j
    std::vector<double> slope;  ///< 1 - tanh²(r_j / C), with a softcap
};

/// What the row pass leaves for the others, per row (b, h, i): lse' (-inf: no key; NaN: a
/// poisoned row) and D.
struct row_state {
    std::vector<double> total;
    std::vector<double> d;
};

/// One backward computation: the problem, its K and V (as stored), the saved tensors.
template <class In, class KV>
struct backward_inputs {
    const basic_sdpa_backward_problem<In>& bp;
    std::span<const KV> k, v;
    std::vector<KV> kt;  ///< Kᵀ per (batch element, K/V head): E x S, the layout score_row reads
    head_rules rules;
    mask_strides ms;

    backward_inputs(const basic_sdpa_backward_problem<In>& problem, std::span<const KV> k_, std::span<const KV> v_)
        : bp(problem), k(k_), v(v_) {
        const basic_sdpa_problem<In>& p = bp.forward;
        const sdpa_shape& s = p.shape;
        rules = detail::problem_rules(s, p.options, !p.sinks.empty());
        ms = (!p.mask.empty() || !p.additive_mask.empty()) ? broadcast_strides(p.mask_shape, s) : mask_strides{};
        const std::size_t S = s.kv_len, E = s.d_qk;
        kt.resize(k.size());
        for (std::size_t bh = 0; bh < s.batch * s.kv_heads; ++bh)
            for (std::size_t j = 0; j < S; ++j)
                for (std::size_t c = 0; c < E; ++c) kt[(bh * E + c) * S + j] = k[(bh * S + j) * E + c];
    }

    [[nodiscard]] const sdpa_shape& shape() const { return bp.forward.shape; }

    /// The rules of (b, h).
    [[nodiscard]] head_rules head(std::size_t b, std::size_t h) const {
        const auto& sinks = bp.forward.sinks;
        return detail::head_rules_for(rules, b, h, sinks.empty() ? 0.0 : static_cast<double>(sinks[h]),
                                      detail::given_slope(bp.forward.alibi_slopes, h));
    }

    /// The data of (b, h), as the forward reads it.
    [[nodiscard]] head_data<In, KV, KV, In> data(std::size_t b, std::size_t h) const {
        const sdpa_shape& s = shape();
        const std::size_t kvh = h / s.group();
        head_data<In, KV, KV, In> d;
        d.q = bp.forward.q.data() + (b * s.q_heads + h) * s.q_len * s.d_qk;
        d.q_stride = s.d_qk;
        d.kt = kt.data() + (b * s.kv_heads + kvh) * s.d_qk * s.kv_len;
        d.kt_stride = s.kv_len;
        d.v = v.data() + (b * s.kv_heads + kvh) * s.kv_len * s.d_v;
        d.v_stride = s.d_v;
        d.mask = bp.forward.mask.empty() ? nullptr : bp.forward.mask.data();
        d.additive = bp.forward.additive_mask.empty() ? nullptr : bp.forward.additive_mask.data();
        d.mask_base = b * ms.batch + h * ms.head;
        d.mask_row = ms.row;
        d.mask_col = ms.col;
        return d;
    }

    /// Row i of (b, h) from score_row on: P_j, Z_j·dP_j (and Σ_j P_j·Z_j·Σ_c |d_out_c·v_jc| in
    /// `spread` when asked) over the allowed keys of [rs.first, rs.end), with lse' = total.
    void probabilities(const head_data<In, KV, KV, In>& d, const head_rules& r, std::size_t i, std::size_t row,
                       const row_scores& rs, double total, backward_scratch& s, double* spread = nullptr) const {
        const std::size_t Ev = shape().d_v;
        const In* const d_out = bp.d_out.data() + row * Ev;
        const unsigned char* const allowed = s.row.allowed.data();
        if (r.drops) detail::keep_row(r, i, rs.first, rs.end, s.row);
        const unsigned char* const keep = s.row.keep.data();
        double sum = 0;
        for (std::size_t j = rs.first; j < rs.end; ++j) {
            if (!allowed[j]) continue;
            s.p[j] = std::exp(s.row.score[j] - total);
            const double z = !r.drops ? 1.0 : keep[j] ? r.keep_scale : 0.0;
            double dot = 0, magnitude = 0;
            if (z != 0) {
                const KV* const vj = d.v + j * d.v_stride;
                for (std::size_t c = 0; c < Ev; ++c) {
                    const double term = static_cast<double>(d_out[c]) * static_cast<double>(vj[c]);
                    dot += term;
                    magnitude += std::abs(term);
                }
            }
            s.dp[j] = z * dot;
            sum += s.p[j] * z * magnitude;
        }
        if (spread) *spread = sum;
    }
};

[[noreturn]] void refuse_saved(const char* what, std::size_t row, const std::string& why) {
    throw invalid_argument(std::string(what) + " of row " + std::to_string(row) + " (b·q_heads·q_len + h·q_len + i) " +
                           why +
                           ": out and lse must be this problem's forward results, to within 1 % (empty, they "
                           "are recomputed here in float64)");
}

/// The row pass of rows [first, last) of (b, h): lse' and D into `state`, dq (scaled) into `dq`,
/// the sink's term -P_σ·D into `sink_terms`.
template <class In, class KV>
void row_pass(const backward_inputs<In, KV>& in, std::size_t b, std::size_t h, std::size_t first, std::size_t last,
              row_state& state, std::vector<double>& dq, std::vector<double>& sink_terms) {
    const sdpa_shape& s = in.shape();
    const std::size_t S = s.kv_len, E = s.d_qk, Ev = s.d_v, L = s.q_len;
    const head_rules r = in.head(b, h);
    const head_data<In, KV, KV, In> d = in.data(b, h);
    const basic_sdpa_backward_problem<In>& bp = in.bp;
    backward_scratch sc(S, Ev);
    const bool softcap = r.softcap > 0;
    for (std::size_t i = first; i < last; ++i) {
        const std::size_t row = (b * s.q_heads + h) * L + i;
        double* const dq_row = dq.data() + row * E;
        const row_scores rs = detail::score_row(d, r, i, sc.row, 0, S, softcap ? sc.slope.data() : nullptr);
        const double saved_lse = bp.lse.empty() ? 0.0 : static_cast<double>(bp.lse[row]);
        if (!rs.any) {  // no key: no gradient (the forward is zero whatever q)
            if (!bp.lse.empty() && saved_lse != neg_inf)
                refuse_saved("lse", row, "is " + number(saved_lse) + ", but the row attends to no key (-inf)");
            state.total[row] = neg_inf;
            state.d[row] = 0;
            sink_terms[row] = 0;
            std::fill(dq_row, dq_row + E, 0.0);
            continue;
        }
        if (rs.has_nan || std::isnan(saved_lse)) {  // a poisoned row: NaN, as its forward
            state.total[row] = nan;
            state.d[row] = nan;
            sink_terms[row] = r.has_sink ? nan : 0.0;
            std::fill(dq_row, dq_row + E, nan);
            continue;
        }
        const double* const score = sc.row.score.data();
        const unsigned char* const allowed = sc.row.allowed.data();
        // The scores are ALiBi's relative ones (rs.drop above the true ones): so are lse' and the
        // sink here, and state.total, which the key and mask passes meet with the same scores.
        double lse = saved_lse + rs.drop;
        if (bp.lse.empty()) {
            double sum = 0;
            for (std::size_t j = rs.first; j < rs.end; ++j)
                if (allowed[j]) sum += std::exp(score[j] - rs.max);
            lse = rs.max + std::log(sum);
        } else if (lse == neg_inf) {
            refuse_saved("lse", row, "is -inf (no key), but the row attends to keys");
        }
        // lse' = log(e^lse + e^σ), P_σ = e^(σ - lse').
        double total = lse, p_sink = 0;
        if (r.has_sink && r.sink != neg_inf) {
            const double sink = r.sink + rs.drop;
            const double m = std::max(lse, sink);
            total = m + std::log(std::exp(lse - m) + std::exp(sink - m));
            p_sink = std::exp(sink - total);
        }
        double spread = 0;
        in.probabilities(d, r, i, row, rs, total, sc, &spread);
        double d_p = 0, mass = p_sink;  // Σ_j P_j·dP_j and Σ_j P_j (+ P_σ)
        for (std::size_t j = rs.first; j < rs.end; ++j)
            if (allowed[j]) {
                d_p += sc.p[j] * sc.dp[j];
                mass += sc.p[j];
            }
        if (!bp.lse.empty() && std::isfinite(mass) && !(std::abs(mass - 1.0) <= saved_tolerance))
            refuse_saved("lse", row,
                         "gives probabilities that sum to " + number(mass) + " with the sink's, not 1 (within 1 %)");
        double D = d_p;
        if (!bp.out.empty()) {
            const In* const out = bp.out.data() + row * Ev;
            const In* const d_out = bp.d_out.data() + row * Ev;
            D = 0;
            for (std::size_t c = 0; c < Ev; ++c) D += static_cast<double>(d_out[c]) * static_cast<double>(out[c]);
            if (std::isfinite(D) && std::isfinite(d_p) && !(std::abs(D - d_p) <= saved_tolerance * spread))
                refuse_saved("out", row,
                             "gives rowsum(d_out * out) = " + number(D) + ", but the probabilities recomputed " +
                                 "from the problem give " + number(d_p));
        }
        state.total[row] = total;
        state.d[row] = D;
        sink_terms[row] = r.has_sink ? -p_sink * D : 0.0;
        // dS_j = P_j·(dP_j - D), dR_j = dS_j·(1 - tanh²), dq = c·Σ_j dR_j·k_j (j ascending).
        double* const d_raw = sc.p.data();  // P_j is not needed past this
        for (std::size_t j = rs.first; j < rs.end; ++j)
            if (allowed[j]) {
                d_raw[j] = sc.p[j] * (sc.dp[j] - D);
                if (softcap) d_raw[j] *= sc.slope[j];
            }
        for (std::size_t c = 0; c < E; ++c) {
            const KV* const kc = d.kt + c * d.kt_stride;
            double acc = 0;
            for (std::size_t j = rs.first; j < rs.end; ++j)
                if (allowed[j]) acc += d_raw[j] * static_cast<double>(kc[j]);
            dq_row[c] = r.scale * acc;
        }
    }
}

/// The key pass of keys [j0, j1) of K/V head kvh of batch element b: dk (scaled) and dv, over the
/// group's query heads h and their rows i, in order.
template <class In, class KV>
void key_pass(const backward_inputs<In, KV>& in, std::size_t b, std::size_t kvh, std::size_t j0, std::size_t j1,
              const row_state& state, std::vector<double>& dk, std::vector<double>& dv) {
    const sdpa_shape& s = in.shape();
    const std::size_t S = s.kv_len, E = s.d_qk, Ev = s.d_v, L = s.q_len, group = s.group();
    const basic_sdpa_backward_problem<In>& bp = in.bp;
    backward_scratch sc(S, Ev);
    std::vector<double> acc_k((j1 - j0) * E, 0.0), acc_v((j1 - j0) * Ev, 0.0);
    double scale = 0;
    for (std::size_t h = kvh * group; h < (kvh + 1) * group; ++h) {
        const head_rules r = in.head(b, h);
        const head_data<In, KV, KV, In> d = in.data(b, h);
        scale = r.scale;
        const bool softcap = r.softcap > 0;
        for (std::size_t i = 0; i < L; ++i) {
            const std::size_t row = (b * s.q_heads + h) * L + i;
            const double total = state.total[row], D = state.d[row];
            if (total == neg_inf) continue;  // no key
            const row_scores rs = detail::score_row(d, r, i, sc.row, j0, j1, softcap ? sc.slope.data() : nullptr);
            if (rs.first >= rs.end) continue;
            in.probabilities(d, r, i, row, rs, total, sc);
            const In* const qi = d.q + i * d.q_stride;
            const In* const d_out = bp.d_out.data() + row * Ev;
            const unsigned char* const allowed = sc.row.allowed.data();
            const unsigned char* const keep = sc.row.keep.data();
            for (std::size_t j = rs.first; j < rs.end; ++j) {
                if (!allowed[j]) continue;
                double d_raw = sc.p[j] * (sc.dp[j] - D);
                if (softcap) d_raw *= sc.slope[j];
                double* const ak = acc_k.data() + (j - j0) * E;
                for (std::size_t c = 0; c < E; ++c) ak[c] += d_raw * static_cast<double>(qi[c]);
                const double weight = !r.drops ? sc.p[j] : keep[j] ? sc.p[j] * r.keep_scale : 0.0;
                if (weight == 0) continue;  // a dropped key
                double* const av = acc_v.data() + (j - j0) * Ev;
                for (std::size_t c = 0; c < Ev; ++c) av[c] += weight * static_cast<double>(d_out[c]);
            }
        }
    }
    for (std::size_t j = j0; j < j1; ++j) {
        double* const out_k = dk.data() + ((b * s.kv_heads + kvh) * S + j) * E;
        double* const out_v = dv.data() + ((b * s.kv_heads + kvh) * S + j) * Ev;
        for (std::size_t c = 0; c < E; ++c) out_k[c] = scale * acc_k[(j - j0) * E + c];
        for (std::size_t c = 0; c < Ev; ++c) out_v[c] = acc_v[(j - j0) * Ev + c];
    }
}

/// The additive mask's gradient of one of its rows, (mb, mh, mi) in its broadcast (B, Hq, L)
/// view: Σ dS over the (b, h, i) it serves, in order, into `grad` at the mask's own indices.
template <class In, class KV>
void mask_pass(const backward_inputs<In, KV>& in, std::size_t mb, std::size_t mh, std::size_t mi,
               const row_state& state, std::vector<double>& grad) {
    const sdpa_shape& s = in.shape();
    const std::size_t S = s.kv_len, L = s.q_len;
    const mask_strides& ms = in.ms;
    const std::size_t base = mb * ms.batch + mh * ms.head + mi * ms.row;
    backward_scratch sc(S, s.d_v);
    const auto range = [](std::size_t stride, std::size_t at, std::size_t n) {
        return stride != 0 ? std::pair{at, at + 1} : std::pair{std::size_t{0}, n};
    };
    const auto [b0, b1] = range(ms.batch, mb, s.batch);
    const auto [h0, h1] = range(ms.head, mh, s.q_heads);
    const auto [i0, i1] = range(ms.row, mi, L);
    for (std::size_t b = b0; b < b1; ++b)
        for (std::size_t h = h0; h < h1; ++h) {
            const head_rules r = in.head(b, h);
            const head_data<In, KV, KV, In> d = in.data(b, h);
            for (std::size_t i = i0; i < i1; ++i) {
                const std::size_t row = (b * s.q_heads + h) * L + i;
                const double total = state.total[row], D = state.d[row];
                if (total == neg_inf) continue;
                const row_scores rs = detail::score_row(d, r, i, sc.row, 0, S);
                in.probabilities(d, r, i, row, rs, total, sc);
                const unsigned char* const allowed = sc.row.allowed.data();
                for (std::size_t j = rs.first; j < rs.end; ++j)
                    if (allowed[j]) grad[base + j * ms.col] += sc.p[j] * (sc.dp[j] - D);
            }
        }
}

/// Whether every value is finite (-inf allowed where `minus_infinity_ok`).
template <class V>
bool all_finite(std::span<const V> values, bool minus_infinity_ok) {
    return std::all_of(values.begin(), values.end(), [&](V x) {
        const auto d = static_cast<double>(x);
        return std::isfinite(d) || (minus_infinity_ok && d == neg_inf);
    });
}

/// `values` rounded to T; a value that is not finite (in float64 or once rounded) where every
/// input is finite is refused.
template <class T>
std::vector<T> finish(const std::vector<double>& values, bool inputs_finite, const char* what) {
    std::vector<T> out(values.size());
    for (std::size_t n = 0; n < values.size(); ++n) {
        out[n] = static_cast<T>(values[n]);
        if (inputs_finite && !std::isfinite(static_cast<double>(out[n])))
            throw invalid_argument(std::string("sdpa_backward: ") + what + " element " + std::to_string(n) + " is " +
                                   number(values[n]) +
                                   (std::isfinite(values[n]) ? ", beyond the range of the result type" : "") +
                                   ", although every input is finite: the inputs are too large for these gradients" +
                                   (std::isfinite(values[n]) ? " (sdpa_backward_f64 returns them in float64)" : ""));
    }
    return out;
}

template <class T, class In, class KV>
basic_sdpa_gradients<T> backward_over(const basic_sdpa_backward_problem<In>& bp, std::span<const KV> k,
                                      std::span<const KV> v) {
    const basic_sdpa_problem<In>& p = bp.forward;
    const sdpa_shape& s = p.shape;
    const std::size_t B = s.batch, Hq = s.q_heads, Hkv = s.kv_heads, L = s.q_len, S = s.kv_len;
    const std::size_t E = s.d_qk, Ev = s.d_v;
    const backward_inputs<In, KV> in(bp, k, v);
    const std::size_t work = B * Hq * L * S * (E + Ev + 1);

    row_state state{std::vector<double>(B * Hq * L), std::vector<double>(B * Hq * L)};
    std::vector<double> dq(B * Hq * L * E), sink_terms(B * Hq * L);
    const std::size_t row_blocks = (L + rows_per_item - 1) / rows_per_item;
    parallel_for(B * Hq * row_blocks, work, [&](std::size_t item) {
        const std::size_t b = item / (Hq * row_blocks), h = (item / row_blocks) % Hq, block = item % row_blocks;
        const std::size_t first = block * rows_per_item;
        row_pass(in, b, h, first, std::min(L, first + rows_per_item), state, dq, sink_terms);
    });

    std::vector<double> dk(B * Hkv * S * E), dv(B * Hkv * S * Ev);
    const std::size_t key_blocks = (S + keys_per_item - 1) / keys_per_item;
    parallel_for(B * Hkv * key_blocks, work, [&](std::size_t item) {
        const std::size_t b = item / (Hkv * key_blocks), kvh = (item / key_blocks) % Hkv, block = item % key_blocks;
        const std::size_t j0 = block * keys_per_item;
        key_pass(in, b, kvh, j0, std::min(S, j0 + keys_per_item), state, dk, dv);
    });

    std::vector<double> d_mask;
    if (bp.return_d_additive_mask) {
        d_mask.assign(p.additive_mask.size(), 0.0);
        const mask_strides& ms = in.ms;
        const std::size_t nb = ms.batch ? B : 1, nh = ms.head ? Hq : 1, ni = ms.row ? L : 1;
        parallel_for(nb * nh * ni, work, [&](std::size_t item) {
            mask_pass(in, item / (nh * ni), (item / ni) % nh, item % ni, state, d_mask);
        });
    }

    std::vector<double> d_sinks;
    if (!p.sinks.empty()) {
        d_sinks.assign(Hq, 0.0);
        for (std::size_t b = 0; b < B; ++b)
            for (std::size_t h = 0; h < Hq; ++h)
                for (std::size_t i = 0; i < L; ++i) d_sinks[h] += sink_terms[(b * Hq + h) * L + i];
    }

    const bool inputs_finite = all_finite(p.q, false) && all_finite(k, false) && all_finite(v, false) &&
                               all_finite(p.additive_mask, true) && all_finite(bp.out, false) &&
                               all_finite(bp.lse, true) && all_finite(bp.d_out, false);
    basic_sdpa_gradients<T> g;
    g.dq = finish<T>(dq, inputs_finite, "dq");
    g.dk = finish<T>(dk, inputs_finite, "dk");
    g.dv = finish<T>(dv, inputs_finite, "dv");
    g.d_sinks = finish<T>(d_sinks, inputs_finite, "d_sinks");
    g.d_additive_mask = finish<T>(d_mask, inputs_finite, "d_additive_mask");
    g.shape = s;
    g.device = "CPU reference (float64)";
    return g;
}

template <class T, class In>
basic_sdpa_gradients<T> compute(const basic_sdpa_backward_problem<In>& bp) {
    validate(bp);
    require_supported(entry_point::cpu_sdpa_backward, bp);
    const basic_sdpa_problem<In>& p = bp.forward;
    if (!p.options.kv_type) return backward_over<T, In, In>(bp, p.k, p.v);
    const std::vector<float> k = stored_as(*p.options.kv_type, p.k, "k");
    const std::vector<float> v = stored_as(*p.options.kv_type, p.v, "v");
    return backward_over<T, In, float>(bp, k, v);
}

/// compute<T>(p), with a failed allocation reported with the sizes that caused it.
template <class T, class In>
basic_sdpa_gradients<T> compute_or_explain(const basic_sdpa_backward_problem<In>& bp) {
    try {
        return compute<T>(bp);
    } catch (const std::bad_alloc&) {
        const sdpa_shape& s = bp.forward.shape;
        throw error("cpu backend: out of host memory for sdpa_backward with batch " + std::to_string(s.batch) +
                    ", q_heads " + std::to_string(s.q_heads) + ", kv_heads " + std::to_string(s.kv_heads) + ", q_len " +
                    std::to_string(s.q_len) + ", kv_len " + std::to_string(s.kv_len) + ", d_qk " +
                    std::to_string(s.d_qk) + ", d_v " + std::to_string(s.d_v) +
                    ": it holds the gradients and two float64 values per query row");
    }
}

}  // namespace

sdpa_gradients sdpa_backward(const sdpa_backward_problem& problem) { return compute_or_explain<float>(problem); }

sdpa_gradients_f64 sdpa_backward_f64(const sdpa_backward_problem& problem) {
    return compute_or_explain<double>(problem);
}

sdpa_gradients_f64 sdpa_backward(const sdpa_backward_problem_f64& problem) {
    return compute_or_explain<double>(problem);
}

}  // namespace qkv::cpu
