// Random attention problems that own their data, for the run-time tests.
#pragma once

#include <qkv/runtime/problem.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace qkv_test {

enum class mask_kind { none, boolean, additive, both };

struct problem_spec {
    std::size_t batch = 1, seq = 3, d_in = 4, d_k = 3, d_v = 3, heads = 1, d_out = 0;
    bool biases = false;
    bool causal = false;
    mask_kind mask = mask_kind::none;
    bool batched_mask = false;      ///< masks of batch x seq x seq (else seq x seq, broadcast)
    bool fully_masked_row = false;  ///< mask out every key of the last query row
    bool output_bias = true;        ///< with d_out: also a bias bo
};

/// A problem with N(0,1) inputs and N(0, 1/d_in) weights (scores of order one, as in a trained
/// model), drawn from `seed`. Owns the data; view() describes it.
struct owned_problem {
    qkv::attention_shape shape;
    std::vector<float> x, wq, wk, wv, bq, bk, bv, wo, bo, additive;
    std::vector<std::uint8_t> mask;
    qkv::run_options options;

    [[nodiscard]] qkv::attention_problem view() const {
        return {shape, x, wq, wk, wv, bq, bk, bv, wo, bo, mask, additive, options};
    }
};

inline std::vector<float> normal(std::size_t n, std::mt19937_64& rng, double sigma) {
    std::normal_distribution<double> dist(0.0, sigma);
    std::vector<float> v(n);
    for (auto& e : v) e = static_cast<float>(dist(rng));
    return v;
}

inline owned_problem make_problem(const problem_spec& s, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    owned_problem p;
    p.shape = {s.batch, s.seq, s.d_in, s.d_k, s.d_v, s.heads, s.d_out};
    const double w = 1.0 / std::sqrt(static_cast<double>(s.d_in));
    p.x = normal(s.batch * s.seq * s.d_in, rng, 1.0);
    p.wq = normal(s.d_in * s.d_k, rng, w);
    p.wk = normal(s.d_in * s.d_k, rng, w);
    p.wv = normal(s.d_in * s.d_v, rng, w);
    if (s.biases) {
        p.bq = normal(s.d_k, rng, 0.5);
        p.bk = normal(s.d_k, rng, 0.5);
        p.bv = normal(s.d_v, rng, 0.5);
    }
    if (s.d_out) {
        p.wo = normal(s.d_v * s.d_out, rng, 1.0 / std::sqrt(static_cast<double>(s.d_v)));
        if (s.output_bias) p.bo = normal(s.d_out, rng, 0.5);
    }
    const std::size_t nn = s.seq * s.seq, count = s.batched_mask ? s.batch * nn : nn;
    if (s.mask == mask_kind::boolean || s.mask == mask_kind::both) {
        std::bernoulli_distribution keep(0.7);
        p.mask.resize(count);
        for (auto& m : p.mask) m = keep(rng) ? 1 : 0;
        if (s.fully_masked_row)
            for (std::size_t m = 0; m < count / nn; ++m)
                for (std::size_t j = 0; j < s.seq; ++j) p.mask[m * nn + (s.seq - 1) * s.seq + j] = 0;
    }
    if (s.mask == mask_kind::additive || s.mask == mask_kind::both) {
        p.additive = normal(count, rng, 1.0);
        std::bernoulli_distribution blocked(0.2);
        for (auto& a : p.additive)
            if (blocked(rng)) a = -std::numeric_limits<float>::infinity();
        if (s.fully_masked_row && s.mask == mask_kind::additive)
            for (std::size_t m = 0; m < count / nn; ++m)
                for (std::size_t j = 0; j < s.seq; ++j)
                    p.additive[m * nn + (s.seq - 1) * s.seq + j] = -std::numeric_limits<float>::infinity();
    }
    p.options.causal = s.causal;
    return p;
}

inline std::string describe(const problem_spec& s) {
    std::string out = "B=" + std::to_string(s.batch) + " N=" + std::to_string(s.seq) +
                      " d_in=" + std::to_string(s.d_in) + " d_k=" + std::to_string(s.d_k) +
                      " d_v=" + std::to_string(s.d_v) + " H=" + std::to_string(s.heads) +
                      " d_out=" + std::to_string(s.d_out);
    if (s.biases) out += " biases";
    if (s.causal) out += " causal";
    const char* masks[] = {"", " bool-mask", " float-mask", " bool+float-mask"};
    out += masks[static_cast<int>(s.mask)];
    if (s.batched_mask) out += "(batched)";
    if (s.fully_masked_row) out += " fully-masked-row";
    return out;
}

}  // namespace qkv_test
