// SDPA problems that own their data, for the run-time tests of sdpa (the CPU backend, both kernel
// families, decode, the cache): one builder, so every test draws its data the same way.
#pragma once

#include <qkv/runtime/sdpa.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "support/problems.hpp"

namespace qkv_test {

/// What random_sdpa draws: the shape, and which masks over which dimensions.
struct sdpa_data_spec {
    qkv::sdpa_shape shape{};
    mask_kind mask = mask_kind::none;
    std::vector<std::size_t> mask_shape{};  ///< empty: (L, S)
    bool empty_row = false;                 ///< the bool mask masks every key of row 0
};

/// The sdpa_shape of a test's own spec: any struct with sdpa_shape's seven fields.
template <class Spec>
qkv::sdpa_shape shape_of(const Spec& s) {
    return {.batch = s.batch,
            .q_heads = s.q_heads,
            .kv_heads = s.kv_heads,
            .q_len = s.q_len,
            .kv_len = s.kv_len,
            .d_qk = s.d_qk,
            .d_v = s.d_v};
}

/// A problem over data it owns, of element type T (float; double for sdpa_f64), built field by
/// field; view() is the problem over it (valid while this lives unchanged).
template <class T>
struct sdpa_data {
    qkv::sdpa_shape shape{};
    std::vector<T> q, k, v, additive, sinks, alibi_slopes;
    std::vector<std::uint8_t> mask;
    std::vector<std::size_t> mask_shape;
    qkv::sdpa_options options{};

    [[nodiscard]] qkv::basic_sdpa_problem<T> view() const {
        qkv::basic_sdpa_problem<T> p;
        p.shape = shape;
        p.q = q, p.k = k, p.v = v;
        p.mask = mask, p.additive_mask = additive;
        p.mask_shape = mask_shape;
        p.options = options;
        p.sinks = sinks;
        p.alibi_slopes = alibi_slopes;
        return p;
    }
};

/// A problem that owns its data, drawn by random_sdpa; `problem` views it (its spans stay valid
/// when this moves).
struct owned_sdpa {
    std::vector<float> q, k, v, additive, sinks, alibi_slopes;
    std::vector<std::uint8_t> mask;
    qkv::sdpa_problem problem;
};

/// N(0, 1) q, k and v; masks with about a quarter of the keys masked (the additive one with
/// -inf and N(0, 1) values), drawn from `rng`. Options are left at their defaults.
inline owned_sdpa random_sdpa(const sdpa_data_spec& s, std::mt19937_64& rng) {
    owned_sdpa o;
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const auto fill = [&](std::vector<float>& v, std::size_t n) {
        v.resize(n);
        for (float& e : v) e = normal(rng);
    };
    const qkv::sdpa_shape& sh = s.shape;
    fill(o.q, sh.batch * sh.q_heads * sh.q_len * sh.d_qk);
    fill(o.k, sh.batch * sh.kv_heads * sh.kv_len * sh.d_qk);
    fill(o.v, sh.batch * sh.kv_heads * sh.kv_len * sh.d_v);
    qkv::sdpa_problem& p = o.problem;
    p.shape = sh;
    if (s.mask != mask_kind::none) {
        const std::vector<std::size_t> dims =
            s.mask_shape.empty() ? std::vector<std::size_t>{sh.q_len, sh.kv_len} : s.mask_shape;
        std::size_t n = 1;
        for (std::size_t d : dims) n *= d;
        std::uniform_int_distribution<int> pick(0, 3);
        if (s.mask == mask_kind::boolean || s.mask == mask_kind::both) {
            o.mask.resize(n);
            for (auto& m : o.mask) m = pick(rng) != 0 ? 1 : 0;
            // Row 0 of the (L, S) mask: nothing to attend (the mask's last two dimensions are L, S).
            if (s.empty_row) std::fill(o.mask.begin(), o.mask.begin() + static_cast<std::ptrdiff_t>(sh.kv_len), 0);
        }
        if (s.mask == mask_kind::additive || s.mask == mask_kind::both) {
            o.additive.resize(n);
            for (float& a : o.additive) a = pick(rng) == 0 ? -std::numeric_limits<float>::infinity() : normal(rng);
        }
        p.mask_shape = s.mask_shape;
        p.mask = o.mask;
        p.additive_mask = o.additive;
    }
    p.q = o.q, p.k = o.k, p.v = o.v;
    return o;
}

}  // namespace qkv_test
