#include "kernels/range_rule.hpp"

#include <cstdio>

namespace qkv::vulkan::detail {

std::string format_number(double v) {
    char text[32];
    std::snprintf(text, sizeof text, "%.3g", v);
    return text;
}

std::string score_verdict(const score_bounds& b, float scale, double additive_max, const std::string& where) {
    if (!(b.scaled_rows <= score_limit))
        return "numeric overflow in the attention scores: max(1, |scale|) x the largest " +
               std::string(b.q >= b.k ? "Q" : "K") + " row norm of " + where + " is " + format_number(b.scaled_rows) +
               ", beyond 2^127 = " + format_number(score_limit) +
               ", the most the Vulkan backend computes a score to in float32";
    if (b.scores <= score_limit && b.scores + additive_max <= sum_limit) return {};
    std::string message = "numeric overflow in the attention scores: |Q·Kᵀ·scale| of " + where + " can reach " +
                          format_number(b.scores) + " (largest row norms |q| " + format_number(b.q) + " and |k| " +
                          format_number(b.k) + ", scale " + format_number(scale) + ")";
    if (b.scores <= score_limit)
        return message + ", plus the additive mask's largest finite entry " + format_number(additive_max) +
               ", which leaves float32's range (" + format_number(float_max) + ")";
    return message + ", beyond 2^127 = " + format_number(score_limit) +
           ", the most the Vulkan backend computes a score to in float32";
}

std::string value_verdict(std::uint64_t keys, double v, double values, const std::string& where) {
    if (values <= score_limit) return {};
    return "numeric overflow in the value sums: seq x max|V| of " + where + " is " + std::to_string(keys) + " x " +
           format_number(v) + " = " + format_number(values) + ", beyond 2^127 = " + format_number(score_limit) +
           ", the most the Vulkan backend accumulates to in float32";
}

}  // namespace qkv::vulkan::detail
