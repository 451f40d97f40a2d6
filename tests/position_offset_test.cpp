// sdpa_options::position_offset: a block of a longer sequence (query rows [qa, qb), key rows
// [ka, kb)) computed on its own with position_offset = qa + off - ka gives exactly that block's
// part of the whole, for the causal rule, the window and ALiBi; merged by their lse, the blocks
// give the whole call (what qkv::mpi builds on).
#include <qkv/runtime/cpu.hpp>
#include <qkv/runtime/sdpa.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "support/catch.hpp"

namespace {

std::vector<float> draw(std::size_t n, std::mt19937_64& rng) {
    std::normal_distribution<double> d(0.0, 1.0);
    std::vector<float> v(n);
    for (float& e : v) e = static_cast<float>(d(rng));
    return v;
}

/// Rows [first, end) of every (outer) of an (outer, length, width) tensor.
std::vector<float> rows(const std::vector<float>& t, std::size_t outer, std::size_t length, std::size_t width,
                        std::size_t first, std::size_t end) {
    std::vector<float> out;
    for (std::size_t o = 0; o < outer; ++o)
        out.insert(out.end(), t.begin() + static_cast<std::ptrdiff_t>((o * length + first) * width),
                   t.begin() + static_cast<std::ptrdiff_t>((o * length + end) * width));
    return out;
}

}  // namespace

TEST_CASE("position_offset: blocks of a sequence merge into the whole call", "[cpu][sdpa][position_offset]") {
    std::mt19937_64 rng(20261124);
    const std::size_t hq = 4, hkv = 2, e = 8, ev = 8;
    struct setting {
        std::size_t l, s;
        qkv::sdpa_options options;
    };
    const setting settings[] = {
        {17, 17, {.causal = true}},
        {7, 29, {.causal = true, .alignment = qkv::causal_alignment::bottom_right}},
        {23, 9, {.causal = true, .alignment = qkv::causal_alignment::bottom_right}},
        {19, 31, {.causal = true, .window_left = 4, .window_right = 0}},
        {13, 13, {.window_left = 2, .window_right = 3}},
        {11, 20, {.alignment = qkv::causal_alignment::bottom_right, .alibi_max_bias = 8}},
        {15, 15, {.causal = true, .softcap = 5, .alibi_max_bias = 2, .position_offset = 4}},
        {9, 14, {.window_left = 40, .window_right = 1, .position_offset = -3}},
    };
    for (const setting& st : settings) {
        const qkv::sdpa_shape whole_shape{
            .batch = 1, .q_heads = hq, .kv_heads = hkv, .q_len = st.l, .kv_len = st.s, .d_qk = e, .d_v = ev};
        const std::vector<float> q = draw(hq * st.l * e, rng), k = draw(hkv * st.s * e, rng),
                                 v = draw(hkv * st.s * ev, rng);
        qkv::sdpa_problem whole{.shape = whole_shape, .q = q, .k = k, .v = v, .options = st.options};
        whole.options.return_lse = true;
        const qkv::sdpa_output_f64 want = qkv::cpu::sdpa_f64(whole);
        const std::int64_t off = qkv::causal_offset(whole_shape, st.options);
        // Queries in 2 blocks, keys in 3, uneven.
        const std::size_t q_cut[] = {0, st.l / 3 + 1, st.l};
        const std::size_t k_cut[] = {0, st.s / 4 + 1, st.s / 2 + 2, st.s};
        for (std::size_t qb = 0; qb < 2; ++qb) {
            const std::size_t qa = q_cut[qb], qe = q_cut[qb + 1];
            const std::vector<float> qrows = rows(q, hq, st.l, e, qa, qe);
            std::vector<qkv::sdpa_output_f64> parts;
            for (std::size_t kb = 0; kb < 3; ++kb) {
                const std::size_t ka = k_cut[kb], ke = k_cut[kb + 1];
                const std::vector<float> krows = rows(k, hkv, st.s, e, ka, ke), vrows = rows(v, hkv, st.s, ev, ka, ke);
                qkv::sdpa_problem block{
                    .shape = whole_shape, .q = qrows, .k = krows, .v = vrows, .options = st.options};
                block.shape.q_len = qe - qa;
                block.shape.kv_len = ke - ka;
                block.options.return_lse = true;
                block.options.position_offset = static_cast<std::int64_t>(qa) + off - static_cast<std::int64_t>(ka);
                parts.push_back(qkv::cpu::sdpa_f64(block));
            }
            std::vector<qkv::attention_part_f64> views;
            for (const auto& p : parts) views.push_back({.out = p.output, .lse = p.lse});
            const qkv::merged_attention_f64 got =
                qkv::merge_attention(std::span<const qkv::attention_part_f64>(views),
                                     {.batch = 1, .q_heads = hq, .q_len = qe - qa, .d_v = ev});
            std::vector<double> want_out, want_lse;
            for (std::size_t h = 0; h < hq; ++h) {
                want_out.insert(want_out.end(), want.output.begin() + static_cast<std::ptrdiff_t>((h * st.l + qa) * ev),
                                want.output.begin() + static_cast<std::ptrdiff_t>((h * st.l + qe) * ev));
                want_lse.insert(want_lse.end(), want.lse.begin() + static_cast<std::ptrdiff_t>(h * st.l + qa),
                                want.lse.begin() + static_cast<std::ptrdiff_t>(h * st.l + qe));
            }
            REQUIRE(got.out.size() == want_out.size());
            for (std::size_t i = 0; i < got.out.size(); ++i) CHECK(std::abs(got.out[i] - want_out[i]) <= 1e-12);
            for (std::size_t i = 0; i < got.lse.size(); ++i) {
                if (std::isinf(want_lse[i])) {
                    CHECK(got.lse[i] == want_lse[i]);
                } else {
                    CHECK(std::abs(got.lse[i] - want_lse[i]) <= 1e-12);
                }
            }
        }
    }
}

TEST_CASE("position_offset: visible_keys, its range and the window far from the block",
          "[cpu][sdpa][position_offset]") {
    const qkv::sdpa_shape s{.batch = 1, .q_heads = 1, .kv_heads = 1, .q_len = 10, .kv_len = 10, .d_qk = 1, .d_v = 1};
    // Queries 90 keys ahead of the block, a window of 95 back: rows 0..4 see keys from 0 on.
    const qkv::sdpa_options o{.window_left = 95, .position_offset = 90};
    CHECK(qkv::visible_keys(s, o, 0).first == 0);
    CHECK(qkv::visible_keys(s, o, 0).end == 10);
    CHECK(qkv::visible_keys(s, o, 7).first == 2);
    CHECK(qkv::visible_keys(s, {.causal = true, .position_offset = -3}, 2).end == 0);  // j <= -1: none
    CHECK(qkv::visible_keys(s, {.causal = true, .position_offset = -3}, 5).end == 3);
    // The whole range of int64 sides with a large offset: no overflow.
    const qkv::sdpa_options wide{.window_left = std::numeric_limits<std::int64_t>::max(),
                                 .window_right = std::numeric_limits<std::int64_t>::max(),
                                 .position_offset = std::int64_t{1} << 62};
    CHECK(qkv::visible_keys(s, wide, 9).first == 0);
    CHECK(qkv::visible_keys(s, wide, 9).end == 10);
    // validate: |position_offset| <= 2^62.
    const std::vector<float> one(1, 1.0f);
    qkv::sdpa_problem p{
        .shape = {.batch = 1, .q_heads = 1, .kv_heads = 1, .q_len = 1, .kv_len = 1, .d_qk = 1, .d_v = 1},
        .q = one,
        .k = one,
        .v = one};
    p.options.position_offset = (std::int64_t{1} << 62) + 1;
    CHECK_THROWS_WITH(qkv::validate(p), Catch::Matchers::Contains("position_offset"));
    p.options.position_offset = -(std::int64_t{1} << 62);
    CHECK_NOTHROW(qkv::validate(p));
}
