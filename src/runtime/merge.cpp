// qkv::merge_attention: partial attention results over disjoint key sets, merged by their
// log-sum-exp into the whole (the rule is written in qkv/runtime/sdpa.hpp). float64 throughout.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "qkv/runtime/error.hpp"
#include "qkv/runtime/sdpa.hpp"
#include "runtime/shape_checks.hpp"

namespace qkv {
namespace {

using namespace shape_checks;

std::string number(double value) {
    char text[32];
    std::snprintf(text, sizeof text, "%.9g", value);
    return text;
}

template <class T>
basic_merged_attention<T> merge(std::span<const basic_attention_part<T>> parts, const merge_shape& s,
                                std::span<const T> sinks) {
    constexpr double neg_inf = -std::numeric_limits<double>::infinity();
    constexpr double pos_inf = std::numeric_limits<double>::infinity();
    constexpr double nan = std::numeric_limits<double>::quiet_NaN();

    if (parts.empty()) fail("merge_attention: no parts to merge");
    expect_positive("batch", s.batch);
    expect_positive("q_heads", s.q_heads);
    expect_positive("q_len", s.q_len);
    expect_positive("d_v", s.d_v);
    const std::size_t rows = checked_product({{"batch", s.batch}, {"q_heads", s.q_heads}, {"q_len", s.q_len}});
    (void)checked_product({{"batch", s.batch}, {"q_heads", s.q_heads}, {"q_len", s.q_len}, {"d_v", s.d_v}});
    for (std::size_t p = 0; p < parts.size(); ++p) {
        const std::string name = "part " + std::to_string(p);
        expect_size(name + " out", parts[p].out,
                    {{"batch", s.batch}, {"q_heads", s.q_heads}, {"q_len", s.q_len}, {"d_v", s.d_v}});
        expect_size(name + " lse", parts[p].lse, {{"batch", s.batch}, {"q_heads", s.q_heads}, {"q_len", s.q_len}});
        for (std::size_t r = 0; r < rows; ++r)
            if (static_cast<double>(parts[p].lse[r]) == pos_inf)
                fail("merge_attention: " + name + " lse element " + std::to_string(r) +
                     " is +inf (a log-sum-exp beyond the range of its type): the merge cannot be exact");
    }
    if (!sinks.empty()) {
        if (sinks.size() != s.q_heads)
            fail("sinks has " + std::to_string(sinks.size()) +
                 " elements, expected one per query head, q_heads = " + std::to_string(s.q_heads) + " (or none)");
        for (std::size_t h = 0; h < sinks.size(); ++h) {
            const auto sink = static_cast<double>(sinks[h]);
            if (std::isnan(sink) || sink == pos_inf)
                fail("sinks[" + std::to_string(h) + "] is " + number(sink) +
                     ": a sink must be finite, or -inf for no sink on that head");
        }
    }

    basic_merged_attention<T> m;
    m.out.assign(rows * s.d_v, T{});
    m.lse.assign(rows, T{});
    std::vector<double> acc(s.d_v);
    for (std::size_t r = 0; r < rows; ++r) {
        // The largest lse of the parts that saw a key of this row; NaN poisons the row.
        double top = neg_inf;
        bool poisoned = false;
        for (const basic_attention_part<T>& part : parts) {
            const auto lse = static_cast<double>(part.lse[r]);
            if (std::isnan(lse)) poisoned = true;
            if (lse > top) top = lse;
        }
        T* const out = m.out.data() + r * s.d_v;
        if (poisoned) {
            std::fill(out, out + s.d_v, static_cast<T>(nan));
            m.lse[r] = static_cast<T>(nan);
            continue;
        }
        if (top == neg_inf) {  // no part saw a key: zeros, lse -inf (sinks or not)
            m.lse[r] = static_cast<T>(neg_inf);
            continue;
        }
        // lse over every key: top + log Σ_p e^(lse_p - top).
        double own = 0.0;
        for (const basic_attention_part<T>& part : parts) {
            const auto lse = static_cast<double>(part.lse[r]);
            if (lse != neg_inf) own += std::exp(lse - top);
        }
        m.lse[r] = static_cast<T>(top + std::log(own));

        // The output, with the sink of this row's head applied once: shift by max(top, σ).
        const double sink = sinks.empty() ? neg_inf : static_cast<double>(sinks[(r / s.q_len) % s.q_heads]);
        const double shift = sink > top ? sink : top;
        double denominator = sink == neg_inf ? 0.0 : std::exp(sink - shift);
        std::fill(acc.begin(), acc.end(), 0.0);
        for (const basic_attention_part<T>& part : parts) {
            const auto lse = static_cast<double>(part.lse[r]);
            if (lse == neg_inf) continue;  // no key of this row in the part: its out is not used
            const double w = std::exp(lse - shift);
            denominator += w;
            const T* const o = part.out.data() + r * s.d_v;
            for (std::size_t c = 0; c < s.d_v; ++c) acc[c] += w * static_cast<double>(o[c]);
        }
        for (std::size_t c = 0; c < s.d_v; ++c) out[c] = static_cast<T>(acc[c] / denominator);
    }
    return m;
}

}  // namespace

merged_attention merge_attention(std::span<const attention_part> parts, const merge_shape& shape,
                                 std::span<const float> sinks) {
    return merge<float>(parts, shape, sinks);
}

merged_attention_f64 merge_attention(std::span<const attention_part_f64> parts, const merge_shape& shape,
                                     std::span<const double> sinks) {
    return merge<double>(parts, shape, sinks);
}

}  // namespace qkv
