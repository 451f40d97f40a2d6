// A deliberately plain float64 attention, written independently of qkv's code, for tests only:
// one batch element, dynamic shapes, straight loops. It is the yardstick the constexpr core and
// the CPU backend are both measured against.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <span>
#include <vector>

namespace qkv_test {

struct ref_problem {
    std::size_t n = 0, d_in = 0, d_k = 0, d_v = 0, heads = 1, d_out = 0;  // d_out 0: no output projection
    std::vector<double> x, wq, wk, wv, bq, bk, bv, wo, bo;                // empty bias: none
    std::vector<std::uint8_t> allowed;                                    // n*n, 1 = may attend; empty: all allowed
    std::vector<double> additive;                                         // n*n added to the scaled scores; empty: none
    bool causal = false;
    std::optional<double> scale;  // default 1/sqrt(d_k / heads)
};

struct ref_result {
    std::vector<double> output;   // n x (d_out ? d_out : d_v)
    std::vector<double> weights;  // heads x n x n
};

inline std::vector<double> ref_project(const std::vector<double>& x, std::size_t n, std::size_t d_in,
                                       const std::vector<double>& w, std::size_t d, const std::vector<double>& b) {
    std::vector<double> out(n * d);
    for (std::size_t i = 0; i < n; ++i)
        for (std::size_t c = 0; c < d; ++c) {
            double acc = b.empty() ? 0.0 : b[c];
            for (std::size_t k = 0; k < d_in; ++k) acc += x[i * d_in + k] * w[k * d + c];
            out[i * d + c] = acc;
        }
    return out;
}

inline ref_result reference_attention(const ref_problem& p) {
    const std::size_t n = p.n, H = p.heads, dh = p.d_k / H, dvh = p.d_v / H;
    const auto q = ref_project(p.x, n, p.d_in, p.wq, p.d_k, p.bq);
    const auto k = ref_project(p.x, n, p.d_in, p.wk, p.d_k, p.bk);
    const auto v = ref_project(p.x, n, p.d_in, p.wv, p.d_v, p.bv);
    const double scale = p.scale ? *p.scale : 1.0 / std::sqrt(static_cast<double>(dh));
    ref_result r;
    r.weights.assign(H * n * n, 0.0);
    std::vector<double> concat(n * p.d_v, 0.0);
    for (std::size_t h = 0; h < H; ++h)
        for (std::size_t i = 0; i < n; ++i) {
            std::vector<double> s(n, -std::numeric_limits<double>::infinity());
            std::vector<bool> ok(n, false);
            for (std::size_t j = 0; j < n; ++j) {
                ok[j] = (p.allowed.empty() || p.allowed[i * n + j]) && (!p.causal || j <= i);
                double dot = 0;
                for (std::size_t c = 0; c < dh; ++c) dot += q[i * p.d_k + h * dh + c] * k[j * p.d_k + h * dh + c];
                s[j] = dot * scale + (p.additive.empty() ? 0.0 : p.additive[i * n + j]);
                if (std::isinf(s[j]) && s[j] < 0) ok[j] = false;  // -inf in an additive mask masks
            }
            double mx = -std::numeric_limits<double>::infinity();
            bool any = false;
            for (std::size_t j = 0; j < n; ++j)
                if (ok[j]) {
                    mx = any ? std::max(mx, s[j]) : s[j];
                    any = true;
                }
            if (!any) continue;  // fully masked row: zero weights, zero output
            double sum = 0;
            for (std::size_t j = 0; j < n; ++j) sum += ok[j] ? std::exp(s[j] - mx) : 0.0;
            for (std::size_t j = 0; j < n; ++j) {
                const double w = ok[j] ? std::exp(s[j] - mx) / sum : 0.0;
                r.weights[(h * n + i) * n + j] = w;
                for (std::size_t c = 0; c < dvh; ++c) concat[i * p.d_v + h * dvh + c] += w * v[j * p.d_v + h * dvh + c];
            }
        }
    r.output = p.d_out ? ref_project(concat, n, p.d_v, p.wo, p.d_out, p.bo) : concat;
    return r;
}

/// Normalised mean squared error sum((got-want)^2) / sum(want^2); +inf if got has NaN/Inf
/// where want is finite, or the sizes differ.
template <class T>
double nmse(std::span<const T> got, std::span<const double> want) {
    if (got.size() != want.size()) return std::numeric_limits<double>::infinity();
    double num = 0, den = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
        const double g = static_cast<double>(got[i]);
        if (!std::isfinite(g)) return std::numeric_limits<double>::infinity();
        num += (g - want[i]) * (g - want[i]);
        den += want[i] * want[i];
    }
    return den > 0 ? num / den : num;
}

template <class T>
double nmse(const std::vector<T>& got, const std::vector<double>& want) {
    return nmse(std::span<const T>(got), std::span<const double>(want));
}

/// N(0, sigma) values from a fixed seed.
inline std::vector<double> normal_values(std::size_t count, std::mt19937_64& rng, double sigma = 1.0) {
    std::normal_distribution<double> dist(0.0, sigma);
    std::vector<double> v(count);
    for (auto& e : v) e = dist(rng);
    return v;
}

}  // namespace qkv_test
