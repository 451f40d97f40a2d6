// The float64 SDPA row: one query row's scores, softmax and weighted sum of values, with every
// rule of qkv/runtime/sdpa.hpp (causal, window, masks, softcap, ALiBi, sinks, log-sum-exp, dropout).
// The one place the CPU backend computes attention: qkv::cpu::sdpa calls it on the caller's Q, K, V;
// qkv::cpu::attention on its projections, so attention is projection + this + output projection.
// Its first half, score_row, is also the backward pass's (cpu_sdpa_backward.cpp), so both passes
// see the same scores and the same allowed keys. Internal to the library.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <optional>
#include <span>
#include <vector>

#include "qkv/dropout.hpp"
#include "qkv/runtime/sdpa.hpp"

namespace qkv::cpu::detail {

/// What decides one (batch element, query head)'s scores and allowed keys, besides the data.
/// `shape` and `options` give the causal rule and the window (visible_keys); the rest is resolved.
struct head_rules {
    sdpa_shape shape{};              ///< kv_len, d_qk, d_v and q_len (for the alignment's offset)
    sdpa_options options{};          ///< causal, alignment, window_left, window_right
    double scale = 1;                ///< exact: the caller's float widened, or 1/sqrt(E) in double
    double softcap = 0;              ///< 0: off
    double slope = 0;                ///< this head's ALiBi slope; 0: off
    bool has_sink = false;           ///< a sink logit joins the denominator
    double sink = 0;                 ///< finite or -inf
    bool drops = false;              ///< attention dropout (qkv/dropout.hpp) on
    dropout_stream dropout{};        ///< its seed, offset and threshold
    double keep_scale = 1;           ///< 1 / (1 - p): what a kept weight is multiplied by
    std::uint64_t dropout_row0 = 0;  ///< the dropout row of query 0: (b·Hq + h)·L
};

/// The rules every (batch element, query head) of an sdpa problem shares: its shape and options,
/// the exact scale, the softcap, whether sinks are given, dropout. head_rules_for adds a head's own.
inline head_rules problem_rules(const sdpa_shape& shape, const sdpa_options& options, bool has_sinks) {
    head_rules r;
    r.shape = shape;
    r.options = options;
    // The exact default scale (default_scale() returns it rounded to float).
    r.scale = options.scale ? static_cast<double>(*options.scale) : 1.0 / std::sqrt(static_cast<double>(shape.d_qk));
    r.softcap = static_cast<double>(options.softcap);
    r.has_sink = has_sinks;
    if (options.dropout_p != 0) {
        const double p = static_cast<double>(options.dropout_p);
        r.drops = true;
        r.dropout = {options.dropout_seed, options.dropout_offset, dropout_threshold(p)};
        r.keep_scale = 1.0 / (1.0 - p);
    }
    return r;
}

/// The rules of batch element b, query head h: the problem's, with the head's ALiBi slope, sink
/// (`sink`: the head's logit, when the problem has sinks) and first dropout row.
/// Head h's ALiBi slope where the problem gives them (alibi_slopes), else none (alibi_max_bias's).
template <class T>
std::optional<double> given_slope(std::span<const T> slopes, std::size_t h) {
    if (slopes.empty()) return std::nullopt;
    return static_cast<double>(slopes[h]);
}

inline head_rules head_rules_for(const head_rules& problem, std::size_t b, std::size_t h, double sink,
                                 std::optional<double> slope) {
    head_rules r = problem;
    const sdpa_shape& s = problem.shape;
    r.slope = slope ? *slope : alibi_slope(problem.options.alibi_max_bias, s.q_heads, h);
    if (r.has_sink) r.sink = sink;
    r.dropout_row0 = dropout_row(b, h, 0, s.q_heads, s.q_len);
    return r;
}

/// The data of one (batch element, query head). Q is read a row at a time, K as its transpose
/// (column c of the head's keys at kt + c * kt_stride, contiguous over the keys, so that a row's
/// scores are built a column at a time and the loop vectorises while each dot product still sums
/// c = 0, 1, ... in order), V a key's row at a time. Masks: element (i, j) at
/// mask_base + i * mask_row + j * mask_col (broadcast strides).
template <class Q, class K, class V, class A>
struct head_data {
    const Q* q = nullptr;
    std::size_t q_stride = 0;
    const K* kt = nullptr;
    std::size_t kt_stride = 0;
    const V* v = nullptr;
    std::size_t v_stride = 0;
    const std::uint8_t* mask = nullptr;  ///< null: none
    const A* additive = nullptr;         ///< null: none
    std::size_t mask_base = 0, mask_row = 0, mask_col = 0;
};

/// Per-thread buffers of attend_row, sized for kv_len keys and d_v value columns.
struct row_scratch {
    row_scratch(std::size_t kv_len, std::size_t d_v) : score(kv_len), allowed(kv_len), keep(kv_len), acc(d_v) {}
    std::vector<double> score;           ///< the row's scores; then e^(score - max)
    std::vector<unsigned char> allowed;  ///< not vector<bool>: plain bytes
    std::vector<unsigned char> keep;     ///< dropout's z: 1 kept, 0 dropped
    std::vector<double> acc;
};

/// What score_row found in a row: the keys it computed, [first, end) (causal and window, within
/// the keys asked for), and over the allowed ones among them: whether there is any, whether a NaN
/// or +inf poisons the row, and the largest score.
struct row_scores {
    std::size_t first = 0, end = 0;
    bool any = false;
    bool has_nan = false;
    double max = -std::numeric_limits<double>::infinity();
    /// ALiBi's slope·near: the scores are relative to the row's nearest key, raised by this much
    /// over their true values (0 without ALiBi).
    double drop = 0;
};

/// The scores of query row i over keys [lo, hi), in the order of qkv/runtime/sdpa.hpp: s.score[j]
/// and s.allowed[j] for j in the returned [first, end) (the visible keys among [lo, hi); s.allowed
/// is cleared over [lo, hi)). `softcap_slope`, when not null, receives 1 - tanh²(r_j / C) for the
/// allowed keys (the softcap's derivative, for the backward pass). With ALiBi the scores are
/// relative to the row's nearest key (row_scores::drop above their true values).
template <class Q, class K, class V, class A>
row_scores score_row(const head_data<Q, K, V, A>& d, const head_rules& r, std::size_t i, row_scratch& s, std::size_t lo,
                     std::size_t hi, double* softcap_slope = nullptr) {
    constexpr double neg_inf = -std::numeric_limits<double>::infinity();
    constexpr double pos_inf = std::numeric_limits<double>::infinity();
    const std::size_t S = r.shape.kv_len, E = r.shape.d_qk;
    const key_range keys = visible_keys(r.shape, r.options, i);  // causal and window
    row_scores rs;
    rs.first = std::max(keys.first, lo);
    rs.end = std::max(rs.first, std::min(keys.end, hi));
    const std::size_t first = rs.first, end = rs.end;
    const std::int64_t pos = static_cast<std::int64_t>(i) + causal_offset(r.shape, r.options);
    // ALiBi relative to the row's nearest key: s - slope·(|pos - j| - near), exact integers below
    // kv_len, so the bias of a row far from every key (|off| up to 2^62) keeps its precision; the
    // row's constant slope·near cancels in the weights and is taken off the lse (and added to the
    // sink, which it must meet) by the caller.
    const auto last_key = static_cast<std::int64_t>(S) - 1;
    const std::int64_t near = pos < 0 ? -pos : (pos > last_key ? pos - last_key : 0);
    // Locals, so that the compiler need not reload them after every store (a byte store may alias
    // anything).
    const double scale = r.scale, softcap = r.softcap, slope = r.slope;
    const std::uint8_t* const mask = d.mask;
    const A* const additive = d.additive;
    const std::size_t mask_row = d.mask_base + i * d.mask_row, mask_col = d.mask_col;
    double* const score = s.score.data();
    unsigned char* const allowed = s.allowed.data();

    // Dot products of the visible keys.
    const Q* const qi = d.q + i * d.q_stride;
    std::fill(score + first, score + end, 0.0);
    for (std::size_t c = 0; c < E; ++c) {
        const double qc = static_cast<double>(qi[c]);
        const K* const kc = d.kt + c * d.kt_stride;
        for (std::size_t j = first; j < end; ++j) score[j] += qc * static_cast<double>(kc[j]);
    }

    // Scores, in the header's order, and which keys the row may attend.
    std::fill(allowed + lo, allowed + std::max(lo, hi), static_cast<unsigned char>(0));
    for (std::size_t j = first; j < end; ++j) {
        const std::size_t m = mask_row + j * mask_col;
        if (mask && mask[m] == 0) continue;
        double sc = score[j] * scale;
        if (softcap > 0) {
            const double t = std::tanh(sc / softcap);
            sc = softcap * t;
            if (softcap_slope) softcap_slope[j] = 1.0 - t * t;
        }
        if (slope != 0) sc -= slope * static_cast<double>(std::llabs(pos - static_cast<std::int64_t>(j)) - near);
        if (additive) sc += static_cast<double>(additive[m]);
        score[j] = sc;
        if (sc == neg_inf) continue;
        allowed[j] = 1;
        if (std::isnan(sc) || sc == pos_inf) rs.has_nan = true;  // as PyTorch: +inf - +inf is NaN
        if (!rs.any || sc > rs.max) rs.max = sc;
        rs.any = true;
    }
    rs.drop = slope != 0 ? slope * static_cast<double>(near) : 0.0;
    return rs;
}

/// Dropout's z for the keys [first, end) of query row i into s.keep (1 kept), one Philox
/// evaluation per four keys.
inline void keep_row(const head_rules& r, std::size_t i, std::size_t first, std::size_t end, row_scratch& s) {
    unsigned char* const keep = s.keep.data();
    r.dropout.for_each_key(r.dropout_row0 + i, first, end,
                           [keep](std::uint64_t j, bool kept) { keep[j] = kept ? 1 : 0; });
}

/// Computes query row i of one head: writes d_v values to `out`; kv_len weights to `weights`
/// (when not null, rounded to W; with dropout, a dropped weight negated); the row's log-sum-exp to
/// `lse` (when not null).
template <class Q, class K, class V, class A, class W>
void attend_row(const head_data<Q, K, V, A>& d, const head_rules& r, std::size_t i, row_scratch& s, double* out,
                W* weights, double* lse) {
    constexpr double neg_inf = -std::numeric_limits<double>::infinity();
    constexpr double nan = std::numeric_limits<double>::quiet_NaN();
    const std::size_t S = r.shape.kv_len, Ev = r.shape.d_v;
    const row_scores rs = score_row(d, r, i, s, 0, S);
    const std::size_t first = rs.first, end = rs.end;
    const bool any = rs.any, has_nan = rs.has_nan;
    const double max = rs.max;
    double* const score = s.score.data();
    const unsigned char* const allowed = s.allowed.data();
    double* const acc = s.acc.data();
    const V* const v = d.v;
    const std::size_t v_stride = d.v_stride;

    if (weights) std::fill(weights, weights + S, W{});
    if (!any) {  // nothing to attend to: zero weights, zero output, lse -inf (sinks or not)
        std::fill(out, out + Ev, 0.0);
        if (lse) *lse = neg_inf;
        return;
    }
    if (has_nan) {  // as PyTorch: a NaN or +inf among the allowed scores poisons the row
        if (weights) std::fill(weights, weights + S, static_cast<W>(nan));
        std::fill(out, out + Ev, nan);
        if (lse) *lse = nan;
        return;
    }

    // Stable softmax: subtracting the largest of the row's scores and its sink keeps every
    // exponent <= 0. Without a sink (or with a sink below the row's max) this is the row's max.
    // The scores are ALiBi's relative ones: the sink meets them raised by the row's drop.
    const double drop = rs.drop;
    const double sink = r.sink + drop;
    const double top = r.has_sink && sink > max ? sink : max;
    if (lse) {
        if (top == max) {
            *lse = max;  // + log(sum), below
        } else {         // the keys' own sum, shifted by their own max
            double own = 0.0;
            for (std::size_t j = first; j < end; ++j)
                if (allowed[j]) own += std::exp(score[j] - max);
            *lse = max + std::log(own);  // own >= 1: the max's own term is e^0
        }
    }
    double sum = 0.0;
    for (std::size_t j = first; j < end; ++j) {
        score[j] = allowed[j] ? std::exp(score[j] - top) : 0.0;
        sum += score[j];
    }
    if (lse && top == max) *lse += std::log(sum);  // sum >= 1, as above
    if (lse) *lse -= drop;
    const double denominator = r.has_sink ? sum + std::exp(sink - top) : sum;
    // out = Σ_j w_j · v_j over the allowed j only (a masked v_j may hold NaN or inf); with dropout,
    // over the kept ones, w_j / (1 - p).
    if (r.drops) keep_row(r, i, first, end, s);
    const unsigned char* const keep = s.keep.data();
    std::fill(acc, acc + Ev, 0.0);
    for (std::size_t j = first; j < end; ++j) {
        if (!allowed[j]) continue;
        double w = score[j] / denominator;
        if (r.drops && !keep[j]) {
            if (weights) weights[j] = static_cast<W>(-w);
            continue;
        }
        if (weights) weights[j] = static_cast<W>(w);
        if (r.drops) w *= r.keep_scale;
        const V* const vj = v + j * v_stride;
        for (std::size_t c = 0; c < Ev; ++c) acc[c] += w * static_cast<double>(vj[c]);
    }
    std::copy(acc, acc + Ev, out);
}

}  // namespace qkv::cpu::detail
