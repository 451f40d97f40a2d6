// A float64 reference of scaled_dot_product_attention for the tests, written as plainly as
// possible (PyTorch's documented semantics, qkv/runtime/sdpa.hpp): for every (b, h, i), the
// scores scale·q·k (+ the additive mask) of the keys that pass causal and the bool mask, a
// softmax over them, the weighted sum of V; a row with no key gets zeros. Masks are given with
// their broadcast strides (qkv::broadcast_strides).
#pragma once

#include <qkv/runtime/sdpa.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

namespace qkv_test {

struct sdpa_ref_result {
    std::vector<double> output;   ///< (B, Hq, L, Ev)
    std::vector<double> weights;  ///< (B, Hq, L, S)
};

/// `q`, `k`, `v` as the problem's spans (already rounded to float16 by the caller, if wanted).
inline sdpa_ref_result sdpa_reference(const qkv::sdpa_problem& p, std::span<const float> q, std::span<const float> k,
                                      std::span<const float> v) {
    const qkv::sdpa_shape& s = p.shape;
    const double scale = p.options.scale ? *p.options.scale : 1.0 / std::sqrt(static_cast<double>(s.d_qk));
    const bool any_mask = !p.mask.empty() || !p.additive_mask.empty();
    const qkv::mask_strides ms = any_mask ? qkv::broadcast_strides(p.mask_shape, s) : qkv::mask_strides{};
    const std::ptrdiff_t offset = qkv::causal_offset(s, p.options);
    const std::size_t group = s.q_heads / s.kv_heads;
    sdpa_ref_result r;
    r.output.assign(s.batch * s.q_heads * s.q_len * s.d_v, 0.0);
    r.weights.assign(s.batch * s.q_heads * s.q_len * s.kv_len, 0.0);
    std::vector<double> score(s.kv_len);
    std::vector<bool> allowed(s.kv_len);
    for (std::size_t b = 0; b < s.batch; ++b)
        for (std::size_t h = 0; h < s.q_heads; ++h) {
            const std::size_t g = h / group;
            for (std::size_t i = 0; i < s.q_len; ++i) {
                const float* qi = q.data() + ((b * s.q_heads + h) * s.q_len + i) * s.d_qk;
                double mx = -std::numeric_limits<double>::infinity();
                for (std::size_t j = 0; j < s.kv_len; ++j) {
                    const float* kj = k.data() + ((b * s.kv_heads + g) * s.kv_len + j) * s.d_qk;
                    double dot = 0;
                    for (std::size_t c = 0; c < s.d_qk; ++c) dot += static_cast<double>(qi[c]) * kj[c];
                    double sc = dot * scale;
                    bool ok =
                        !p.options.causal || static_cast<std::ptrdiff_t>(j) <= static_cast<std::ptrdiff_t>(i) + offset;
                    const std::size_t mi = b * ms.batch + h * ms.head + i * ms.row + j * ms.col;
                    if (!p.mask.empty()) ok = ok && p.mask[mi] != 0;
                    if (!p.additive_mask.empty()) sc += p.additive_mask[mi];
                    if (sc == -std::numeric_limits<double>::infinity()) ok = false;
                    allowed[j] = ok;
                    score[j] = sc;
                    if (ok) mx = std::max(mx, sc);
                }
                if (mx == -std::numeric_limits<double>::infinity()) continue;  // nothing to attend: zeros
                double sum = 0;
                for (std::size_t j = 0; j < s.kv_len; ++j) sum += allowed[j] ? std::exp(score[j] - mx) : 0.0;
                double* out = r.output.data() + ((b * s.q_heads + h) * s.q_len + i) * s.d_v;
                double* w = r.weights.data() + ((b * s.q_heads + h) * s.q_len + i) * s.kv_len;
                for (std::size_t j = 0; j < s.kv_len; ++j) {
                    if (!allowed[j]) continue;
                    const double pj = std::exp(score[j] - mx) / sum;
                    w[j] = pj;
                    const float* vj = v.data() + ((b * s.kv_heads + g) * s.kv_len + j) * s.d_v;
                    for (std::size_t c = 0; c < s.d_v; ++c) out[c] += pj * vj[c];
                }
            }
        }
    return r;
}

inline sdpa_ref_result sdpa_reference(const qkv::sdpa_problem& p) { return sdpa_reference(p, p.q, p.k, p.v); }

}  // namespace qkv_test
