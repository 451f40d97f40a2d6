// The numbers of `qkv example`, computed at run time: the tutorial's inputs and weights (typed
// from its text), keys/queries/values/scores by plain loops on the host, the attention weights and
// outputs by the chosen backend, and the tutorial's "weighted values" from those weights.
#pragma once

#include <string>
#include <vector>

#include "backend.hpp"
#include "grid.hpp"

namespace qkv::cli {

struct example_values {
    float scale = 1;  ///< multiplies Q·Kᵀ: 1, or the library's default 1/sqrt(3) with --scaled

    // Given: the tutorial's numbers.
    grid inputs, w_key, w_query, w_value;
    // Computed on the host.
    grid keys, queries, values, scores;
    // Computed by the backend.
    grid weights, output;
    // Computed on the host from the backend's weights: one N x d_v grid per query, row j is
    // weights(query, j) · values row j.
    std::vector<grid> weighted_values;

    std::string ran_on;  ///< the device (or the CPU backend) that computed weights and output
};

/// Computes everything; `scaled` uses the library's default scale instead of 1.
example_values compute_example(backend choice, bool scaled);

}  // namespace qkv::cli
