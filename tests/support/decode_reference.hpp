// A plain float64 scaled_dot_product_attention over (B, Hq, L, E) q and (B, Hkv, S, E/Ev) k/v,
// following PyTorch's documented semantics (GQA head h reads K/V head h / (Hq / Hkv); masks
// broadcast NumPy-style to (B, Hq, L, S); causal keeps j <= i + offset), except that a row with
// nothing to attend gives zeros. For tests only; written independently of the library's kernels.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace qkv_test {

struct decode_ref_problem {
    std::size_t batch = 1, q_heads = 1, kv_heads = 1, q_len = 0, kv_len = 0, d_qk = 0, d_v = 0;
    std::vector<double> q, k, v;
    std::vector<std::uint8_t> mask;  // broadcast by mask_dims (4 dims, 1 = broadcast); empty: none
    std::vector<double> additive;    // the same shape as mask_dims; empty: none
    std::size_t mask_dims[4] = {1, 1, 1, 1};
    bool causal = false;
    std::ptrdiff_t causal_offset = 0;
    double scale = 0;  // 0: 1/sqrt(d_qk)
};

inline std::vector<double> decode_reference(const decode_ref_problem& p) {
    const std::size_t B = p.batch, H = p.q_heads, L = p.q_len, S = p.kv_len, E = p.d_qk, Ev = p.d_v;
    const std::size_t G = H / p.kv_heads;
    const double scale = p.scale > 0 ? p.scale : 1.0 / std::sqrt(static_cast<double>(E));
    const std::size_t* md = p.mask_dims;
    auto mask_index = [&](std::size_t b, std::size_t h, std::size_t i, std::size_t j) {
        const std::size_t ib = md[0] == 1 ? 0 : b, ih = md[1] == 1 ? 0 : h, ii = md[2] == 1 ? 0 : i,
                          ij = md[3] == 1 ? 0 : j;
        return ((ib * md[1] + ih) * md[2] + ii) * md[3] + ij;
    };
    std::vector<double> out(B * H * L * Ev, 0.0), s(S);
    for (std::size_t b = 0; b < B; ++b)
        for (std::size_t h = 0; h < H; ++h) {
            const std::size_t kvh = h / G;
            const double* k = p.k.data() + (b * p.kv_heads + kvh) * S * E;
            const double* v = p.v.data() + (b * p.kv_heads + kvh) * S * Ev;
            for (std::size_t i = 0; i < L; ++i) {
                const double* q = p.q.data() + ((b * H + h) * L + i) * E;
                double mx = -std::numeric_limits<double>::infinity();
                for (std::size_t j = 0; j < S; ++j) {
                    bool ok =
                        !p.causal || static_cast<std::ptrdiff_t>(j) <= static_cast<std::ptrdiff_t>(i) + p.causal_offset;
                    if (!p.mask.empty()) ok = ok && p.mask[mask_index(b, h, i, j)] != 0;
                    double a = 0;
                    for (std::size_t e = 0; e < E; ++e) a += q[e] * k[j * E + e];
                    a *= scale;
                    if (!p.additive.empty()) a += p.additive[mask_index(b, h, i, j)];
                    s[j] = ok ? a : -std::numeric_limits<double>::infinity();
                    mx = std::max(mx, s[j]);
                }
                double* o = out.data() + ((b * H + h) * L + i) * Ev;
                if (mx == -std::numeric_limits<double>::infinity()) continue;  // nothing to attend: zeros
                double sum = 0;
                for (std::size_t j = 0; j < S; ++j) sum += s[j] = std::exp(s[j] - mx);
                for (std::size_t j = 0; j < S; ++j)
                    for (std::size_t c = 0; c < Ev; ++c) o[c] += s[j] / sum * v[j * Ev + c];
            }
        }
    return out;
}

}  // namespace qkv_test
