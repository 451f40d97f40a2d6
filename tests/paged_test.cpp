// Paged K/V batches on the float64 CPU reference (qkv/runtime/paged.hpp): the result against a
// reference written over the paged layout (support/paged_problems.hpp): page sizes 1, 16 and 256,
// pages in shuffled order, pages shared between sequences, sequences of 0 and 1 keys, odd lengths
// and one or ragged query counts, every score rule; and the refusals, typed and naming what is wrong.
#include <qkv/runtime/capabilities.hpp>
#include <qkv/runtime/cpu.hpp>
#include <qkv/runtime/element_type.hpp>
#include <qkv/runtime/paged.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "support/backend_checks.hpp"
#include "support/catch.hpp"
#include "support/expect.hpp"
#include "support/paged_problems.hpp"
#include "support/reference.hpp"

namespace {

using qkv_test::expect_invalid;

void check_against_reference(const qkv_test::owned_paged& o) {
    qkv_test::check_cpu_backend(o.problem, qkv_test::paged_reference(o.problem));
}

}  // namespace

TEST_CASE("paged: the CPU reference equals the paged reference, page sizes 1, 16, 256, every rule", "[paged]") {
    struct rules {
        const char* name;
        qkv::sdpa_options options;
        bool sinks = false, slopes = false;
    };
    const float neg_inf = -std::numeric_limits<float>::infinity();
    const rules cases[] = {
        {"plain", {}},
        {"causal top-left", {.causal = true}},
        {"causal bottom-right, lse",
         {.causal = true, .alignment = qkv::causal_alignment::bottom_right, .return_lse = true}},
        {"window, softcap, ALiBi, sinks, lse",
         {.causal = true,
          .alignment = qkv::causal_alignment::bottom_right,
          .window_left = 6,
          .window_right = 0,
          .softcap = 4.0f,
          .alibi_max_bias = 8.0f,
          .return_lse = true},
         true},
        {"ALiBi slopes, two-sided window, scale, lse",
         {.scale = 0.3f, .window_left = 2, .window_right = 3, .return_lse = true},
         false,
         true},
    };
    // Keys 0, 1, 17, 113, 3 and 40; a second form with ragged queries (a sequence without queries,
    // one with more queries than keys, one with queries and no keys).
    const std::vector<std::size_t> kv_lens{0, 1, 17, 113, 3, 40};
    const std::vector<std::size_t> ragged_q{1, 0, 3, 17, 5, 1};
    for (const std::size_t page_size : {1u, 16u, 256u})
        for (const bool ragged : {false, true})
            for (const rules& c : cases) {
                INFO(c.name << ", page_size " << page_size << (ragged ? ", ragged queries" : ", q_len 3"));
                qkv_test::paged_shape s{.kv_lens = kv_lens,
                                        .q_len = 3,
                                        .q_heads = 6,
                                        .kv_heads = 2,
                                        .d_qk = 16,
                                        .d_v = 24,
                                        .page_size = page_size,
                                        .seed = page_size + (ragged ? 7u : 0u)};
                if (ragged) s.q_lens = ragged_q;
                qkv_test::owned_paged o = qkv_test::random_paged(s);
                o.problem.options = c.options;
                if (c.sinks) {
                    o.sinks = {0.5f, -1.0f, 2.0f, neg_inf, 0.0f, 1.5f};
                    o.problem.sinks = o.sinks;
                }
                if (c.slopes) {
                    o.slopes = {0.5f, 0.0f, 0.125f, 1.0f, 0.25f, 0.0625f};
                    o.problem.alibi_slopes = o.slopes;
                }
                check_against_reference(o);
            }
}

TEST_CASE("paged: shared pages, one query per sequence, odd shapes", "[paged]") {
    // Sequence 1 reads sequence 0's first two pages (a common prompt) and then its own; one query
    // row per sequence (decode), Hq = Hkv = 1 and E = 3, Ev = 1.
    qkv_test::owned_paged o = qkv_test::random_paged({.kv_lens = {37, 45, 1},
                                                      .q_heads = 1,
                                                      .kv_heads = 1,
                                                      .d_qk = 3,
                                                      .d_v = 1,
                                                      .page_size = 16,
                                                      .shared = 2,
                                                      .seed = 3});
    REQUIRE(o.table[o.problem.max_pages] == o.table[0]);
    REQUIRE(o.table[o.problem.max_pages + 1] == o.table[1]);
    o.problem.options = {.causal = true, .alignment = qkv::causal_alignment::bottom_right, .return_lse = true};
    check_against_reference(o);
    // The gathered keys of sequence 1's first 32 rows are sequence 0's.
    const qkv::basic_gathered_pages<float> g = qkv::gather_pages(o.problem);
    for (std::size_t j = 0; j < 32 * 3; ++j) CHECK(g.k[37 * 3 + j] == g.k[j]);
    // GQA 17 / 1 heads at E = 17 over pages of 1 row.
    qkv_test::owned_paged gqa = qkv_test::random_paged(
        {.kv_lens = {5, 17}, .q_len = 2, .q_heads = 17, .kv_heads = 1, .d_qk = 17, .d_v = 3, .page_size = 1});
    gqa.problem.options.return_lse = true;
    check_against_reference(gqa);
}

TEST_CASE("paged: a float64 problem is the float32 one widened", "[paged]") {
    qkv_test::owned_paged o = qkv_test::random_paged({.kv_lens = {9, 30}, .q_len = 2, .page_size = 8, .seed = 11});
    o.problem.options.causal = true;
    const std::vector<double> q(o.q.begin(), o.q.end()), k(o.k_pages.begin(), o.k_pages.end()),
        v(o.v_pages.begin(), o.v_pages.end());
    qkv::paged_problem_f64 p{.q_heads = o.problem.q_heads,
                             .kv_heads = o.problem.kv_heads,
                             .d_qk = o.problem.d_qk,
                             .d_v = o.problem.d_v,
                             .page_size = o.problem.page_size,
                             .num_pages = o.problem.num_pages,
                             .k_pages = k,
                             .v_pages = v,
                             .max_pages = o.problem.max_pages,
                             .block_table = o.problem.block_table,
                             .cache_seqlens = o.problem.cache_seqlens,
                             .q_len = 2,
                             .q = q,
                             .options = o.problem.options};
    CHECK(qkv::cpu::sdpa(p).output == qkv::cpu::sdpa_f64(o.problem).output);
    CHECK(qkv::batch_of(p) == 2);
}

TEST_CASE("paged: malformed batches are refused, naming what is wrong", "[paged]") {
    qkv_test::owned_paged o = qkv_test::random_paged({.kv_lens = {20, 5}, .q_len = 1, .page_size = 8, .seed = 2});
    const auto refused = [&](const qkv::paged_problem& p, std::initializer_list<std::string> words) {
        expect_invalid([&] { (void)qkv::cpu::sdpa(p); }, words);
        expect_invalid([&] { qkv::validate(p); }, words);
    };
    qkv::paged_problem p = o.problem;
    for (const std::size_t bad : {0u, 12u, 2048u}) {
        p = o.problem, p.page_size = bad;
        refused(p, {"page_size is " + std::to_string(bad), "power of two"});
    }
    // A page index past the pool, or negative, where a sequence reads it.
    std::vector<std::int32_t> table = o.table;
    table[1] = static_cast<std::int32_t>(o.problem.num_pages);
    p = o.problem, p.block_table = table;
    refused(p, {"block_table[0][1]", "num_pages = " + std::to_string(o.problem.num_pages)});
    table = o.table, table[o.problem.max_pages] = -3;
    p = o.problem, p.block_table = table;
    refused(p, {"block_table[1][0] = -3"});
    // An entry past what the sequence needs is not read.
    table = o.table, table[o.problem.max_pages + 1] = 999;
    p = o.problem, p.block_table = table;
    CHECK_NOTHROW(qkv::validate(p));
    // A table too short for a sequence's length.
    std::vector<std::int32_t> lens{33, 5};
    p = o.problem, p.cache_seqlens = lens;
    refused(p, {"too short for sequence 0", "33 keys need 5 pages of 8 rows", "a row has 4"});
    lens = {20, -1};
    p = o.problem, p.cache_seqlens = lens;
    refused(p, {"cache_seqlens[1] is -1"});
    p = o.problem, p.cache_seqlens = {};
    refused(p, {"cache_seqlens is empty"});
    p = o.problem, p.block_table = std::span<const std::int32_t>(o.table).first(o.table.size() - 1);
    refused(p, {"block_table has", "max_pages"});
    p = o.problem, p.k_pages = std::span<const float>(o.k_pages).first(o.k_pages.size() - 1);
    refused(p, {"k_pages has", "num_pages x page_size"});
    p = o.problem, p.num_pages = 0;
    refused(p, {"num_pages is 0"});
    p = o.problem, p.q_len = 2;
    refused(p, {"q has", "q_len"});
    const std::vector<std::int32_t> cu_short{0, 1}, cu_falling{0, 2, 1};
    p = o.problem, p.cu_seqlens_q = cu_short;
    refused(p, {"cu_seqlens_q has 2 entries", "B + 1 = 3"});
    p = o.problem, p.cu_seqlens_q = cu_falling;
    refused(p, {"cu_seqlens_q must be nondecreasing"});
    p = o.problem, p.kv_heads = 3;
    refused(p, {"kv_heads"});
    p = o.problem, p.options.window_left = -2;
    refused(p, {"window_left"});
    // Without the data (a paged_call's step: the pool on the device, q a tensor): the same checks
    // of the table and lengths, q and the pages refused where given.
    p = o.problem, p.k_pages = {}, p.v_pages = {}, p.q = {};
    CHECK_NOTHROW(qkv::validate_without_data(p));
    CHECK_THROWS_AS(qkv::validate_without_pool(p), qkv::invalid_argument);  // q missing there
    table = o.table, table[0] = static_cast<std::int32_t>(o.problem.num_pages);
    p.block_table = table;
    expect_invalid([&] { qkv::validate_without_data(p); }, {"block_table[0][0]", "num_pages"});
    p = o.problem, p.k_pages = {}, p.v_pages = {};
    expect_invalid([&] { qkv::validate_without_data(p); }, {"q must be empty"});
    p = o.problem, p.k_pages = {}, p.v_pages = {}, p.q = {}, p.q_len = std::size_t{1} << 31;
    expect_invalid([&] { qkv::validate_without_data(p); }, {"query rows exceed int32 offsets"});
    {  // new rows as tensors: k_new and v_new empty; the pool rows resolved as with the data
        qkv_test::owned_paged a = qkv_test::random_paged({.kv_lens = {20, 9}, .page_size = 4, .seed = 12});
        qkv_test::make_appends(a, 5, 3);
        qkv::paged_problem d = a.problem;
        d.k_pages = {}, d.v_pages = {}, d.q = {};
        expect_invalid([&] { qkv::validate_without_data(d); }, {"k_new and v_new must be empty"});
        d.k_new = {}, d.v_new = {};
        CHECK_NOTHROW(qkv::validate_without_data(d));
        const qkv::basic_resolved_pages<float> with = qkv::resolve_pages(a.problem);
        const qkv::basic_resolved_pages<float> without = qkv::resolve_pages_without_data(d);
        CHECK(without.rows_at == with.rows_at);
        CHECK(without.block_table == with.block_table);
        CHECK(without.cache_seqlens == with.cache_seqlens);
        CHECK(without.k_rows.empty());
    }
    // The capability table's refusals, with their reasons.
    p = o.problem, p.options.return_weights = true;
    expect_invalid([&] { (void)qkv::cpu::sdpa(p); }, {"cpu::sdpa over a paged K/V batch", "return_weights"});
    p = o.problem, p.options.dropout_p = 0.5f;
    expect_invalid([&] { (void)qkv::cpu::sdpa(p); }, {"cpu::sdpa over a paged K/V batch", "dropout_p"});
}

namespace {

/// The CPU reference against flash_attn_with_kvcache's definition (support/paged_problems.hpp):
/// exact to float64 rounding without a rotary embedding; with one, the float problem's rotation
/// runs in float32 (as FlashAttention's does for float32 inputs), the definition's in float64.
void check_appended(const qkv::paged_problem& p) {
    const qkv_test::paged_ref_result want = qkv_test::kvcache_reference(p);
    if (p.rotary_dim == 0) {
        qkv_test::check_cpu_backend(p, want);
        return;
    }
    const qkv::varlen_output_f64 got = qkv::cpu::sdpa_f64(p);
    REQUIRE(got.output.size() == want.output.size());
    for (const double x : got.output) REQUIRE(std::isfinite(x));
    CHECK(qkv_test::nmse(got.output, want.output) <= 1e-12);
}

}  // namespace

TEST_CASE("paged: appends, then attention: page sizes 1 and 16, 1 and 17 new rows crossing pages, GQA",
          "[paged][paged_append]") {
    for (const std::size_t page_size : {1u, 16u})
        for (const std::size_t rows : {1u, 17u})
            for (const bool rotary : {false, true})
                for (const bool interleaved : {true, false}) {
                    if (!rotary && !interleaved) continue;
                    INFO("page_size " << page_size << ", " << rows << " new rows"
                                      << (rotary ? (interleaved ? ", rotary interleaved" : ", rotary halves") : ""));
                    // Lengths after the append: 17 + 17 = 34 crosses two pages of 16; 113 + rows.
                    qkv_test::owned_paged o = qkv_test::random_paged({.kv_lens = {rows + 17, rows, rows + 113},
                                                                      .q_len = 3,
                                                                      .q_heads = 6,
                                                                      .kv_heads = 2,
                                                                      .d_qk = 18,
                                                                      .d_v = 7,
                                                                      .page_size = page_size,
                                                                      .seed = 40 + rows + page_size});
                    qkv_test::make_appends(o, rows, 5 + rows);
                    o.problem.options = {
                        .causal = true, .alignment = qkv::causal_alignment::bottom_right, .return_lse = true};
                    if (rotary) qkv_test::make_rotary(o, 12, 160, interleaved);
                    check_appended(o.problem);
                    // Without the causal rule, q turns at cache_seqlens[b] for all its rows.
                    o.problem.options = {.return_lse = true};
                    check_appended(o.problem);
                }
}

TEST_CASE("paged: with kv_type q8_0 / q4_0, the appended rows are stored after the rotary embedding",
          "[paged][paged_append]") {
    // What a quantized device pool holds after an append: each new key turned at its position
    // (rotate_rows), then every row of the pool stored as kv_type (qkv::round_trip, whole 32-value
    // blocks of a row). The reference with appends and kv_type equals the one over a pool that
    // already holds those rows, without appends or kv_type.
    for (const qkv::element_type type : {qkv::element_type::q8_0, qkv::element_type::q4_0})
        for (const std::size_t page_size : {1u, 16u}) {
            INFO(qkv::to_string(type) << ", page_size " << page_size);
            const std::size_t n = 17, Hkv = 2, E = 64, Ev = 32;
            qkv_test::owned_paged o = qkv_test::random_paged({.kv_lens = {n + 17, n + 40},
                                                              .q_len = 2,
                                                              .q_heads = 4,
                                                              .kv_heads = Hkv,
                                                              .d_qk = E,
                                                              .d_v = Ev,
                                                              .page_size = page_size,
                                                              .seed = 70 + page_size});
            qkv_test::make_appends(o, n, 9);
            qkv_test::make_rotary(o, 32, 64, true);
            o.problem.options = {
                .causal = true, .alignment = qkv::causal_alignment::bottom_right, .return_lse = true, .kv_type = type};
            const qkv::paged_problem& p = o.problem;
            std::vector<float> k = o.k_pages, v = o.v_pages, q = o.q;
            std::vector<std::int32_t> lengths;
            for (std::size_t b = 0; b < 2; ++b) {
                for (std::size_t i = 0; i < n; ++i) {
                    const std::size_t t = static_cast<std::size_t>(p.cache_seqlens[b]) + i;
                    const std::size_t at =
                        static_cast<std::size_t>(o.table[b * p.max_pages + t / page_size]) * page_size + t % page_size;
                    std::vector<float> row(o.k_new.begin() + static_cast<std::ptrdiff_t>((b * n + i) * Hkv * E),
                                           o.k_new.begin() + static_cast<std::ptrdiff_t>((b * n + i + 1) * Hkv * E));
                    const std::size_t position[1] = {t};
                    qkv::rotate_rows<float>(p, row, 1, Hkv, E, position);
                    std::copy(row.begin(), row.end(), k.begin() + static_cast<std::ptrdiff_t>(at * Hkv * E));
                    std::copy_n(o.v_new.begin() + static_cast<std::ptrdiff_t>((b * n + i) * Hkv * Ev), Hkv * Ev,
                                v.begin() + static_cast<std::ptrdiff_t>(at * Hkv * Ev));
                }
                // q's two rows at positions cache_seqlens[b] and + 1 (causal)
                for (std::size_t i = 0; i < 2; ++i) {
                    const std::size_t position[1] = {static_cast<std::size_t>(p.cache_seqlens[b]) + i};
                    qkv::rotate_rows<float>(p, std::span<float>(q).subspan((b * 2 + i) * 4 * E, 4 * E), 1, 4, E,
                                            position);
                }
                lengths.push_back(p.cache_seqlens[b] + static_cast<std::int32_t>(n));
            }
            k = qkv::round_trip(type, k), v = qkv::round_trip(type, v);
            qkv::paged_problem held = p;
            held.k_pages = k, held.v_pages = v, held.q = q, held.cache_seqlens = lengths;
            held.new_rows = 0, held.k_new = {}, held.v_new = {};
            held.rotary_dim = 0, held.rotary_cos = {}, held.rotary_sin = {};
            held.options.kv_type = std::nullopt;
            const qkv::varlen_output_f64 got = qkv::cpu::sdpa_f64(p), want = qkv::cpu::sdpa_f64(held);
            for (const double x : got.output) REQUIRE(std::isfinite(x));
            CHECK(qkv_test::nmse(got.output, want.output) <= 1e-14);
            CHECK(qkv_test::nmse(got.lse, want.lse) <= 1e-14);
            // Not the values before storing: the rounding is there to see.
            qkv::paged_problem unrounded = p;
            unrounded.options.kv_type = std::nullopt;
            CHECK(qkv_test::nmse(qkv::cpu::sdpa_f64(unrounded).output, want.output) > 1e-8);
        }
}

TEST_CASE("paged: cache_batch_idx and cache_leftpad", "[paged][paged_append]") {
    qkv_test::owned_paged o = qkv_test::random_paged(
        {.kv_lens = {40, 9, 33, 17}, .q_len = 2, .q_heads = 4, .kv_heads = 2, .d_qk = 8, .d_v = 8, .page_size = 4});
    qkv_test::make_appends(o, 3, 12);
    // The table's rows permuted, with one row no sequence uses: sequence b reads row batch_idx[b].
    // Leftpads: sequence 3's keys 14 .. 16 and its 3 new ones; sequence 2's 30 onwards.
    qkv_test::permute_table(o, {2, 4, 0, 1}, 5, {5, 0, 30, 14});
    qkv_test::make_rotary(o, 8, 64, false);
    for (const qkv::sdpa_options& options :
         {qkv::sdpa_options{.causal = true, .alignment = qkv::causal_alignment::bottom_right, .return_lse = true},
          qkv::sdpa_options{.causal = true, .return_lse = true},
          qkv::sdpa_options{.window_left = 4, .window_right = 1, .alibi_max_bias = 4.0f, .return_lse = true}}) {
        o.problem.options = options;
        check_appended(o.problem);
    }
}

TEST_CASE("paged: the refusals of appends, rotary, cache_batch_idx and cache_leftpad", "[paged][paged_append]") {
    qkv_test::owned_paged o = qkv_test::random_paged({.kv_lens = {20, 5}, .page_size = 8, .seed = 3});
    qkv_test::make_appends(o, 4, 1);
    qkv::paged_problem p = o.problem;
    REQUIRE_NOTHROW(qkv::validate(p));
    p.new_rows = 5;  // k_new holds 4 rows per sequence
    expect_invalid([&] { qkv::validate(p); }, {"k_new", "new_rows"});
    // An append overflowing a sequence's pages: 16 + 9 rows need 4 pages of 8, the row has 4
    // columns but the fourth is -1.
    std::vector<std::int32_t> seqlens = o.seqlens;
    seqlens[0] = 24;
    p = o.problem, p.cache_seqlens = seqlens;
    expect_invalid([&] { qkv::validate(p); }, {"block_table[0][3]", "writes or reads"});
    seqlens[0] = 29;  // 33 keys: 5 pages, the row has 4
    expect_invalid([&] { qkv::validate(p); }, {"too short for sequence 0", "new rows"});
    // Two appends into one row of the pool: sequence 1's table is sequence 0's.
    std::vector<std::int32_t> table = o.table;
    std::copy_n(table.begin(), o.problem.max_pages, table.begin() + static_cast<std::ptrdiff_t>(o.problem.max_pages));
    seqlens = {16, 16};
    p = o.problem, p.block_table = table, p.cache_seqlens = seqlens;
    expect_invalid([&] { qkv::validate(p), (void)qkv::cpu::sdpa(p); }, {"the same row of the pool"});
    // Rotary: without new rows, odd, wider than d_qk, sizes apart, too few positions.
    p = o.problem;
    qkv_test::make_rotary(o, 8, 10, true);
    p = o.problem;
    expect_invalid([&] { qkv::validate(p); }, {"rotary_cos", "reaches position"});
    qkv_test::make_rotary(o, 8, 64, true);
    p = o.problem;
    REQUIRE_NOTHROW(qkv::validate(p));
    p.rotary_dim = 7;
    expect_invalid([&] { qkv::validate(p); }, {"rotary_dim is 7", "even"});
    p.rotary_dim = 32;
    expect_invalid([&] { qkv::validate(p); }, {"rotary_dim is 32", "d_qk"});
    p = o.problem, p.rotary_sin = p.rotary_sin.first(8);
    expect_invalid([&] { qkv::validate(p); }, {"rotary_cos and rotary_sin"});
    p = o.problem, p.new_rows = 0, p.k_new = {}, p.v_new = {};
    expect_invalid([&] { qkv::validate(p); }, {"goes with new rows"});
    // cache_batch_idx past the table, cache_leftpad past cache_seqlens.
    const std::vector<std::int32_t> idx{1, 2}, pad{0, 2};
    p = o.problem, p.cache_batch_idx = idx;
    expect_invalid([&] { qkv::validate(p); }, {"cache_batch_idx[1] = 2", "not a row"});
    p = o.problem, p.cache_leftpad = pad;
    expect_invalid([&] { qkv::validate(p); }, {"cache_leftpad[1] = 2", "cache_seqlens[1] = 1"});
}
