// The run-time side of `qkv example` (see example_values.hpp).
#include "example_values.hpp"

#include <cstddef>
#include <optional>
#include <utility>

#include "qkv/runtime/problem.hpp"

namespace qkv::cli {
namespace {

// The tutorial's worked example, as printed in its step 1 and step 2.
constexpr std::size_t n = 3, d_in = 4, d_k = 3, d_v = 3;
const std::vector<float> tutorial_inputs{1, 0, 1, 0,  //
                                         0, 2, 0, 2,  //
                                         1, 1, 1, 1};
const std::vector<float> tutorial_w_key{0, 0, 1,  //
                                        1, 1, 0,  //
                                        0, 1, 0,  //
                                        1, 1, 0};
const std::vector<float> tutorial_w_query{1, 0, 1,  //
                                          1, 0, 0,  //
                                          0, 0, 1,  //
                                          0, 1, 1};
const std::vector<float> tutorial_w_value{0, 2, 0,  //
                                          0, 3, 0,  //
                                          1, 0, 3,  //
                                          1, 1, 0};

/// a · b in float, summing in index order.
grid matmul(const grid& a, const grid& b) {
    grid out(a.rows, b.cols);
    for (std::size_t i = 0; i < a.rows; ++i)
        for (std::size_t j = 0; j < b.cols; ++j) {
            float acc = 0;
            for (std::size_t k = 0; k < a.cols; ++k) acc += static_cast<float>(a(i, k)) * static_cast<float>(b(k, j));
            out(i, j) = static_cast<double>(acc);
        }
    return out;
}

/// (q · kᵀ) · scale in float.
grid scaled_scores(const grid& q, const grid& k, float scale) {
    grid out(q.rows, k.rows);
    for (std::size_t i = 0; i < q.rows; ++i)
        for (std::size_t j = 0; j < k.rows; ++j) {
            float acc = 0;
            for (std::size_t c = 0; c < q.cols; ++c) acc += static_cast<float>(q(i, c)) * static_cast<float>(k(j, c));
            out(i, j) = static_cast<double>(acc * scale);
        }
    return out;
}

/// Row j: weights(query, j) · values row j.
grid weighted(const grid& weights, const grid& values, std::size_t query) {
    grid out(values.rows, values.cols);
    for (std::size_t j = 0; j < values.rows; ++j)
        for (std::size_t c = 0; c < values.cols; ++c)
            out(j, c) = static_cast<double>(static_cast<float>(weights(query, j)) * static_cast<float>(values(j, c)));
    return out;
}

}  // namespace

example_values compute_example(backend choice, bool scaled) {
    qkv::attention_problem problem{.shape = {.batch = 1, .seq = n, .d_in = d_in, .d_k = d_k, .d_v = d_v, .heads = 1},
                                   .x = tutorial_inputs,
                                   .wq = tutorial_w_query,
                                   .wk = tutorial_w_key,
                                   .wv = tutorial_w_value};
    problem.options.scale = scaled ? std::nullopt : std::optional<float>(1.f);
    problem.options.return_weights = true;
    problem.options.implementation = qkv::implementation::staged;

    example_values v;
    v.scale = scaled ? qkv::default_scale(problem.shape) : 1.f;
    v.inputs = to_grid(tutorial_inputs, n, d_in);
    v.w_key = to_grid(tutorial_w_key, d_in, d_k);
    v.w_query = to_grid(tutorial_w_query, d_in, d_k);
    v.w_value = to_grid(tutorial_w_value, d_in, d_v);

    v.keys = matmul(v.inputs, v.w_key);
    v.queries = matmul(v.inputs, v.w_query);
    v.values = matmul(v.inputs, v.w_value);
    v.scores = scaled_scores(v.queries, v.keys, v.scale);

    backend_result run = run_attention(problem, choice);
    v.weights = to_grid(run.result.weights, n, n);
    v.output = to_grid(run.result.output, n, d_v);
    v.ran_on = std::move(run.ran_on);

    for (std::size_t q = 0; q < n; ++q) v.weighted_values.push_back(weighted(v.weights, v.values, q));
    return v;
}

}  // namespace qkv::cli
