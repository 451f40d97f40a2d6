// The float64 SDPA row: one query row's scores, softmax and weighted sum of values, with every
// rule of qkv/runtime/sdpa.hpp (causal, window, masks, softcap, ALiBi, sinks, log-sum-exp). The
// one place the CPU backend computes attention: qkv::cpu::sdpa calls it on the caller's Q, K, V;
// qkv::cpu::attention on its projections, so attention is projection + this + output projection.
// Internal to the library.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <vector>

#include "qkv/runtime/sdpa.hpp"

namespace qkv::cpu::detail {

/// What decides one (batch element, query head)'s scores and allowed keys, besides the data.
/// `shape` and `options` give the causal rule and the window (visible_keys); the rest is resolved.
struct head_rules {
    sdpa_shape shape{};      ///< kv_len, d_qk, d_v and q_len (for the alignment's offset)
    sdpa_options options{};  ///< causal, alignment, window_left, window_right
    double scale = 1;        ///< exact: the caller's float widened, or 1/sqrt(E) in double
    double softcap = 0;      ///< 0: off
    double slope = 0;        ///< this head's ALiBi slope; 0: off
    bool has_sink = false;   ///< a sink logit joins the denominator
    double sink = 0;         ///< finite or -inf
};

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
    row_scratch(std::size_t kv_len, std::size_t d_v) : score(kv_len), allowed(kv_len), acc(d_v) {}
    std::vector<double> score;           ///< the row's scores; then e^(score - max)
    std::vector<unsigned char> allowed;  ///< not vector<bool>: plain bytes
    std::vector<double> acc;
};

/// Computes query row i of one head: writes d_v values to `out`; kv_len weights to `weights`
/// (when not null, rounded to W); the row's log-sum-exp to `lse` (when not null).
template <class Q, class K, class V, class A, class W>
void attend_row(const head_data<Q, K, V, A>& d, const head_rules& r, std::size_t i, row_scratch& s, double* out,
                W* weights, double* lse) {
    constexpr double neg_inf = -std::numeric_limits<double>::infinity();
    constexpr double pos_inf = std::numeric_limits<double>::infinity();
    constexpr double nan = std::numeric_limits<double>::quiet_NaN();
    const std::size_t S = r.shape.kv_len, E = r.shape.d_qk, Ev = r.shape.d_v;
    const key_range keys = visible_keys(r.shape, r.options, i);  // causal and window
    const std::size_t first = keys.first, end = keys.end;
    const std::int64_t pos = static_cast<std::int64_t>(i) + causal_offset(r.shape, r.options);
    // ALiBi relative to the row's nearest key: s - slope·(|pos - j| - near), exact integers below
    // kv_len, so the bias of a row far from every key (|off| up to 2^62) keeps its precision; the
    // row's constant slope·near cancels in the weights and is taken off the lse (and added to the
    // sink, which it must meet) at the end.
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
    double* const acc = s.acc.data();

    const V* const v = d.v;
    const std::size_t v_stride = d.v_stride;

    // Dot products of the visible keys.
    const Q* const qi = d.q + i * d.q_stride;
    std::fill(score + first, score + end, 0.0);
    for (std::size_t c = 0; c < E; ++c) {
        const double qc = static_cast<double>(qi[c]);
        const K* const kc = d.kt + c * d.kt_stride;
        for (std::size_t j = first; j < end; ++j) score[j] += qc * static_cast<double>(kc[j]);
    }

    // Scores, in the header's order, and which keys the row may attend.
    bool any = false, has_nan = false;
    double max = neg_inf;
    std::fill(allowed, allowed + S, static_cast<unsigned char>(0));
    for (std::size_t j = first; j < end; ++j) {
        const std::size_t m = mask_row + j * mask_col;
        if (mask && mask[m] == 0) continue;
        double sc = score[j] * scale;
        if (softcap > 0) sc = softcap * std::tanh(sc / softcap);
        if (slope != 0) sc -= slope * static_cast<double>(std::llabs(pos - static_cast<std::int64_t>(j)) - near);
        if (additive) sc += static_cast<double>(additive[m]);
        score[j] = sc;
        if (sc == neg_inf) continue;
        allowed[j] = 1;
        if (std::isnan(sc) || sc == pos_inf) has_nan = true;  // as PyTorch: +inf - +inf is NaN
        if (!any || sc > max) max = sc;
        any = true;
    }

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
    const double drop = slope != 0 ? slope * static_cast<double>(near) : 0.0;
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
    // out = Σ_j w_j · v_j over the allowed j only (a masked v_j may hold NaN or inf).
    std::fill(acc, acc + Ev, 0.0);
    for (std::size_t j = first; j < end; ++j) {
        if (!allowed[j]) continue;
        const double w = score[j] / denominator;
        if (weights) weights[j] = static_cast<W>(w);
        const V* const vj = v + j * v_stride;
        for (std::size_t c = 0; c < Ev; ++c) acc[c] += w * static_cast<double>(vj[c]);
    }
    std::copy(acc, acc + Ev, out);
}

}  // namespace qkv::cpu::detail
