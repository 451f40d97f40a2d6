// Paged K/V batches on the Vulkan backend (context::sdpa over a paged_problem), validation layer
// and synchronisation validation on: page sizes 1, 16 and 256, pages in shuffled order and shared
// between sequences, sequences of 0 and 1 keys beside long ones, one or ragged query counts, every
// score rule, fp16 and quantized K/V, against the float64 CPU reference (itself checked against the
// paged reference in paged_test.cpp) from the same rounded values, by normalised MSE (1e-9). And
// the refusals, typed and before any device work.
#include <qkv/runtime/cpu.hpp>
#include <qkv/runtime/element_type.hpp>
#include <qkv/vulkan/runtime.hpp>
#include <qkv/vulkan/testing.hpp>

#include <algorithm>
#include <cmath>
#include <concepts>
#include <initializer_list>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "support/backend_checks.hpp"
#include "support/catch.hpp"
#include "support/expect.hpp"
#include "support/gpu.hpp"
#include "support/paged_problems.hpp"
#include "support/reference.hpp"

namespace {

using qkv::element_type;

/// The rules of the page-size cases: every rule at once (with sinks, which the cases add), or
/// causal bottom-right alone; lse with both.
const qkv::sdpa_options every{.causal = true,
                              .alignment = qkv::causal_alignment::bottom_right,
                              .window_left = 6,
                              .softcap = 4.0f,
                              .alibi_max_bias = 8.0f,
                              .return_lse = true};
const qkv::sdpa_options causal{.causal = true, .alignment = qkv::causal_alignment::bottom_right, .return_lse = true};

}  // namespace

TEST_CASE("paged vulkan: page sizes 1, 16, 256, shuffled and shared pages, every rule", "[paged]") {
    qkv::vulkan::context& ctx = qkv_test::gpu();
    for (const std::size_t page_size : {1u, 16u, 256u})
        for (const bool ragged : {false, true}) {
            INFO("page_size " << page_size << (ragged ? ", ragged queries" : ", one query each"));
            // Sequence 1 reads sequence 0's first page (a shared prompt); 0 and 1 keys beside 150.
            qkv_test::paged_shape s{.kv_lens = {33, 40, 1, 150, 0, 17},
                                    .q_len = 1,
                                    .q_heads = 4,
                                    .kv_heads = 2,
                                    .d_qk = 16,
                                    .d_v = 24,
                                    .page_size = page_size,
                                    .shared = 1,
                                    .seed = 40 + page_size};
            if (ragged) s.q_lens = {2, 1, 3, 17, 0, 5};
            qkv_test::owned_paged o = qkv_test::random_paged(s);
            o.problem.options = ragged ? every : causal;
            if (ragged) {
                o.sinks = {0.5f, -std::numeric_limits<float>::infinity(), 2.0f, -1.0f};
                o.problem.sinks = o.sinks;
            }
            const qkv::varlen_output got = ctx.sdpa(o.problem);
            qkv_test::check_packed(got, qkv_test::device_reference(o.problem));
            CHECK(got.device == ctx.device().name);
            // Equal inputs, equal bits.
            CHECK(ctx.sdpa(o.problem).output == got.output);
            qkv_test::require_clean(ctx);
        }
}

TEST_CASE("paged vulkan: fp16 and quantized pages", "[paged]") {
    qkv::vulkan::context& ctx = qkv_test::gpu();
    for (const auto& [precision, kv_type] :
         {std::pair{qkv::precision::fp16, std::optional<element_type>{}},
          std::pair{qkv::precision::fp32, std::optional<element_type>{element_type::q8_0}},
          std::pair{qkv::precision::fp32, std::optional<element_type>{element_type::q4_0}}}) {
        INFO((kv_type ? std::string(qkv::to_string(*kv_type)) : std::string("fp16")));
        qkv_test::owned_paged o = qkv_test::random_paged(
            {.kv_lens = {40, 17, 113}, .q_len = 1, .q_heads = 4, .kv_heads = 1, .d_qk = 32, .d_v = 32, .seed = 8});
        o.problem.options = {.causal = true,
                             .alignment = qkv::causal_alignment::bottom_right,
                             .precision = precision,
                             .return_lse = true,
                             .kv_type = kv_type};
        qkv_test::check_packed(ctx.sdpa(o.problem), qkv_test::device_reference(o.problem));
        qkv_test::require_clean(ctx);
    }
}

TEST_CASE("paged vulkan: refusals come first, typed, with the table's reason", "[paged]") {
    qkv::vulkan::context& ctx = qkv_test::gpu();
    qkv_test::owned_paged o = qkv_test::random_paged({.kv_lens = {20, 5}, .page_size = 8, .seed = 3});
    qkv::paged_problem p = o.problem;
    p.options.return_weights = true;
    qkv_test::expect_invalid([&] { (void)ctx.sdpa(p); },
                             {"context::sdpa over a paged K/V batch", "return_weights", "ragged batch has no"});
    std::vector<std::int32_t> table = o.table;
    table[0] = 1000;
    p = o.problem, p.block_table = table;
    qkv_test::expect_invalid([&] { (void)ctx.sdpa(p); }, {"block_table[0][0] = 1000", "num_pages"});
    p = o.problem, p.page_size = 3;
    qkv_test::expect_invalid([&] { (void)ctx.sdpa(p); }, {"page_size is 3", "power of two"});
    qkv_test::require_clean(ctx);
}

namespace {

/// The pages' rows of `p` in page order as (1, Hkv, rows, E) and (1, Hkv, rows, Ev).
std::pair<std::vector<float>, std::vector<float>> pool_rows(const qkv::paged_problem& p) {
    const std::size_t rows = p.num_pages * p.page_size, H = p.kv_heads, E = p.d_qk, Ev = p.d_v;
    std::vector<float> k(rows * H * E), v(rows * H * Ev);
    for (std::size_t n = 0; n < rows; ++n)
        for (std::size_t h = 0; h < H; ++h) {
            for (std::size_t e = 0; e < E; ++e) k[(h * rows + n) * E + e] = p.k_pages[(n * H + h) * E + e];
            for (std::size_t e = 0; e < Ev; ++e) v[(h * rows + n) * Ev + e] = p.v_pages[(n * H + h) * Ev + e];
        }
    return {std::move(k), std::move(v)};
}

/// The pool of `p` as a device pool: a kv_cache of batch 1 whose rows are the pages' rows in page
/// order, stored as `type`.
qkv::vulkan::kv_cache device_pool(qkv::vulkan::context& ctx, const qkv::paged_problem& p, element_type type) {
    const std::size_t rows = p.num_pages * p.page_size;
    qkv::vulkan::kv_cache pool(
        ctx, {.batch = 1, .kv_heads = p.kv_heads, .capacity = rows + 16, .d_qk = p.d_qk, .d_v = p.d_v, .type = type});
    const auto [k, v] = pool_rows(p);
    pool.append(k, v, rows);
    return pool;
}

/// Runs `call`, expecting qkv::vulkan::limit_exceeded whose message contains every one of `words`.
template <std::invocable F>
void expect_limit(F&& call, std::initializer_list<std::string> words) {
    bool thrown = false;
    try {
        call();
    } catch (const qkv::vulkan::limit_exceeded& e) {
        thrown = true;
        const std::string message = e.what();
        INFO("message: " << message);
        for (const std::string& w : words) CHECK(message.find(w) != std::string::npos);
    }
    CHECK(thrown);
}

qkv::paged_problem without_pool(qkv::paged_problem p) {
    p.k_pages = {}, p.v_pages = {};
    p.num_pages = 0;
    return p;
}

}  // namespace

TEST_CASE("paged vulkan: a device pool, page sizes 1, 16, 256, shuffled and shared pages, every rule",
          "[paged][paged_pool]") {
    qkv::vulkan::context& ctx = qkv_test::gpu();
    for (const std::size_t page_size : {1u, 16u, 256u})
        for (const bool ragged : {false, true}) {
            INFO("page_size " << page_size << (ragged ? ", ragged queries" : ", one query each"));
            qkv_test::paged_shape s{.kv_lens = {33, 40, 1, 1500, 0, 17},
                                    .q_len = 1,
                                    .q_heads = 6,
                                    .kv_heads = 3,
                                    .d_qk = 17,
                                    .d_v = 24,
                                    .page_size = page_size,
                                    .shared = 1,
                                    .seed = 70 + page_size};
            if (ragged) s.q_lens = {2, 1, 3, 17, 0, 5};
            qkv_test::owned_paged o = qkv_test::random_paged(s);
            o.problem.options = ragged ? every : causal;
            if (ragged) {
                o.sinks = {0.5f, -std::numeric_limits<float>::infinity(), 2.0f, -1.0f, 0.0f, 1.0f};
                o.problem.sinks = o.sinks;
            }
            const qkv::vulkan::kv_cache pool = device_pool(ctx, o.problem, element_type::f32);
            const qkv::paged_problem p = without_pool(o.problem);
            const qkv::varlen_output got = ctx.sdpa(p, pool);
            qkv_test::check_packed(got, qkv_test::device_reference(o.problem));
            CHECK(got.device == ctx.device().name);
            CHECK(ctx.sdpa(p, pool).output == got.output);  // equal inputs, equal bits
            qkv_test::require_clean(ctx);
        }
}

TEST_CASE("paged vulkan: a device pool of f16, a long sequence split among short ones", "[paged][paged_pool]") {
    qkv::vulkan::context& ctx = qkv_test::gpu();
    qkv_test::owned_paged o = qkv_test::random_paged({.kv_lens = {3000, 17, 5, 113, 1},
                                                      .q_len = 1,
                                                      .q_heads = 8,
                                                      .kv_heads = 2,
                                                      .d_qk = 64,
                                                      .d_v = 64,
                                                      .page_size = 16,
                                                      .seed = 9});
    o.problem.options = {.causal = true, .alignment = qkv::causal_alignment::bottom_right, .return_lse = true};
    const qkv::vulkan::kv_cache pool = device_pool(ctx, o.problem, element_type::f16);
    qkv::paged_problem want = o.problem;
    want.options.kv_type = element_type::f16;
    qkv_test::check_packed(ctx.sdpa(without_pool(o.problem), pool), qkv_test::device_reference(want));
    qkv_test::require_clean(ctx);
}

TEST_CASE("paged vulkan: a device pool past the storage-buffer range, read only through texel views",
          "[paged][paged_pool]") {
    // The hook pretends maxStorageBufferRange is 16 KiB for the caches' storage: this pool's K
    // (2 heads x 300 rows x 16 texels of 16 bytes = 150 KiB) and V pass it, as the issue's
    // 32K-token pool passes lavapipe's 128 MiB, and are kept readable only through texel views.
    qkv::vulkan::context ctx = qkv_test::make_context({.kv_storage_range = 16384});
    qkv_test::owned_paged o = qkv_test::random_paged({.kv_lens = {200, 17, 1, 0, 61},
                                                      .q_len = 1,
                                                      .q_heads = 4,
                                                      .kv_heads = 2,
                                                      .d_qk = 64,
                                                      .d_v = 40,
                                                      .page_size = 16,
                                                      .shared = 1,
                                                      .seed = 31});
    o.problem.options = {.causal = true, .alignment = qkv::causal_alignment::bottom_right, .return_lse = true};
    for (const element_type type : {element_type::f32, element_type::f16}) {
        INFO(qkv::to_string(type));
        qkv::vulkan::kv_cache pool = device_pool(ctx, o.problem, type);
        qkv::paged_problem want = o.problem;
        want.options.kv_type = type;
        const qkv::varlen_output got = ctx.sdpa(without_pool(o.problem), pool);
        qkv_test::check_packed(got, qkv_test::device_reference(want));
        // What binds the storage as a whole is refused, typed and naming the limit.
        expect_limit([&] { (void)pool.keys(); }, {"kv_cache::keys", "maxStorageBufferRange"});
        expect_limit([&] { (void)pool.values(); }, {"kv_cache::values", "maxStorageBufferRange"});
        const std::size_t before = pool.size();
        qkv::vulkan::tensor k(ctx, {1, 2, 1, 64}, type), v(ctx, {1, 2, 1, 40}, type);
        k.upload(std::vector<float>(128, 0.25f)), v.upload(std::vector<float>(80, -0.5f));
        expect_limit([&] { pool.append(k, v, 1); }, {"kv_cache::append", "maxStorageBufferRange"});
        CHECK(pool.size() == before);
        // The decode over the same cache (every row as one sequence) reads it through the views too.
        const auto [k_rows, v_rows] = pool_rows(o.problem);
        std::vector<float> q(4 * 64);
        for (std::size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.37f * static_cast<float>(i)) + 0.1f;
        qkv::sdpa_problem one;
        one.shape = {.batch = 1, .q_heads = 4, .kv_heads = 2, .q_len = 1, .kv_len = before, .d_qk = 64, .d_v = 40};
        one.q = q;
        const qkv::sdpa_output decoded = ctx.sdpa(one, pool);
        one.k = k_rows, one.v = v_rows;
        one.options.kv_type = type;
        const qkv::sdpa_output_f64 decoded_want = qkv::cpu::sdpa_f64(one);
        for (const float x : decoded.output) REQUIRE(std::isfinite(x));
        CHECK(qkv_test::nmse(decoded.output, decoded_want.output) <= 1e-9);
        qkv_test::require_clean(ctx);
    }
}

TEST_CASE("paged vulkan: a device pool's refusals come first, typed", "[paged][paged_pool]") {
    qkv::vulkan::context& ctx = qkv_test::gpu();
    qkv_test::owned_paged o = qkv_test::random_paged({.kv_lens = {20, 5}, .page_size = 8, .seed = 3});
    const qkv::vulkan::kv_cache pool = device_pool(ctx, o.problem, element_type::f32);
    qkv::paged_problem p = without_pool(o.problem);
    std::vector<std::int32_t> table = o.table;
    table[0] = static_cast<std::int32_t>(o.problem.num_pages);  // one past the pages the pool holds
    p.block_table = table;
    qkv_test::expect_invalid([&] { (void)ctx.sdpa(p, pool); }, {"block_table[0][0]", "num_pages"});
    p = o.problem;  // the pool given twice
    qkv_test::expect_invalid([&] { (void)ctx.sdpa(p, pool); }, {"k_pages and v_pages must be empty"});
    p = without_pool(o.problem), p.page_size = 0;
    qkv_test::expect_invalid([&] { (void)ctx.sdpa(p, pool); }, {"page_size is 0", "power of two"});
    p = without_pool(o.problem), p.num_pages = 1000;
    qkv_test::expect_invalid([&] { (void)ctx.sdpa(p, pool); }, {"num_pages is 1000", "the pool holds"});
    p = without_pool(o.problem), p.d_v = 8;
    qkv_test::expect_invalid([&] { (void)ctx.sdpa(p, pool); }, {"batch 1", "d_v"});
    qkv_test::require_clean(ctx);
}

TEST_CASE("paged vulkan: shared prefixes (cascade) of one and several pages, every rule that depends on positions",
          "[paged][paged_pool][cascade]") {
    qkv::vulkan::context& ctx = qkv_test::gpu();
    const qkv::sdpa_options scored{.causal = true,
                                   .alignment = qkv::causal_alignment::bottom_right,
                                   .softcap = 4.0f,
                                   .alibi_max_bias = 8.0f,
                                   .return_lse = true};
    qkv::sdpa_options windowed = scored;  // a window wide enough to leave every prefix whole
    windowed.window_left = 120, windowed.softcap = 0, windowed.alibi_max_bias = 0;
    const qkv::sdpa_options full{.alibi_max_bias = 4.0f, .return_lse = true};  // every query sees every key
    for (const std::size_t page_size : {1u, 16u})
        for (const qkv::sdpa_options& options : {scored, windowed, full}) {
            INFO("page_size " << page_size << ", causal " << options.causal << ", window " << options.window_left);
            // 0..3 share sequence 0's first pages (a group of four: 2 pages of 16, or 32 of 1 key),
            // 5 shares 4's first page (a group of two), 6 stands alone; ragged queries.
            const std::size_t two = 32 / page_size, one = 16 / page_size;
            qkv_test::paged_shape s{.kv_lens = {50, 37, 64, 90, 17, 33, 3},
                                    .q_lens = {1, 2, 1, 3, 1, 1, 2},
                                    .q_heads = 6,
                                    .kv_heads = 2,
                                    .d_qk = 17,
                                    .d_v = 24,
                                    .page_size = page_size,
                                    .shares = {{0, 0}, {0, two}, {0, two}, {0, 3 * one}, {0, 0}, {4, one}, {0, 0}},
                                    .seed = 90 + page_size};
            qkv_test::owned_paged o = qkv_test::random_paged(s);
            o.problem.options = options;
            o.sinks = {0.5f, -std::numeric_limits<float>::infinity(), 2.0f, -1.0f, 0.0f, 1.0f};
            o.problem.sinks = o.sinks;
            const qkv::vulkan::kv_cache pool = device_pool(ctx, o.problem, element_type::f32);
            qkv::paged_problem p = without_pool(o.problem);
            const qkv::varlen_output_f64 want = qkv_test::device_reference(o.problem);
            const qkv::varlen_output got = ctx.sdpa(p, pool);
            qkv_test::check_packed(got, want);
            CHECK(ctx.sdpa(p, pool).output == got.output);  // equal inputs, equal bits
            p.cascade = false;
            qkv_test::check_packed(ctx.sdpa(p, pool), want);
            qkv_test::require_clean(ctx);
        }
}

TEST_CASE("paged vulkan: a shared prefix with GQA and many decode rows, f16 pages", "[paged][paged_pool][cascade]") {
    qkv::vulkan::context& ctx = qkv_test::gpu();
    // Nine sequences of one query each read the same 3 pages of 16 (a 48-key prompt) then their own.
    std::vector<std::size_t> lens{60, 49, 113, 48, 70, 51, 99, 64, 81};
    std::vector<std::pair<std::size_t, std::size_t>> shares(lens.size(), {0, 3});
    shares[0] = {0, 0};
    qkv_test::owned_paged o = qkv_test::random_paged({.kv_lens = lens,
                                                      .q_len = 1,
                                                      .q_heads = 8,
                                                      .kv_heads = 2,
                                                      .d_qk = 64,
                                                      .d_v = 64,
                                                      .page_size = 16,
                                                      .shares = shares,
                                                      .seed = 11});
    o.problem.options = {.causal = true, .alignment = qkv::causal_alignment::bottom_right, .return_lse = true};
    const qkv::vulkan::kv_cache pool = device_pool(ctx, o.problem, element_type::f16);
    qkv::paged_problem want = o.problem;
    want.options.kv_type = element_type::f16;
    qkv_test::check_packed(ctx.sdpa(without_pool(o.problem), pool), qkv_test::device_reference(want));
    qkv_test::require_clean(ctx);
}

TEST_CASE("paged vulkan: nested shared prefixes (a prefix tree of depth 2 and 3), GQA, windows, sinks, lse",
          "[paged][paged_pool][cascade]") {
    qkv::vulkan::context& ctx = qkv_test::gpu();
    const float inf = std::numeric_limits<float>::infinity();
    // Depth 3, one query each (decode), 4 query heads per K/V head: 0..6 share 0's first 2 pages
    // (a system prompt), 0..3 the next 2 (a few-shot prefix), 0 and 1 the next 2; 6 is the system
    // prompt and nothing more; 7 has no keys; 8 and 9 are a disjoint group of two pages; 10 alone.
    // tests/paged_plan_test.cpp plans the same tables on a lavapipe-like device: every level pays.
    const qkv_test::paged_shape deep{
        .kv_lens = {130, 120, 100, 77, 50, 33, 32, 0, 40, 37, 25},
        .q_len = 1,
        .q_heads = 8,
        .kv_heads = 2,
        .d_qk = 24,
        .d_v = 17,
        .page_size = 16,
        .shares = {{0, 0}, {0, 6}, {0, 4}, {0, 4}, {0, 2}, {0, 2}, {0, 2}, {0, 0}, {0, 0}, {8, 2}, {0, 0}},
        .seed = 310};
    // Depth 2, chunks of prefill (ragged queries, causal bottom-right: every query sees the whole
    // prefix), 2 query heads per K/V head: 0..3 share 4 pages, 0 and 1 two more.
    const qkv_test::paged_shape two{.kv_lens = {113, 100, 70, 65, 3},
                                    .q_lens = {2, 2, 3, 1, 2},
                                    .q_heads = 4,
                                    .kv_heads = 2,
                                    .d_qk = 17,
                                    .d_v = 24,
                                    .page_size = 16,
                                    .shares = {{0, 0}, {0, 6}, {0, 4}, {0, 4}, {0, 0}},
                                    .seed = 311};
    qkv::sdpa_options scored = causal;  // causal bottom-right, softcap and ALiBi by position
    scored.softcap = 5.0f, scored.alibi_max_bias = 4.0f;
    qkv::sdpa_options windowed = causal;  // the long sequences' windows end past the prefixes: they
    windowed.window_left = 90;            // leave every group; the short ones keep theirs (3..6; 2, 3)
    const qkv::sdpa_options full{.alibi_max_bias = 2.0f, .return_lse = true};  // not causal
    for (const qkv_test::paged_shape* shape : {&deep, &two})
        for (const qkv::sdpa_options& options : {causal, scored, windowed, full}) {
            INFO((shape == &deep ? "depth 3" : "depth 2") << ", causal " << options.causal << ", window "
                                                          << options.window_left << ", softcap " << options.softcap);
            qkv_test::owned_paged o = qkv_test::random_paged(*shape);
            o.problem.options = options;
            // sinks: the merge's, once per row whatever the levels
            o.sinks.assign(shape->q_heads, 0.0f);
            for (std::size_t h = 0; h < o.sinks.size(); ++h) o.sinks[h] = h == 1 ? -inf : 0.75f * float(h) - 1.0f;
            o.problem.sinks = o.sinks;
            const qkv::vulkan::kv_cache pool = device_pool(ctx, o.problem, element_type::f32);
            qkv::paged_problem p = without_pool(o.problem);
            const qkv::varlen_output_f64 want = qkv_test::device_reference(o.problem);
            const qkv::varlen_output got = ctx.sdpa(p, pool);
            qkv_test::check_packed(got, want);
            const qkv::varlen_output again = ctx.sdpa(p, pool);  // equal inputs, equal bits
            CHECK(again.output == got.output);
            CHECK(again.lse == got.lse);
            p.cascade = false;
            qkv_test::check_packed(ctx.sdpa(p, pool), want);
            qkv_test::require_clean(ctx);
        }
}

TEST_CASE("paged vulkan: a device pool of q8_0 and q4_0, page sizes 1 and 16, GQA, a shared prefix",
          "[paged][paged_pool][cascade]") {
    // The kernel reads the pool's ggml blocks and dequantizes them as the decode against a cache
    // does; the reference is the float64 one over the dequantized pages (kv_type rounds them).
    qkv::vulkan::context& ctx = qkv_test::gpu();
    for (const element_type type : {element_type::q8_0, element_type::q4_0})
        for (const std::size_t page_size : {1u, 16u}) {
            INFO(qkv::to_string(type) << ", page_size " << page_size);
            // 1..3 share sequence 0's first 32 keys (a prompt of whole pages); 0 and 1 keys beside
            // 113; ragged queries; 3 query heads per K/V head.
            const std::size_t two = 32 / page_size;
            qkv_test::paged_shape s{.kv_lens = {50, 37, 113, 33, 0, 1},
                                    .q_lens = {1, 2, 1, 3, 0, 1},
                                    .q_heads = 6,
                                    .kv_heads = 2,
                                    .d_qk = 64,
                                    .d_v = 32,
                                    .page_size = page_size,
                                    .shares = {{0, 0}, {0, two}, {0, two}, {0, two}, {0, 0}, {0, 0}},
                                    .seed = 120 + page_size};
            qkv_test::owned_paged o = qkv_test::random_paged(s);
            // Every rule but the window, which would leave the prefix partly unseen (no cascade).
            o.problem.options = every;
            o.problem.options.window_left = -1;
            o.sinks = {0.5f, -std::numeric_limits<float>::infinity(), 2.0f, -1.0f, 0.0f, 1.0f};
            o.problem.sinks = o.sinks;
            const qkv::vulkan::kv_cache pool = device_pool(ctx, o.problem, type);
            qkv::paged_problem want = o.problem;
            want.options.kv_type = type;
            const qkv::varlen_output_f64 reference = qkv_test::device_reference(want);
            qkv::paged_problem p = without_pool(o.problem);
            const qkv::varlen_output got = ctx.sdpa(p, pool);
            qkv_test::check_packed(got, reference);
            CHECK(ctx.sdpa(p, pool).output == got.output);  // equal inputs, equal bits
            p.cascade = false;
            qkv_test::check_packed(ctx.sdpa(p, pool), reference);
            // The same pool's rows as host pages of the same type give the same result (the host
            // route packs them into blocks itself).
            qkv_test::check_packed(ctx.sdpa(want), reference);
            qkv_test::require_clean(ctx);
        }
}

TEST_CASE("paged vulkan: a q8_0 / q4_0 pool of an odd number of rows, its last row read", "[paged][paged_pool]") {
    // 34- and 18-byte rows: an odd number of rows in all ends the blocks' storage mid-word, and the
    // kernels read it a word at a time; the last row of the pool (the last key of sequence 0) must
    // read as written, in the paged decode and in the decode against the same cache. (The storage
    // is whole words; qkv bench --serve --kv-type, tests/cli, shows the wrong last row that a
    // storage ending mid-word gave on lavapipe, which this context did not.)
    qkv::vulkan::context& ctx = qkv_test::gpu();
    for (const element_type type : {element_type::q8_0, element_type::q4_0}) {
        INFO(qkv::to_string(type));
        qkv_test::owned_paged o = qkv_test::random_paged({.kv_lens = {17},
                                                          .q_len = 1,
                                                          .q_heads = 3,
                                                          .kv_heads = 1,
                                                          .d_qk = 32,
                                                          .d_v = 32,
                                                          .page_size = 1,
                                                          .seed = 5});
        o.problem.options = {.causal = true, .alignment = qkv::causal_alignment::bottom_right, .return_lse = true};
        const std::size_t rows = o.problem.num_pages;  // pages of one row
        REQUIRE(rows % 2 == 1);
        std::vector<std::int32_t> table(rows);  // page i is row i: the last key is the pool's last row
        for (std::size_t i = 0; i < rows; ++i) table[i] = static_cast<std::int32_t>(i);
        o.problem.block_table = table;
        o.problem.max_pages = rows;
        qkv::vulkan::kv_cache pool(ctx,
                                   {.batch = 1, .kv_heads = 1, .capacity = rows, .d_qk = 32, .d_v = 32, .type = type});
        const auto [k, v] = pool_rows(o.problem);
        pool.append(k, v, rows);
        qkv::paged_problem want = o.problem;
        want.options.kv_type = type;
        qkv_test::check_packed(ctx.sdpa(without_pool(o.problem), pool), qkv_test::device_reference(want));
        qkv::sdpa_problem one;
        one.shape = {.batch = 1, .q_heads = 3, .kv_heads = 1, .q_len = 1, .kv_len = rows, .d_qk = 32, .d_v = 32};
        one.q = o.problem.q;
        const qkv::sdpa_output decoded = ctx.sdpa(one, pool);
        one.k = k, one.v = v;
        one.options.kv_type = type;
        const qkv::sdpa_output_f64 decoded_want = qkv::cpu::sdpa_f64(one);
        for (const float x : decoded.output) REQUIRE(std::isfinite(x));
        CHECK(qkv_test::nmse(decoded.output, decoded_want.output) <= 1e-9);
        qkv_test::require_clean(ctx);
    }
}

namespace {

/// The device's result against flash_attn_with_kvcache's definition (support/paged_problems.hpp).
void check_appended(const qkv::varlen_output& got, const qkv::paged_problem& p) {
    const qkv_test::paged_ref_result want = qkv_test::kvcache_reference(p);
    REQUIRE(got.output.size() == want.output.size());
    for (const float x : got.output) REQUIRE(std::isfinite(x));
    const double e = qkv_test::nmse(got.output, want.output);
    INFO("output nmse " << e);
    CHECK(e <= 1e-9);
    if (p.options.return_lse) qkv_test::check_lse(got.lse, want.lse, 1e-9);
}

/// `p` after its append: no new rows, the lengths grown by them (what the pool now holds).
qkv::paged_problem after_append(qkv::paged_problem p, std::vector<std::int32_t>& lengths) {
    lengths.assign(p.cache_seqlens.begin(), p.cache_seqlens.end());
    for (std::int32_t& len : lengths) len += static_cast<std::int32_t>(p.new_rows);
    p.cache_seqlens = lengths;
    p.new_rows = 0, p.k_new = {}, p.v_new = {};
    p.rotary_dim = 0, p.rotary_cos = {}, p.rotary_sin = {};
    return p;
}

/// The output and lse of a paged_call over tensors as a varlen_output (downloaded).
qkv::varlen_output downloaded(const qkv::vulkan::tensor& out, const qkv::vulkan::tensor* lse) {
    qkv::varlen_output r;
    r.output = out.download();
    if (lse) r.lse = lse->download();
    return r;
}

/// The batches of the paged_call cases: GQA (3 query heads per K/V head), sequences 1..3 sharing
/// sequence 0's first 32 keys (a prompt of whole pages), sequences of 0 and 1 keys, ragged queries
/// or one each; odd widths unless given.
qkv_test::owned_paged call_batch(std::size_t page_size, bool ragged, std::uint64_t seed, std::size_t d_qk = 17,
                                 std::size_t d_v = 24) {
    const std::size_t two = 32 / page_size;
    qkv_test::paged_shape s{.kv_lens = {50, 37, 113, 33, 0, 1},
                            .q_len = 1,
                            .q_heads = 6,
                            .kv_heads = 2,
                            .d_qk = d_qk,
                            .d_v = d_v,
                            .page_size = page_size,
                            .shares = {{0, 0}, {0, two}, {0, two}, {0, two}, {0, 0}, {0, 0}},
                            .seed = seed};
    if (ragged) s.q_lens = {1, 2, 1, 3, 0, 1};
    qkv_test::owned_paged o = qkv_test::random_paged(s);
    o.problem.options = ragged ? every : causal;
    if (ragged) o.problem.options.window_left = -1;  // a window would leave the prefix partly unseen
    o.sinks = {0.5f, -std::numeric_limits<float>::infinity(), 2.0f, -1.0f, 0.0f, 1.0f};
    o.problem.sinks = o.sinks;
    return o;
}

/// The appending problem of the device-pool cases: three sequences whose lengths after the append
/// cross pages of 16 (17 + rows), consist of new rows only, and run long (113 + rows), GQA 6:2,
/// widths 18 / 7, one shared page, `rows` new rows each; for an f16 pool every value rounded to
/// what it holds, so that the float64 reference is exact. `seed` and `salt` keep cases apart.
qkv_test::owned_paged appending_problem(element_type type, std::size_t page_size, std::size_t rows, std::uint64_t seed,
                                        std::uint64_t salt) {
    qkv_test::owned_paged o = qkv_test::random_paged({.kv_lens = {rows + 17, rows, rows + 113},
                                                      .q_len = 2,
                                                      .q_heads = 6,
                                                      .kv_heads = 2,
                                                      .d_qk = 18,
                                                      .d_v = 7,
                                                      .page_size = page_size,
                                                      .shared = 1,
                                                      .seed = seed + rows + page_size});
    qkv_test::make_appends(o, rows, salt + rows);
    if (type == element_type::f16) {
        for (std::vector<float>* x : {&o.k_pages, &o.v_pages, &o.k_new, &o.v_new})
            *x = qkv::round_trip(element_type::f16, *x);
        o.problem.k_pages = o.k_pages, o.problem.v_pages = o.v_pages;
        o.problem.k_new = o.k_new, o.problem.v_new = o.v_new;
    }
    return o;
}

/// The quantized appending problem of the q8_0 / q4_0 append cases: lengths rows + 17 (crossing
/// pages of 16), rows (new rows only, in a page shared with sequence 0) and rows + 40; 3 query heads
/// per K/V head; E = 64 and Ev = 32 (whole blocks; 34- and 18-byte rows end mid-word).
qkv_test::owned_paged quantized_appending_problem(std::size_t page_size, std::size_t rows, std::uint64_t seed,
                                                  std::uint64_t salt) {
    qkv_test::owned_paged o = qkv_test::random_paged({.kv_lens = {rows + 17, rows, rows + 40},
                                                      .q_len = 2,
                                                      .q_heads = 6,
                                                      .kv_heads = 2,
                                                      .d_qk = 64,
                                                      .d_v = 32,
                                                      .page_size = page_size,
                                                      .shared = 1,
                                                      .seed = seed + rows + page_size});
    qkv_test::make_appends(o, rows, salt + rows);
    return o;
}

/// A decode of the first query row's 6 heads against the first `held` rows of a pool of that
/// problem's shape: every row the pool holds, as the decode kernels read them.
qkv::sdpa_problem every_row_decode(const qkv_test::owned_paged& o, std::size_t held) {
    qkv::sdpa_problem one;
    one.shape = {.batch = 1, .q_heads = 6, .kv_heads = 2, .q_len = 1, .kv_len = held, .d_qk = 64, .d_v = 32};
    one.q = std::span<const float>(o.q).first(6 * 64);
    return one;
}

/// q's tensor shape for `p`: (B, L, Hq, E), or (total_q, Hq, E) with cu_seqlens_q; out's with Ev.
std::vector<std::size_t> rows_shape(const qkv::paged_problem& p, std::size_t width) {
    if (p.cu_seqlens_q.empty()) return {p.cache_seqlens.size(), p.q_len, p.q_heads, width};
    return {static_cast<std::size_t>(p.cu_seqlens_q.back()), p.q_heads, width};
}

}  // namespace

TEST_CASE("paged vulkan: appends into a device pool, then attention, in one command buffer",
          "[paged][paged_pool][paged_append]") {
    qkv::vulkan::context& ctx = qkv_test::gpu();
    for (const element_type type : {element_type::f32, element_type::f16})
        for (const std::size_t page_size : {1u, 16u})
            for (const std::size_t rows : {1u, 17u}) {
                if (type == element_type::f16 && page_size == 1) continue;
                INFO(qkv::to_string(type) << ", page_size " << page_size << ", " << rows << " new rows");
                qkv_test::owned_paged o = appending_problem(type, page_size, rows, 90, 7);
                o.problem.options = {
                    .causal = true, .alignment = qkv::causal_alignment::bottom_right, .return_lse = true};
                qkv::vulkan::kv_cache pool = device_pool(ctx, o.problem, type);
                const qkv::paged_problem p = without_pool(o.problem);
                const qkv::varlen_output got = ctx.sdpa(p, pool);
                check_appended(got, o.problem);
                CHECK(pool.size() == o.problem.num_pages * page_size + 0);  // written in place
                // The rows stay: the same attention without appends reads them from the pool.
                std::vector<std::int32_t> lengths;
                const qkv::varlen_output again = ctx.sdpa(after_append(p, lengths), pool);
                check_appended(again, o.problem);
                qkv_test::require_clean(ctx);
            }
}

TEST_CASE("paged vulkan: fused rotary embedding, cache_batch_idx and cache_leftpad on a device pool",
          "[paged][paged_pool][paged_append]") {
    qkv::vulkan::context& ctx = qkv_test::gpu();
    for (const bool interleaved : {true, false}) {
        INFO((interleaved ? "rotary interleaved" : "rotary halves"));
        qkv_test::owned_paged o = qkv_test::random_paged({.kv_lens = {40, 9, 33, 17},
                                                          .q_len = 3,
                                                          .q_heads = 6,
                                                          .kv_heads = 3,
                                                          .d_qk = 20,
                                                          .d_v = 12,
                                                          .page_size = 16,
                                                          .seed = interleaved ? 5u : 6u});
        qkv_test::make_appends(o, 3, 21);
        qkv_test::make_rotary(o, 16, 64, interleaved);
        // The table's rows permuted, with a row no sequence uses: sequence b reads row batch_idx[b].
        qkv_test::permute_table(o, {2, 4, 0, 1}, 5, {5, 0, 30, 14});
        for (const qkv::sdpa_options& options :
             {qkv::sdpa_options{.causal = true, .alignment = qkv::causal_alignment::bottom_right, .return_lse = true},
              qkv::sdpa_options{.window_left = 4, .alibi_max_bias = 4.0f, .return_lse = true}}) {
            o.problem.options = options;
            qkv::vulkan::kv_cache pool = device_pool(ctx, o.problem, element_type::f32);
            check_appended(ctx.sdpa(without_pool(o.problem), pool), o.problem);
            qkv_test::require_clean(ctx);
        }
    }
}

TEST_CASE("paged vulkan: appends into a q8_0 / q4_0 device pool, rotary on, the blocks a kv_cache append writes",
          "[paged][paged_pool][paged_append]") {
    // The new rows (turned by the rotary embedding first) are quantized on the host by
    // qkv::quantize, as kv_cache::append quantizes, and copied into their pages; 34- and 18-byte
    // rows (d_v = 32) end mid-word. The float64 reference gathers the same rotated rows and stores
    // every key and value as kv_type (qkv::round_trip), so it sees the values the device holds.
    qkv::vulkan::context& ctx = qkv_test::gpu();
    for (const element_type type : {element_type::q8_0, element_type::q4_0})
        for (const std::size_t page_size : {1u, 16u})
            for (const std::size_t rows : {1u, 17u}) {
                INFO(qkv::to_string(type) << ", page_size " << page_size << ", " << rows << " new rows");
                // Lengths after the append: 17 + 17 = 34 crosses pages of 16; a sequence only of new
                // rows, in a page it shares with sequence 0; 3 query heads per K/V head.
                qkv_test::owned_paged o = quantized_appending_problem(page_size, rows, 300, 11);
                qkv_test::make_rotary(o, 32, 64, page_size == 1);
                o.problem.options = {
                    .causal = true, .alignment = qkv::causal_alignment::bottom_right, .return_lse = true};
                qkv::vulkan::kv_cache pool = device_pool(ctx, o.problem, type);
                const qkv::paged_problem p = without_pool(o.problem);
                qkv::paged_problem want = o.problem;
                want.options.kv_type = type;
                const qkv::varlen_output got = ctx.sdpa(p, pool);
                qkv_test::check_packed(got, qkv_test::device_reference(want));
                CHECK(pool.size() == o.problem.num_pages * page_size);  // written in place

                // The same pool written by one kv_cache::append: the pages' rows with the new (rotated)
                // rows at the pool rows resolve_pages gives them. Equal blocks read equally: the decode
                // over every row of both, and the batch after the append, give equal bits.
                const qkv::basic_resolved_pages<float> resolved = qkv::resolve_pages(o.problem);
                auto [k, v] = pool_rows(o.problem);
                const std::size_t held = o.problem.num_pages * page_size, n = resolved.rows_at.size();
                for (std::size_t x = 0; x < n; ++x)
                    for (std::size_t h = 0; h < 2; ++h) {
                        std::copy_n(resolved.k_rows.begin() + static_cast<std::ptrdiff_t>((h * n + x) * 64), 64,
                                    k.begin() + static_cast<std::ptrdiff_t>((h * held + resolved.rows_at[x]) * 64));
                        std::copy_n(resolved.v_rows.begin() + static_cast<std::ptrdiff_t>((h * n + x) * 32), 32,
                                    v.begin() + static_cast<std::ptrdiff_t>((h * held + resolved.rows_at[x]) * 32));
                    }
                qkv::vulkan::kv_cache whole(
                    ctx, {.batch = 1, .kv_heads = 2, .capacity = held + 16, .d_qk = 64, .d_v = 32, .type = type});
                whole.append(k, v, held);
                const qkv::sdpa_problem one = every_row_decode(o, held);
                const qkv::sdpa_output from_pool = ctx.sdpa(one, pool);
                for (const float x : from_pool.output) REQUIRE(std::isfinite(x));
                CHECK(from_pool.output == ctx.sdpa(one, whole).output);
                std::vector<std::int32_t> lengths;
                const qkv::paged_problem after = after_append(p, lengths);
                CHECK(ctx.sdpa(after, pool).output == ctx.sdpa(after, whole).output);
                qkv_test::require_clean(ctx);
                if (type == element_type::q4_0 && page_size == 16 && rows == 17) {
                    // Through staging (the inputs copied to device memory before the blocks are copied
                    // from them): the same bits, and no hazard.
                    qkv::vulkan::context staged = qkv_test::make_context({.force_staging = true});
                    qkv::vulkan::kv_cache staged_pool = device_pool(staged, o.problem, type);
                    CHECK(staged.sdpa(p, staged_pool).output == got.output);
                    CHECK(staged.sdpa(one, staged_pool).output == from_pool.output);
                    qkv_test::require_clean(staged);
                }
            }
}

TEST_CASE("paged vulkan: appends are refused before anything is written", "[paged][paged_pool][paged_append]") {
    qkv::vulkan::context& ctx = qkv_test::gpu();
    qkv_test::owned_paged o =
        qkv_test::random_paged({.kv_lens = {20, 12}, .q_heads = 2, .kv_heads = 1, .page_size = 4, .seed = 8});
    const std::vector<std::int32_t> full_lengths = o.seqlens;
    qkv::paged_problem full = o.problem;  // the pool as it is, every row the appends would write
    full.cache_seqlens = full_lengths;
    qkv_test::make_appends(o, 5, 2);
    qkv::vulkan::kv_cache pool = device_pool(ctx, o.problem, element_type::f32);
    // The pool unchanged: reading every row gives the reference of the pool as it was.
    const auto unchanged = [&] {
        qkv_test::check_packed(ctx.sdpa(without_pool(full), pool), qkv_test::device_reference(full));
    };
    qkv::paged_problem p = without_pool(o.problem);
    // A table that runs past the pool on a page only the append writes (sequence 1's last).
    std::vector<std::int32_t> table = o.table;
    table[o.problem.max_pages + 2] = static_cast<std::int32_t>(o.problem.num_pages);
    p.block_table = table;
    qkv_test::expect_invalid([&] { (void)ctx.sdpa(p, pool); }, {"block_table[1][2]", "writes or reads"});
    unchanged();
    // An append overflowing sequence 0's pages (its row has 6 columns of 4 rows).
    std::vector<std::int32_t> lengths = o.seqlens;
    lengths[0] = 20;
    p = without_pool(o.problem), p.cache_seqlens = lengths;
    qkv_test::expect_invalid([&] { (void)ctx.sdpa(p, pool); }, {"too short for sequence 0"});
    // Two appends into one row: sequence 1 appends into sequence 0's pages.
    table = o.table;
    std::copy_n(table.begin(), o.problem.max_pages, table.begin() + static_cast<std::ptrdiff_t>(o.problem.max_pages));
    p = without_pool(o.problem), p.block_table = table;
    lengths = {7, 7};
    p.cache_seqlens = lengths;
    qkv_test::expect_invalid([&] { (void)ctx.sdpa(p, pool); }, {"the same row of the pool"});
    // A const pool takes no appends.
    p = without_pool(o.problem);
    const qkv::vulkan::kv_cache& fixed = pool;
    qkv_test::expect_invalid([&] { (void)ctx.sdpa(p, fixed); }, {"the pool is const"});
    unchanged();
    // A q8_0 pool and a new value qkv::quantize refuses (NaN), as kv_cache::append refuses it.
    qkv_test::owned_paged o8 = qkv_test::random_paged(
        {.kv_lens = {20, 12}, .q_heads = 2, .kv_heads = 1, .d_qk = 32, .d_v = 32, .page_size = 4, .seed = 8});
    qkv::paged_problem full8 = o8.problem;
    const std::vector<std::int32_t> full8_lengths = o8.seqlens;
    full8.cache_seqlens = full8_lengths;
    full8.options.kv_type = element_type::q8_0;
    qkv_test::make_appends(o8, 5, 2);
    qkv::vulkan::kv_cache q8 = device_pool(ctx, o8.problem, element_type::q8_0);
    std::vector<float> nan_v = o8.v_new;
    nan_v[40] = std::numeric_limits<float>::quiet_NaN();
    p = without_pool(o8.problem), p.v_new = nan_v;
    qkv_test::expect_invalid([&] { (void)ctx.sdpa(p, q8); }, {"v_new", "q8_0"});
    qkv_test::check_packed(ctx.sdpa(without_pool(full8), q8), qkv_test::device_reference(full8));
    // An f16 pool and a new value past float16's range: numeric_overflow, nothing written.
    qkv::vulkan::kv_cache half = device_pool(ctx, o.problem, element_type::f16);
    std::vector<float> big = o.k_new;
    big[3] = 1e6f;
    p = without_pool(o.problem), p.k_new = big;
    CHECK_THROWS_AS(ctx.sdpa(p, half), qkv::vulkan::numeric_overflow);
    qkv_test::require_clean(ctx);
}

TEST_CASE("paged vulkan: appends without queries write the pool alone", "[paged][paged_pool][paged_append]") {
    qkv::vulkan::context& ctx = qkv_test::gpu();
    qkv_test::owned_paged o = qkv_test::random_paged(
        {.kv_lens = {21, 3}, .q_len = 1, .q_heads = 4, .kv_heads = 2, .d_qk = 5, .d_v = 9, .page_size = 4, .seed = 13});
    qkv_test::make_appends(o, 3, 4);
    qkv::vulkan::kv_cache pool = device_pool(ctx, o.problem, element_type::f32);
    qkv::paged_problem p = without_pool(o.problem);
    p.q_len = 0, p.q = {};
    const qkv::varlen_output none = ctx.sdpa(p, pool);
    CHECK(none.output.empty());
    // The queries afterwards see the appended rows.
    std::vector<std::int32_t> lengths;
    check_appended(ctx.sdpa(after_append(without_pool(o.problem), lengths), pool), o.problem);
    qkv_test::require_clean(ctx);
}

TEST_CASE("paged_call: run and sequence, page sizes 1 and 16, GQA, a shared prefix, lengths 0 and 1",
          "[paged][paged_pool][paged_call]") {
    // Over device tensors, the same plan and kernels as the host call: its bits, and the float64
    // reference's values. Each step's batch given with the tensors, or planned once from the
    // description; a sequence records two steps of different batches.
    qkv::vulkan::context& ctx = qkv_test::gpu();
    for (const std::size_t page_size : {1u, 16u})
        for (const bool ragged : {false, true}) {
            INFO("page_size " << page_size << (ragged ? ", ragged queries" : ", one query each"));
            qkv_test::owned_paged o = call_batch(page_size, ragged, 150 + page_size);
            qkv::vulkan::kv_cache pool = device_pool(ctx, o.problem, element_type::f32);
            const qkv::paged_problem host = without_pool(o.problem);
            const qkv::varlen_output want_bits = ctx.sdpa(host, pool);
            qkv_test::check_packed(want_bits, qkv_test::device_reference(o.problem));

            qkv::vulkan::tensor q(ctx, rows_shape(host, host.d_qk)), out(ctx, rows_shape(host, host.d_v));
            const std::size_t total_q = want_bits.output.size() / (host.q_heads * host.d_v);
            qkv::vulkan::tensor lse(ctx, {host.q_heads, total_q});
            q.upload(o.q);
            qkv::paged_problem desc = host;
            desc.q = {};
            // The step with the tensors; the description has shapes only.
            qkv::paged_problem shapes_only = desc;
            shapes_only.block_table = {}, shapes_only.cache_seqlens = {}, shapes_only.cu_seqlens_q = {};
            qkv::vulkan::paged_call call(ctx, shapes_only, pool);
            call.run({.q = &q,
                      .out = &out,
                      .lse = &lse,
                      .block_table = host.block_table,
                      .cache_seqlens = host.cache_seqlens,
                      .cu_seqlens_q = host.cu_seqlens_q});
            CHECK(out.download() == want_bits.output);
            CHECK(lse.download() == want_bits.lse);
            // The step planned once, from the description.
            qkv::vulkan::paged_call planned(ctx, desc, pool);
            qkv::vulkan::tensor out2(ctx, rows_shape(host, host.d_v)), lse2(ctx, {host.q_heads, total_q});
            planned.run({.q = &q, .out = &out2, .lse = &lse2});
            CHECK(out2.download() == want_bits.output);
            CHECK(lse2.download() == want_bits.lse);

            // A sequence: this step, then one where every sequence has one key more (a decode
            // step's growth) on the same pages, one submit.
            std::vector<std::int32_t> longer(host.cache_seqlens.begin(), host.cache_seqlens.end());
            for (std::int32_t& n : longer) ++n;
            qkv::paged_problem next = host;
            next.cache_seqlens = longer;
            std::vector<std::int32_t> table(host.block_table.begin(), host.block_table.end());
            for (std::size_t b = 0; b < longer.size(); ++b)  // a new last page where the keys need one
                if ((longer[b] - 1) % static_cast<std::int32_t>(page_size) == 0)
                    table[b * host.max_pages + static_cast<std::size_t>(longer[b] - 1) / page_size] = table[0];
            next.block_table = table;
            qkv::paged_problem next_ref = o.problem;
            next_ref.cache_seqlens = longer, next_ref.block_table = table;
            const qkv::varlen_output next_bits = ctx.sdpa(next, pool);
            qkv_test::check_packed(next_bits, qkv_test::device_reference(next_ref));
            qkv::vulkan::tensor out3(ctx, rows_shape(host, host.d_v)), lse3(ctx, {host.q_heads, total_q});
            out2.upload(std::vector<float>(out2.elements(), 1234.5f));  // nothing left from the run above
            lse2.upload(std::vector<float>(lse2.elements(), 1234.5f));
            qkv::vulkan::sequence seq(ctx);
            seq.record(call, {.q = &q,
                              .out = &out2,
                              .lse = &lse2,
                              .block_table = host.block_table,
                              .cache_seqlens = host.cache_seqlens,
                              .cu_seqlens_q = host.cu_seqlens_q});
            seq.record(call, {.q = &q,
                              .out = &out3,
                              .lse = &lse3,
                              .block_table = table,
                              .cache_seqlens = longer,
                              .cu_seqlens_q = host.cu_seqlens_q});
            seq.run();
            CHECK(out2.download() == want_bits.output);
            CHECK(lse2.download() == want_bits.lse);
            CHECK(downloaded(out3, &lse3).output == next_bits.output);
            CHECK(lse3.download() == next_bits.lse);
            qkv_test::require_clean(ctx);
        }
}

TEST_CASE("paged_call: a q8_0 pool through a sequence, equal to the host call", "[paged][paged_pool][paged_call]") {
    qkv::vulkan::context& ctx = qkv_test::gpu();
    qkv_test::owned_paged o = call_batch(16, true, 170, 64, 32);
    qkv::vulkan::kv_cache pool = device_pool(ctx, o.problem, element_type::q8_0);
    const qkv::paged_problem host = without_pool(o.problem);
    const qkv::varlen_output want = ctx.sdpa(host, pool);
    qkv::paged_problem ref = o.problem;
    ref.options.kv_type = element_type::q8_0;
    qkv_test::check_packed(want, qkv_test::device_reference(ref));
    qkv::paged_problem desc = host;
    desc.q = {};
    qkv::vulkan::paged_call call(ctx, desc, pool);
    qkv::vulkan::tensor q(ctx, rows_shape(host, host.d_qk)), out(ctx, rows_shape(host, host.d_v));
    qkv::vulkan::tensor lse(ctx, {host.q_heads, want.lse.size() / host.q_heads});
    q.upload(o.q);
    qkv::vulkan::sequence seq(ctx);
    seq.record(call, {.q = &q, .out = &out, .lse = &lse});
    seq.run();
    CHECK(out.download() == want.output);
    CHECK(lse.download() == want.lse);
    // The overflow rule over q on the device, as on the host: a q whose scores leave float32.
    qkv::paged_problem huge = host;
    std::vector<float> big = o.q;
    big[big.size() - 1] = 3e38f;  // the last row: a row past the first of each head
    huge.q = big;
    CHECK_THROWS_AS((void)ctx.sdpa(huge, pool), qkv::vulkan::numeric_overflow);
    q.upload(big);
    CHECK_THROWS_AS(call.run({.q = &q, .out = &out, .lse = &lse}), qkv::vulkan::numeric_overflow);
    qkv_test::require_clean(ctx);
}

TEST_CASE("paged_call: refusals come first, typed, nothing written", "[paged][paged_pool][paged_call]") {
    qkv::vulkan::context& ctx = qkv_test::gpu();
    qkv_test::owned_paged o = qkv_test::random_paged({.kv_lens = {20, 5}, .page_size = 8, .seed = 3});
    qkv::vulkan::kv_cache pool = device_pool(ctx, o.problem, element_type::f32);
    qkv::paged_problem desc = without_pool(o.problem);
    desc.q = {};
    qkv::vulkan::paged_call call(ctx, desc, pool);
    qkv::vulkan::tensor q(ctx, rows_shape(desc, desc.d_qk)), out(ctx, rows_shape(desc, desc.d_v));
    q.upload(o.q);
    const std::vector<float> sentinel(out.elements(), 1234.5f);
    out.upload(sentinel);
    // A page index one past the pages the pool holds: invalid_argument, nothing written.
    std::vector<std::int32_t> table = o.table;
    table[0] = static_cast<std::int32_t>(o.problem.num_pages);
    const qkv::vulkan::paged_tensors bad{.q = &q, .out = &out, .block_table = table, .cache_seqlens = o.seqlens};
    qkv_test::expect_invalid([&] { call.run(bad); }, {"block_table[0][0]", "num_pages"});
    {
        qkv::vulkan::sequence seq(ctx);
        qkv_test::expect_invalid([&] { seq.record(call, bad); }, {"block_table[0][0]", "num_pages"});
        CHECK(seq.recorded() == 0);
    }
    CHECK(out.download() == sentinel);
    // Tensors of the wrong shape, an lse the options do not ask for, a batch nowhere.
    qkv::vulkan::tensor small(ctx, {1, desc.q_heads, desc.d_v});
    qkv_test::expect_invalid([&] { call.run({.q = &q, .out = &small}); }, {"paged_call", "out"});
    qkv::vulkan::tensor lse(ctx, {desc.q_heads, 2});
    qkv_test::expect_invalid([&] { call.run({.q = &q, .out = &out, .lse = &lse}); }, {"return_lse"});
    qkv::paged_problem shapes_only = desc;
    shapes_only.block_table = {}, shapes_only.cache_seqlens = {};
    qkv::vulkan::paged_call no_step(ctx, shapes_only, pool);
    qkv_test::expect_invalid([&] { no_step.run({.q = &q, .out = &out}); }, {"no batch"});
    // The capability table's refusal, and a q given as host data.
    qkv::paged_problem p = desc;
    p.options.return_weights = true;
    qkv_test::expect_invalid([&] { qkv::vulkan::paged_call c(ctx, p, pool); }, {"paged_call", "return_weights"});
    p = desc, p.q = o.q;
    qkv_test::expect_invalid([&] { qkv::vulkan::paged_call c(ctx, p, pool); }, {"must be empty"});
    // A head width past the paged kernel's: limit_exceeded when the step is planned, nothing run.
    qkv_test::owned_paged wide =
        qkv_test::random_paged({.kv_lens = {3}, .q_heads = 1, .kv_heads = 1, .d_qk = 256, .d_v = 8, .seed = 4});
    qkv::vulkan::kv_cache wide_pool = device_pool(ctx, wide.problem, element_type::f32);
    qkv::paged_problem wd = without_pool(wide.problem);
    wd.q = {};
    expect_limit([&] { qkv::vulkan::paged_call c(ctx, wd, wide_pool); }, {"256"});
    CHECK(out.download() == sentinel);
    qkv_test::require_clean(ctx);
}

TEST_CASE("paged_call: a sequence appends a page to the pool, then decodes a step that reads it",
          "[paged][paged_pool][paged_call]") {
    // A server's step: the new rows appended at the pool's end (record_append of tensors), then the
    // batch's decode, whose table gives a sequence the new page; one submit. The decode recorded
    // after a pending append reads V's finiteness from the pool's gate word.
    qkv::vulkan::context& ctx = qkv_test::gpu();
    for (const std::size_t page_size : {1u, 16u}) {
        INFO("page_size " << page_size);
        qkv_test::owned_paged o = call_batch(page_size, false, 190 + page_size);
        qkv::vulkan::kv_cache pool = device_pool(ctx, o.problem, element_type::f32);  // room for 16 rows more
        const std::size_t Hkv = o.problem.kv_heads, E = o.problem.d_qk, Ev = o.problem.d_v, ps = page_size;
        const std::size_t pages = o.problem.num_pages;
        // The new page's rows, N(0, 1)-like values of their own, as (1, Hkv, ps, E) for the append and
        // (ps, Hkv, E) page rows for the reference.
        std::vector<float> k_new(Hkv * ps * E), v_new(Hkv * ps * Ev);
        for (std::size_t i = 0; i < k_new.size(); ++i) k_new[i] = std::sin(0.37f * static_cast<float>(i) + 1.0f);
        for (std::size_t i = 0; i < v_new.size(); ++i) v_new[i] = std::cos(0.53f * static_cast<float>(i) + 2.0f);
        std::vector<float> k_pages(o.k_pages), v_pages(o.v_pages);
        for (std::size_t n = 0; n < ps; ++n)
            for (std::size_t h = 0; h < Hkv; ++h) {
                for (std::size_t e = 0; e < E; ++e) k_pages.push_back(k_new[(h * ps + n) * E + e]);
                for (std::size_t e = 0; e < Ev; ++e) v_pages.push_back(v_new[(h * ps + n) * Ev + e]);
            }
        // Sequence 4 (no keys so far) gets the new page, all its rows.
        std::vector<std::int32_t> lens = o.seqlens, table = o.table;
        lens[4] = static_cast<std::int32_t>(ps);
        table[4 * o.problem.max_pages] = static_cast<std::int32_t>(pages);
        qkv::paged_problem ref = o.problem;
        ref.k_pages = k_pages, ref.v_pages = v_pages, ref.num_pages = pages + 1;
        ref.cache_seqlens = lens, ref.block_table = table;

        qkv::paged_problem desc = without_pool(o.problem);
        desc.q = {}, desc.block_table = {}, desc.cache_seqlens = {};
        qkv::vulkan::paged_call call(ctx, desc, pool);
        qkv::vulkan::tensor q(ctx, rows_shape(o.problem, E)), out(ctx, rows_shape(o.problem, Ev));
        const std::size_t total_q = o.seqlens.size() * o.problem.q_len;
        qkv::vulkan::tensor lse(ctx, {o.problem.q_heads, total_q});
        qkv::vulkan::tensor tk(ctx, {1, Hkv, ps, E}), tv(ctx, {1, Hkv, ps, Ev});
        q.upload(o.q), tk.upload(k_new), tv.upload(v_new);
        qkv::vulkan::sequence seq(ctx);
        seq.record_append(pool, tk, tv, ps);
        seq.record(call, {.q = &q, .out = &out, .lse = &lse, .block_table = table, .cache_seqlens = lens});
        seq.run();
        CHECK(pool.size() == (pages + 1) * ps);
        qkv::paged_problem host = without_pool(ref);
        const qkv::varlen_output same = ctx.sdpa(host, pool);
        qkv_test::check_packed(same, qkv_test::device_reference(ref));
        const qkv::varlen_output got = downloaded(out, &lse);
        qkv_test::check_packed(got, qkv_test::device_reference(ref));
        CHECK(got.output == same.output);  // the gated kernel took the finite values' path
        CHECK(got.lse == same.lse);
        qkv_test::require_clean(ctx);
    }
}

namespace {

/// The tensors of a paged_call step that appends: q, k_new and v_new uploaded from `o` (k_new and
/// v_new of the pool's type), out and lse to write.
struct append_tensors {
    qkv::vulkan::tensor q, k_new, v_new, out, lse;
    append_tensors(qkv::vulkan::context& ctx, const qkv_test::owned_paged& o, element_type type) {
        const qkv::paged_problem& p = o.problem;
        const std::size_t B = o.seqlens.size();
        q = qkv::vulkan::tensor(ctx, rows_shape(p, p.d_qk));
        out = qkv::vulkan::tensor(ctx, rows_shape(p, p.d_v));
        lse = qkv::vulkan::tensor(ctx, {p.q_heads, out.elements() / (p.q_heads * p.d_v)});
        k_new = qkv::vulkan::tensor(ctx, {B, p.new_rows, p.kv_heads, p.d_qk}, type);
        v_new = qkv::vulkan::tensor(ctx, {B, p.new_rows, p.kv_heads, p.d_v}, type);
        q.upload(o.q), k_new.upload(o.k_new), v_new.upload(o.v_new);
        out.upload(std::vector<float>(out.elements(), 1234.5f));  // nothing left from an earlier run
    }
    /// The step's tensors, with its batch (`step`: the tensors give it) or the description's.
    qkv::vulkan::paged_tensors with(const qkv::paged_problem* step = nullptr) {
        qkv::vulkan::paged_tensors t{.q = &q, .out = &out, .lse = &lse, .k_new = &k_new, .v_new = &v_new};
        if (step) {
            t.block_table = step->block_table, t.cache_seqlens = step->cache_seqlens;
            t.cu_seqlens_q = step->cu_seqlens_q;
            t.cache_batch_idx = step->cache_batch_idx, t.cache_leftpad = step->cache_leftpad;
        }
        return t;
    }
};

/// The bytes of the rows a q8_0 / q4_0 pool holds (its size()), K's then V's, every K/V head's.
std::vector<std::byte> held_blocks(const qkv::vulkan::kv_cache& pool) {
    const qkv::vulkan::testing::cache_bytes all = qkv::vulkan::testing::cache_blocks(pool);
    const qkv::kv_layout& l = pool.layout();
    std::vector<std::byte> held;
    for (const auto& [bytes, width] : {std::pair{&all.k, l.d_qk}, std::pair{&all.v, l.d_v}}) {
        const std::size_t row = qkv::bytes_for(l.type, width);
        REQUIRE(bytes->size() == l.kv_heads * l.capacity * row);
        for (std::size_t h = 0; h < l.kv_heads; ++h) {
            const auto first = bytes->begin() + static_cast<std::ptrdiff_t>(h * l.capacity * row);
            held.insert(held.end(), first, first + static_cast<std::ptrdiff_t>(pool.size() * row));
        }
    }
    return held;
}

/// `p` as a paged_call's description: no q, k_new or v_new (tensors), or no batch either.
qkv::paged_problem description_of(qkv::paged_problem p, bool with_batch) {
    p.q = {}, p.k_new = {}, p.v_new = {};
    if (!with_batch)
        p.block_table = {}, p.cache_seqlens = {}, p.cu_seqlens_q = {}, p.cache_batch_idx = {}, p.cache_leftpad = {};
    return p;
}

}  // namespace

TEST_CASE("paged_call: appends of device tensors, then attention, run and sequence",
          "[paged][paged_pool][paged_call][paged_append]") {
    // k_new and v_new as tensors written into the pool's pages in the call's own commands before
    // the decode reads them: page sizes 1 and 16, appends of 1 and 17 rows (crossing pages), GQA,
    // a sequence of new rows only, f32 and f16 pools; the float64 reference of
    // flash_attn_with_kvcache's definition, and the pool holding the rows afterwards.
    qkv::vulkan::context& ctx = qkv_test::gpu();
    for (const element_type type : {element_type::f32, element_type::f16})
        for (const std::size_t page_size : {1u, 16u})
            for (const std::size_t rows : {1u, 17u}) {
                if (type == element_type::f16 && page_size == 1) continue;
                INFO(qkv::to_string(type) << ", page_size " << page_size << ", " << rows << " new rows");
                qkv_test::owned_paged o = appending_problem(type, page_size, rows, 290, 17);
                o.problem.options = causal;
                const qkv::paged_problem host = without_pool(o.problem);
                std::vector<std::int32_t> lengths;
                const qkv::paged_problem after = after_append(host, lengths);
                {  // run, the batch with the tensors
                    qkv::vulkan::kv_cache pool = device_pool(ctx, o.problem, type);
                    qkv::vulkan::paged_call call(ctx, description_of(host, false), pool);
                    append_tensors t(ctx, o, type);
                    call.run(t.with(&host));
                    check_appended(downloaded(t.out, &t.lse), o.problem);
                    check_appended(ctx.sdpa(after, pool), o.problem);  // the rows stay in the pool
                }
                {  // a sequence, the batch planned once from the description
                    qkv::vulkan::kv_cache pool = device_pool(ctx, o.problem, type);
                    qkv::vulkan::paged_call call(ctx, description_of(host, true), pool);
                    append_tensors t(ctx, o, type);
                    qkv::vulkan::sequence seq(ctx);
                    seq.record(call, t.with());
                    seq.run();
                    check_appended(downloaded(t.out, &t.lse), o.problem);
                    check_appended(ctx.sdpa(after, pool), o.problem);
                }
                qkv_test::require_clean(ctx);
            }
}

TEST_CASE("paged_call: appends of q8_0 / q4_0 tensors into a pool of their type, run and sequence",
          "[paged][paged_pool][paged_call][paged_append]") {
    // k_new and v_new as ggml's blocks (the tensors quantize on upload, by qkv::quantize, as the
    // host call quantizes its rows), copied into the pages as they are: page sizes 1 and 16,
    // appends of 1 and 17 rows (crossing pages; 34- and 18-byte rows end mid-word), shuffled and
    // shared pages, GQA, a sequence of new rows only. The float64 reference reads every key and
    // value through the pool's type; the host call with the same rows gives the same bits, and the
    // pools it and the tensors wrote hold the same bytes (and read the same on every row).
    qkv::vulkan::context& ctx = qkv_test::gpu();
    for (const element_type type : {element_type::q8_0, element_type::q4_0})
        for (const std::size_t page_size : {1u, 16u})
            for (const std::size_t rows : {1u, 17u}) {
                INFO(qkv::to_string(type) << ", page_size " << page_size << ", " << rows << " new rows");
                qkv_test::owned_paged o = quantized_appending_problem(page_size, rows, 500, 41);
                o.problem.options = causal;
                const qkv::paged_problem host = without_pool(o.problem);
                qkv::paged_problem want = o.problem;
                want.options.kv_type = type;
                const auto reference = qkv_test::device_reference(want);
                // The host call: its rows quantized by qkv::quantize on the host.
                qkv::vulkan::kv_cache by_host = device_pool(ctx, o.problem, type);
                const qkv::varlen_output from_host = ctx.sdpa(host, by_host);
                qkv_test::check_packed(from_host, reference);
                // The pool's every row, and the batch after the append, as a decode reads them.
                const std::size_t held = o.problem.num_pages * page_size;
                const qkv::sdpa_problem every_row = every_row_decode(o, held);
                std::vector<std::int32_t> lengths;
                const qkv::paged_problem after = after_append(host, lengths);
                const std::vector<float> host_rows = ctx.sdpa(every_row, by_host).output;
                const std::vector<float> host_after = ctx.sdpa(after, by_host).output;
                for (const float x : host_rows) REQUIRE(std::isfinite(x));
                for (const bool sequence : {false, true}) {
                    INFO((sequence ? "a sequence, the batch in the description" : "run, the batch with the tensors"));
                    qkv::vulkan::kv_cache pool = device_pool(ctx, o.problem, type);
                    qkv::vulkan::paged_call call(ctx, description_of(host, sequence), pool);
                    append_tensors t(ctx, o, type);
                    if (sequence) {
                        qkv::vulkan::sequence seq(ctx);
                        seq.record(call, t.with());
                        seq.run();
                    } else {
                        call.run(t.with(&host));
                    }
                    const qkv::varlen_output got = downloaded(t.out, &t.lse);
                    qkv_test::check_packed(got, reference);
                    CHECK(got.output == from_host.output);
                    CHECK(got.lse == from_host.lse);
                    CHECK(ctx.sdpa(every_row, pool).output == host_rows);
                    CHECK(ctx.sdpa(after, pool).output == host_after);
                    CHECK(held_blocks(pool) == held_blocks(by_host));  // the same bytes in every row held
                    qkv_test::require_clean(ctx);
                }
            }
}

TEST_CASE("paged_call: appends into a q8_0 / q4_0 pool are refused for another type or with rotary, nothing written",
          "[paged][paged_pool][paged_call][paged_append]") {
    qkv::vulkan::context& ctx = qkv_test::gpu();
    qkv_test::owned_paged o = qkv_test::random_paged({.kv_lens = {21, 3, 40},
                                                      .q_len = 1,
                                                      .q_heads = 4,
                                                      .kv_heads = 2,
                                                      .d_qk = 32,
                                                      .d_v = 64,
                                                      .page_size = 4,
                                                      .seed = 33});
    qkv::paged_problem full = without_pool(o.problem);  // the pool as it is, every row the appends would write
    const std::vector<std::int32_t> full_lengths = o.seqlens;
    full.cache_seqlens = full_lengths;
    qkv_test::make_appends(o, 3, 5);
    o.problem.options = causal;
    const qkv::paged_problem host = without_pool(o.problem);
    qkv::vulkan::kv_cache pool = device_pool(ctx, o.problem, element_type::q8_0);
    const std::vector<float> before = ctx.sdpa(full, pool).output;
    qkv::vulkan::paged_call call(ctx, description_of(host, true), pool);
    append_tensors t(ctx, o, element_type::q8_0);
    // An f32 k_new, a q4_0 v_new: the pool's type or nothing, named.
    for (const element_type other : {element_type::f32, element_type::q4_0}) {
        INFO(qkv::to_string(other));
        qkv::vulkan::tensor k_other(ctx, t.k_new.shape(), other), v_other(ctx, t.v_new.shape(), other);
        k_other.upload(o.k_new), v_other.upload(o.v_new);
        qkv::vulkan::paged_tensors bad = t.with();
        bad.k_new = &k_other;
        qkv_test::expect_invalid([&] { call.run(bad); }, {"paged_call", "k_new", "q8_0"});
        bad = t.with(), bad.v_new = &v_other;
        {
            qkv::vulkan::sequence seq(ctx);
            qkv_test::expect_invalid([&] { seq.record(call, bad); }, {"paged_call", "v_new", "q8_0"});
            CHECK(seq.recorded() == 0);
        }
    }
    // A rotary embedding: the keys come quantized, so they cannot be turned first.
    qkv_test::make_rotary(o, 16, 64, true);
    qkv::paged_problem turned = description_of(without_pool(o.problem), true);
    qkv_test::expect_invalid([&] { qkv::vulkan::paged_call c(ctx, turned, pool); },
                             {"paged_call", "rotary", "q8_0", "quantized"});
    CHECK(ctx.sdpa(full, pool).output == before);  // nothing written
    qkv_test::require_clean(ctx);
}

TEST_CASE("paged_call: q8_0 / q4_0 appends with cache_batch_idx and cache_leftpad, the batch with the tensors",
          "[paged][paged_pool][paged_call][paged_append]") {
    // The table's rows permuted (a row no sequence reads is all -1), first keys past 0, GQA 6:3,
    // 3 new rows each: the host call's bits and the float64 reference through the pool's type.
    qkv::vulkan::context& ctx = qkv_test::gpu();
    for (const element_type type : {element_type::q8_0, element_type::q4_0}) {
        INFO(qkv::to_string(type));
        qkv_test::owned_paged o = qkv_test::random_paged({.kv_lens = {40, 9, 33, 17},
                                                          .q_len = 3,
                                                          .q_heads = 6,
                                                          .kv_heads = 3,
                                                          .d_qk = 32,
                                                          .d_v = 64,
                                                          .page_size = 16,
                                                          .seed = type == element_type::q8_0 ? 71u : 72u});
        qkv_test::make_appends(o, 3, 23);
        qkv_test::permute_table(o, {2, 4, 0, 1}, 5, {5, 0, 30, 6});
        o.problem.options = {.window_left = 4, .alibi_max_bias = 4.0f, .return_lse = true};
        const qkv::paged_problem host = without_pool(o.problem);
        qkv::paged_problem want = o.problem;
        want.options.kv_type = type;
        qkv::vulkan::kv_cache by_host = device_pool(ctx, o.problem, type);
        const qkv::varlen_output from_host = ctx.sdpa(host, by_host);
        qkv_test::check_packed(from_host, qkv_test::device_reference(want));
        qkv::vulkan::kv_cache pool = device_pool(ctx, o.problem, type);
        qkv::vulkan::paged_call call(ctx, description_of(host, false), pool);
        append_tensors t(ctx, o, type);
        call.run(t.with(&host));
        CHECK(t.out.download() == from_host.output);
        CHECK(t.lse.download() == from_host.lse);
        qkv_test::require_clean(ctx);
    }
}

TEST_CASE("paged_call: the overflow rule sees the values of q8_0 blocks appended over tensors",
          "[paged][paged_pool][paged_call][paged_append]") {
    // A q of norm 6e32 scores in float32 against the pool's keys; the same q against a new key of blocks
    // whose scale is near float16's largest (values to 8.3e6) would leave it. The new rows' values
    // reach the pool's statistics before the decode reads them: numeric_overflow, as from the host
    // call with the same rows, never a silent inf or NaN.
    qkv::vulkan::context& ctx = qkv_test::gpu();
    qkv_test::owned_paged o = qkv_test::random_paged({.kv_lens = {9, 4},
                                                      .q_len = 1,
                                                      .q_heads = 2,
                                                      .kv_heads = 1,
                                                      .d_qk = 32,
                                                      .d_v = 32,
                                                      .page_size = 4,
                                                      .seed = 61});
    qkv_test::make_appends(o, 1, 62);
    o.problem.options = causal;
    for (float& x : o.q) x *= 1e32f;
    o.problem.q = o.q;
    const qkv::paged_problem host = without_pool(o.problem);
    qkv::vulkan::kv_cache calm = device_pool(ctx, o.problem, element_type::q8_0);
    qkv::vulkan::paged_call calm_call(ctx, description_of(host, true), calm);
    append_tensors calm_t(ctx, o, element_type::q8_0);
    calm_call.run(calm_t.with());  // finite: the scale of the appended rows is 1
    for (const float x : calm_t.out.download()) REQUIRE(std::isfinite(x));
    for (float& x : o.k_new) x *= 2e6f;  // |k| up to about 8e6: q·k past float32
    o.problem.k_new = o.k_new;
    const qkv::paged_problem huge = without_pool(o.problem);
    qkv::vulkan::kv_cache by_host = device_pool(ctx, o.problem, element_type::q8_0);
    CHECK_THROWS_AS((void)ctx.sdpa(huge, by_host), qkv::vulkan::numeric_overflow);
    qkv::vulkan::kv_cache pool = device_pool(ctx, o.problem, element_type::q8_0);
    qkv::vulkan::paged_call call(ctx, description_of(huge, true), pool);
    append_tensors t(ctx, o, element_type::q8_0);
    CHECK_THROWS_AS(call.run(t.with()), qkv::vulkan::numeric_overflow);
    qkv_test::require_clean(ctx);
}

TEST_CASE("paged_call: a recorded append holds the pool until it runs; abandoned, nothing is written",
          "[paged][paged_pool][paged_call][paged_append]") {
    qkv::vulkan::context& ctx = qkv_test::gpu();
    qkv_test::owned_paged o = qkv_test::random_paged({.kv_lens = {21, 3, 40},
                                                      .q_len = 1,
                                                      .q_heads = 4,
                                                      .kv_heads = 2,
                                                      .d_qk = 5,
                                                      .d_v = 9,
                                                      .page_size = 4,
                                                      .seed = 31});
    qkv::paged_problem full = without_pool(o.problem);  // the pool as it is, every row the appends would write
    const std::vector<std::int32_t> full_lengths = o.seqlens;
    full.cache_seqlens = full_lengths;
    qkv::paged_problem full_ref = o.problem;
    full_ref.cache_seqlens = full_lengths;
    qkv_test::make_appends(o, 3, 4);
    o.problem.options = causal;
    const qkv::paged_problem host = without_pool(o.problem);
    qkv::vulkan::kv_cache pool = device_pool(ctx, o.problem, element_type::f32);
    const auto unchanged = [&] { qkv_test::check_packed(ctx.sdpa(full, pool), qkv_test::device_reference(full_ref)); };
    qkv::vulkan::paged_call call(ctx, description_of(host, true), pool);
    append_tensors t(ctx, o, element_type::f32);
    {
        qkv::vulkan::sequence seq(ctx);
        seq.record(call, t.with());
        // Until the sequence runs, the pool is its: every other use waits.
        qkv_test::expect_invalid([&] { (void)ctx.sdpa(full, pool); }, {"sequence"});
        qkv_test::expect_invalid([&] { call.run(t.with()); }, {"sequence"});
        seq.record(call, t.with());  // the same sequence may use it (another append: its rows twice)
        CHECK(seq.recorded() == 2);
    }  // destroyed, never run
    unchanged();
    // The tensors' own refusals: a k_new of another type, none at all, new rows the description
    // does not append.
    qkv::vulkan::tensor k16(ctx, t.k_new.shape(), element_type::f16);
    qkv::vulkan::paged_tensors bad = t.with();
    bad.k_new = &k16;
    qkv_test::expect_invalid([&] { call.run(bad); }, {"paged_call", "k_new"});
    bad.k_new = nullptr;
    qkv_test::expect_invalid([&] { call.run(bad); }, {"paged_call", "k_new"});
    qkv::vulkan::paged_call reader(ctx, description_of(full, true), pool);
    qkv::vulkan::paged_tensors extra = t.with();
    extra.lse = nullptr;  // `full` returns none
    qkv_test::expect_invalid([&] { reader.run(extra); }, {"new_rows is 0"});
    unchanged();
    qkv_test::require_clean(ctx);
}

TEST_CASE("paged_call: cache_batch_idx and cache_leftpad over tensors, with and without appends",
          "[paged][paged_pool][paged_call][paged_append]") {
    // The table's rows permuted (a row no sequence reads is all -1), first keys past 0, in the
    // description or with the tensors; GQA; each with 3 new rows or none.
    qkv::vulkan::context& ctx = qkv_test::gpu();
    for (const std::size_t rows : {0u, 3u}) {
        INFO(rows << " new rows");
        qkv_test::owned_paged o = qkv_test::random_paged({.kv_lens = {40, 9, 33, 17},
                                                          .q_len = 3,
                                                          .q_heads = 6,
                                                          .kv_heads = 3,
                                                          .d_qk = 20,
                                                          .d_v = 12,
                                                          .page_size = 16,
                                                          .seed = 7 + rows});
        if (rows) qkv_test::make_appends(o, rows, 22);
        qkv_test::permute_table(o, {2, 4, 0, 1}, 5, {5, 0, 30, 6});
        o.problem.options = {.window_left = 4, .alibi_max_bias = 4.0f, .return_lse = true};
        const qkv::paged_problem host = without_pool(o.problem);
        for (const bool in_description : {true, false}) {
            INFO((in_description ? "the batch in the description" : "the batch with the tensors"));
            qkv::vulkan::kv_cache pool = device_pool(ctx, o.problem, element_type::f32);
            qkv::vulkan::paged_call call(ctx, description_of(host, in_description), pool);
            qkv::vulkan::tensor q(ctx, rows_shape(host, host.d_qk)), out(ctx, rows_shape(host, host.d_v));
            qkv::vulkan::tensor lse(ctx, {host.q_heads, out.elements() / (host.q_heads * host.d_v)});
            q.upload(o.q);
            qkv::vulkan::tensor k_new, v_new;
            qkv::vulkan::paged_tensors t{.q = &q, .out = &out, .lse = &lse};
            if (rows) {
                append_tensors a(ctx, o, element_type::f32);
                k_new = std::move(a.k_new), v_new = std::move(a.v_new);
                t.k_new = &k_new, t.v_new = &v_new;
            }
            if (!in_description) {
                t.block_table = host.block_table, t.cache_seqlens = host.cache_seqlens;
                t.cache_batch_idx = host.cache_batch_idx, t.cache_leftpad = host.cache_leftpad;
            }
            qkv::vulkan::sequence seq(ctx);
            seq.record(call, t);
            seq.run();
            check_appended(downloaded(out, &lse), o.problem);
            qkv_test::require_clean(ctx);
        }
    }
}

TEST_CASE("paged_call: the fused rotary embedding of q and the new keys on the device",
          "[paged][paged_pool][paged_call][paged_append]") {
    // Interleaved and half-split, a rotary_dim short of d_qk, the causal rule (queries at their own
    // positions) and a window with ALiBi; a permuted cache_batch_idx with leftpads; f32 and f16
    // pools; GQA; the float64 reference of flash_attn_with_kvcache.
    qkv::vulkan::context& ctx = qkv_test::gpu();
    for (const bool interleaved : {true, false})
        for (const element_type type : {element_type::f32, element_type::f16}) {
            INFO((interleaved ? "rotary interleaved, " : "rotary halves, ") << qkv::to_string(type));
            qkv_test::owned_paged o = qkv_test::random_paged({.kv_lens = {40, 9, 33, 17},
                                                              .q_len = 3,
                                                              .q_heads = 6,
                                                              .kv_heads = 3,
                                                              .d_qk = 20,
                                                              .d_v = 12,
                                                              .page_size = 16,
                                                              .seed = interleaved ? 15u : 16u});
            qkv_test::make_appends(o, 3, 21);
            qkv_test::make_rotary(o, 16, 64, interleaved);
            qkv_test::permute_table(o, {2, 4, 0, 1}, 5, {5, 0, 30, 14});
            if (type == element_type::f16) {  // values an f16 pool holds exactly before they are turned
                for (std::vector<float>* x : {&o.k_pages, &o.v_pages, &o.k_new, &o.v_new})
                    *x = qkv::round_trip(element_type::f16, *x);
                o.problem.k_pages = o.k_pages, o.problem.v_pages = o.v_pages;
                o.problem.k_new = o.k_new, o.problem.v_new = o.v_new;
            }
            for (const qkv::sdpa_options& options :
                 {qkv::sdpa_options{
                      .causal = true, .alignment = qkv::causal_alignment::bottom_right, .return_lse = true},
                  qkv::sdpa_options{.window_left = 4, .alibi_max_bias = 4.0f, .return_lse = true}}) {
                o.problem.options = options;
                const qkv::paged_problem host = without_pool(o.problem);
                qkv::vulkan::kv_cache pool = device_pool(ctx, o.problem, type);
                qkv::vulkan::paged_call call(ctx, description_of(host, true), pool);
                append_tensors t(ctx, o, type);
                call.run(t.with());
                const qkv::varlen_output got = downloaded(t.out, &t.lse);
                if (type == element_type::f32) {
                    check_appended(got, o.problem);
                } else {  // the turned keys rounded to float16 in the pool: the host call's rounding
                    const qkv_test::paged_ref_result want = qkv_test::kvcache_reference(o.problem);
                    for (const float x : got.output) REQUIRE(std::isfinite(x));
                    CHECK(qkv_test::nmse(got.output, want.output) <= 1e-5);
                    qkv::vulkan::kv_cache again = device_pool(ctx, o.problem, type);
                    const qkv::varlen_output same = ctx.sdpa(host, again);
                    const std::vector<double> same_values(same.output.begin(), same.output.end());
                    CHECK(qkv_test::nmse(got.output, same_values) <= 1e-10);
                }
                qkv_test::require_clean(ctx);
            }
        }
}

namespace {

/// `table` as an i32 device tensor of (rows, max_pages).
qkv::vulkan::tensor table_tensor(qkv::vulkan::context& ctx, std::span<const std::int32_t> table,
                                 std::size_t max_pages) {
    qkv::vulkan::tensor t(ctx, {table.size() / max_pages, max_pages}, element_type::i32);
    t.upload(table);
    return t;
}

}  // namespace

TEST_CASE("paged_call: a block table on the device gives the host table's bits, and is read at each run",
          "[paged][paged_pool][paged_call]") {
    // Page sizes 1 and 16, pages shuffled and shared, GQA 6:2, lengths 0 and 1, ragged queries: the
    // table as an i32 tensor equals the same table as a span, bit for bit, and the float64
    // reference; a table written again on the device (tensor::upload) between two runs of one
    // call is the one the second run reads; a sequence replays it too.
    qkv::vulkan::context& ctx = qkv_test::gpu();
    for (const std::size_t page_size : {1u, 16u}) {
        INFO("page_size " << page_size);
        qkv_test::owned_paged o = call_batch(page_size, true, 410 + page_size);
        o.problem.cascade = false;
        qkv::vulkan::kv_cache pool = device_pool(ctx, o.problem, element_type::f32);
        const qkv::paged_problem host = without_pool(o.problem);
        const qkv::varlen_output want = ctx.sdpa(host, pool);
        qkv_test::check_packed(want, qkv_test::device_reference(o.problem));
        qkv::vulkan::tensor q(ctx, rows_shape(host, host.d_qk)), out(ctx, rows_shape(host, host.d_v));
        qkv::vulkan::tensor lse(ctx, {host.q_heads, out.elements() / (host.q_heads * host.d_v)});
        q.upload(o.q);
        qkv::vulkan::tensor table = table_tensor(ctx, host.block_table, host.max_pages);
        qkv::vulkan::paged_call call(ctx, description_of(host, false), pool);
        const qkv::vulkan::paged_tensors t{.q = &q,
                                           .out = &out,
                                           .lse = &lse,
                                           .block_table_tensor = &table,
                                           .cache_seqlens = host.cache_seqlens,
                                           .cu_seqlens_q = host.cu_seqlens_q};
        call.run(t);
        CHECK(out.download() == want.output);
        CHECK(lse.download() == want.lse);

        // Sequence 0 reads sequence 2's pages instead (it has more keys): written on the device only.
        std::vector<std::int32_t> second(host.block_table.begin(), host.block_table.end());
        std::copy_n(second.begin() + static_cast<std::ptrdiff_t>(2 * host.max_pages), host.max_pages, second.begin());
        table.upload(second);
        qkv::paged_problem changed = host, changed_ref = o.problem;
        changed.block_table = second, changed_ref.block_table = second;
        const qkv::varlen_output want2 = ctx.sdpa(changed, pool);
        qkv_test::check_packed(want2, qkv_test::device_reference(changed_ref));
        REQUIRE(want2.output != want.output);
        call.run(t);
        CHECK(out.download() == want2.output);
        CHECK(lse.download() == want2.lse);
        // The description's batch, the table as a tensor; recorded into a sequence.
        qkv::vulkan::paged_call planned(ctx, description_of(host, true), pool);
        out.upload(std::vector<float>(out.elements(), 1234.5f));
        qkv::vulkan::sequence seq(ctx);
        seq.record(planned, {.q = &q, .out = &out, .lse = &lse, .block_table_tensor = &table});
        seq.run();
        CHECK(out.download() == want2.output);
        qkv_test::require_clean(ctx);
    }
}

TEST_CASE("paged_call: a device table with cache_batch_idx, cache_leftpad and appends",
          "[paged][paged_pool][paged_call]") {
    // The table's rows permuted (a row no sequence reads is all -1: never checked), first keys past
    // 0, 3 new rows each crossing pages, GQA 6:3: the float64 reference of flash_attn_with_kvcache.
    qkv::vulkan::context& ctx = qkv_test::gpu();
    qkv_test::owned_paged o = qkv_test::random_paged({.kv_lens = {40, 9, 33, 17},
                                                      .q_len = 3,
                                                      .q_heads = 6,
                                                      .kv_heads = 3,
                                                      .d_qk = 20,
                                                      .d_v = 12,
                                                      .page_size = 16,
                                                      .seed = 431});
    qkv_test::make_appends(o, 3, 23);
    qkv_test::permute_table(o, {2, 4, 0, 1}, 5, {5, 0, 30, 6});
    o.problem.options = {.window_left = 4, .alibi_max_bias = 4.0f, .return_lse = true};
    o.problem.cascade = false;
    const qkv::paged_problem host = without_pool(o.problem);
    qkv::vulkan::kv_cache pool = device_pool(ctx, o.problem, element_type::f32);
    qkv::vulkan::paged_call call(ctx, description_of(host, false), pool);
    append_tensors a(ctx, o, element_type::f32);
    qkv::vulkan::tensor table = table_tensor(ctx, host.block_table, host.max_pages);
    qkv::vulkan::paged_tensors t = a.with(&host);
    t.block_table = {}, t.block_table_tensor = &table;
    call.run(t);
    check_appended(downloaded(a.out, &a.lse), o.problem);
    qkv_test::require_clean(ctx);
}

/// After a refused run: every pool row the appends of `o` would write is still the original one
/// (the pool read as the step would read it after its appends, against the reference without them).
void check_nothing_appended(qkv::vulkan::context& ctx, qkv::vulkan::kv_cache& pool, const qkv_test::owned_paged& o) {
    std::vector<std::int32_t> lengths;
    const qkv::paged_problem after = after_append(without_pool(o.problem), lengths);
    qkv::paged_problem original = o.problem;
    original.new_rows = 0, original.k_new = {}, original.v_new = {};
    original.cache_seqlens = lengths;
    qkv_test::check_packed(ctx.sdpa(after, pool), qkv_test::device_reference(original));
}

/// One bad device tensor of an appending step (`attach` puts it into the step's tensors): the run
/// fails naming it (`words`) and appends nothing; `repair` then rewrites the tensor on the device
/// and the same call runs, the pool holding the appended rows.
template <class Attach, class Repair>
void expect_refused_then_repaired(qkv::vulkan::context& ctx, const qkv_test::owned_paged& o, Attach&& attach,
                                  Repair&& repair, std::initializer_list<std::string> words) {
    const qkv::paged_problem host = without_pool(o.problem);
    qkv::vulkan::kv_cache pool = device_pool(ctx, o.problem, element_type::f32);
    qkv::vulkan::paged_call call(ctx, description_of(host, false), pool);
    append_tensors a(ctx, o, element_type::f32);
    qkv::vulkan::paged_tensors t = a.with(&host);
    attach(t);
    qkv_test::expect_invalid([&] { call.run(t); }, words);
    check_nothing_appended(ctx, pool, o);
    repair();
    call.run(t);
    check_appended(downloaded(a.out, &a.lse), o.problem);
    qkv_test::require_clean(ctx);
}

TEST_CASE("paged_call: a bad entry of a device table fails the run, reads nothing outside the pool, appends nothing",
          "[paged][paged_pool][paged_call][paged_append]") {
    qkv::vulkan::context& ctx = qkv_test::gpu();
    qkv_test::owned_paged o = appending_problem(element_type::f32, 16, 3, 450, 19);
    o.problem.options = causal;
    o.problem.cascade = false;
    const qkv::paged_problem host = without_pool(o.problem);
    const auto pages = static_cast<std::int32_t>(host.num_pages == 0 ? o.problem.num_pages : host.num_pages);
    // Sequence 0 (17 + 3 keys) reads and writes its second page; sequence 2 reads its first.
    for (const auto& [at, bad] :
         {std::pair{std::size_t{1}, pages}, std::pair{2 * host.max_pages, -1}, std::pair{std::size_t{1}, 1 << 30}}) {
        INFO("entry " << at << " = " << bad);
        std::vector<std::int32_t> broken(host.block_table.begin(), host.block_table.end());
        broken[at] = bad;
        qkv::vulkan::tensor table = table_tensor(ctx, broken, host.max_pages);
        expect_refused_then_repaired(
            ctx, o, [&](qkv::vulkan::paged_tensors& t) { t.block_table = {}, t.block_table_tensor = &table; },
            [&] { table.upload(host.block_table); }, {"block table", "a page index past the pool"});
    }
}

TEST_CASE("paged_call: a device table's refusals", "[paged][paged_pool][paged_call]") {
    qkv::vulkan::context& ctx = qkv_test::gpu();
    qkv_test::owned_paged o = call_batch(16, false, 470);
    qkv::vulkan::kv_cache pool = device_pool(ctx, o.problem, element_type::f32);
    const qkv::paged_problem host = without_pool(o.problem);
    qkv::vulkan::tensor q(ctx, rows_shape(host, host.d_qk)), out(ctx, rows_shape(host, host.d_v));
    q.upload(o.q);
    qkv::vulkan::tensor table = table_tensor(ctx, host.block_table, host.max_pages);
    qkv::paged_problem desc = description_of(host, false);
    desc.options.return_lse = false;
    qkv::vulkan::paged_call cascading(ctx, desc, pool);  // cascade, the default
    qkv::vulkan::paged_tensors t{
        .q = &q, .out = &out, .block_table_tensor = &table, .cache_seqlens = host.cache_seqlens};
    qkv_test::expect_invalid([&] { cascading.run(t); }, {"block_table_tensor", "cascade = false"});
    desc.cascade = false;
    qkv::vulkan::paged_call call(ctx, desc, pool);
    t.block_table = host.block_table;
    qkv_test::expect_invalid([&] { call.run(t); }, {"block_table span and a block_table_tensor"});
    t.block_table = {};
    qkv::vulkan::tensor floats(ctx, {host.cache_seqlens.size(), host.max_pages});
    t.block_table_tensor = &floats;
    qkv_test::expect_invalid([&] { call.run(t); }, {"block_table tensor", "f32", "i32"});
    qkv::vulkan::tensor short_table(ctx, {host.cache_seqlens.size() - 1, host.max_pages}, element_type::i32);
    t.block_table_tensor = &short_table;
    qkv_test::expect_invalid([&] { call.run(t); }, {"block_table tensor", "i32"});
    t.block_table_tensor = &table;
    call.run(t);  // and with the right one
    qkv_test::require_clean(ctx);
}

namespace {

/// `lengths` as an i32 device tensor of (B).
qkv::vulkan::tensor lengths_tensor(qkv::vulkan::context& ctx, std::span<const std::int32_t> lengths) {
    qkv::vulkan::tensor t(ctx, {lengths.size()}, element_type::i32);
    t.upload(lengths);
    return t;
}

/// A page of o's pool that its table does not name.
std::int32_t spare_page(const qkv_test::owned_paged& o) {
    for (std::int32_t page = 0;; ++page)
        if (std::find(o.table.begin(), o.table.end(), page) == o.table.end()) return page;
}

/// Two appends through one page: sequence 1 reads sequence 0's first `shared` pages of 16 (its
/// second page is sequence 0's with `shared` 2), 3 new rows each, so sequence 0 (18 keys) writes
/// rows 2..4 of its second page and sequence 1 (`len1` keys) rows len1 - 16 onwards of its own; a
/// third sequence of its own pages. GQA 6:2, odd widths, two queries each. The first page no
/// sequence reads (a spare) holds N(0, 1)-like values too, for a table that moves a sequence there.
qkv_test::owned_paged shared_page_appends(std::size_t len1, std::size_t shared, std::uint64_t seed) {
    qkv_test::owned_paged o = qkv_test::random_paged({.kv_lens = {21, len1 + 3, 19},
                                                      .q_len = 2,
                                                      .q_heads = 6,
                                                      .kv_heads = 2,
                                                      .d_qk = 17,
                                                      .d_v = 9,
                                                      .page_size = 16,
                                                      .shares = {{0, 0}, {0, shared}, {0, 0}},
                                                      .seed = seed});
    qkv_test::make_appends(o, 3, seed + 1);
    o.problem.options = causal;
    o.problem.cascade = false;
    const std::int32_t spare = spare_page(o);
    const std::size_t k_page = 16 * 2 * 17, v_page = 16 * 2 * 9;
    for (std::size_t i = 0; i < k_page; ++i)
        o.k_pages[static_cast<std::size_t>(spare) * k_page + i] = std::sin(0.61f * static_cast<float>(i) + 0.3f);
    for (std::size_t i = 0; i < v_page; ++i)
        o.v_pages[static_cast<std::size_t>(spare) * v_page + i] = std::cos(0.47f * static_cast<float>(i) + 0.9f);
    return o;
}

}  // namespace

TEST_CASE("paged_call: lengths on the device give the float64 reference, and are read at each run",
          "[paged][paged_pool][paged_call]") {
    // Page sizes 1 and 16, pages shuffled and shared, GQA 6:2, lengths 0 and 1 beside long ones,
    // ragged queries with every rule but the window, or one query each with the window: the lengths
    // as an i32 tensor against the float64 reference and the host lengths' call (its plan balances
    // by the lengths, this one by each table row's keys: equal up to rounding). Lengths written
    // again on the device (tensor::upload: 17, page boundaries) are the ones the next run
    // reads, whole chunks of the bound then empty; a sequence replays them with a device table.
    qkv::vulkan::context& ctx = qkv_test::gpu();
    for (const std::size_t page_size : {1u, 16u})
        for (const bool ragged : {true, false}) {
            INFO("page_size " << page_size << (ragged ? ", ragged" : ", a window"));
            qkv_test::owned_paged o = call_batch(page_size, ragged, 480 + page_size);
            if (!ragged) o.problem.options = every;
            o.problem.cascade = false;
            qkv::vulkan::kv_cache pool = device_pool(ctx, o.problem, element_type::f32);
            const qkv::paged_problem host = without_pool(o.problem);
            const qkv::varlen_output host_lengths = ctx.sdpa(host, pool);
            qkv::vulkan::tensor q(ctx, rows_shape(host, host.d_qk)), out(ctx, rows_shape(host, host.d_v));
            qkv::vulkan::tensor lse(ctx, {host.q_heads, out.elements() / (host.q_heads * host.d_v)});
            q.upload(o.q);
            qkv::vulkan::tensor lengths = lengths_tensor(ctx, host.cache_seqlens);
            qkv::vulkan::paged_call call(ctx, description_of(host, false), pool);
            const qkv::vulkan::paged_tensors t{.q = &q,
                                               .out = &out,
                                               .lse = &lse,
                                               .block_table = host.block_table,
                                               .cache_seqlens_tensor = &lengths,
                                               .cu_seqlens_q = host.cu_seqlens_q};
            call.run(t);
            const qkv::varlen_output got = downloaded(out, &lse);
            qkv_test::check_packed(got, qkv_test::device_reference(o.problem));
            const std::vector<double> same(host_lengths.output.begin(), host_lengths.output.end());
            CHECK(qkv_test::nmse(got.output, same) <= 1e-10);

            // Shorter lengths, written on the device only: 17 and 16 / 32 (page boundaries); sequence 4's
            // table row names no page (its length stays 0).
            const std::vector<std::int32_t> shorter{17, 16, 113, 32, 0, 1};
            lengths.upload(shorter);
            qkv::paged_problem changed = o.problem;
            changed.cache_seqlens = shorter;
            call.run(t);
            const qkv::varlen_output got2 = downloaded(out, &lse);
            qkv_test::check_packed(got2, qkv_test::device_reference(changed));
            REQUIRE(got2.output != got.output);
            // The description's batch with a device table and the device lengths, in a sequence.
            qkv::vulkan::tensor table = table_tensor(ctx, host.block_table, host.max_pages);
            qkv::vulkan::paged_call planned(ctx, description_of(host, true), pool);
            out.upload(std::vector<float>(out.elements(), 1234.5f));
            qkv::vulkan::sequence seq(ctx);
            seq.record(
                planned,
                {.q = &q, .out = &out, .lse = &lse, .block_table_tensor = &table, .cache_seqlens_tensor = &lengths});
            seq.run();
            CHECK(out.download() == got2.output);  // one plan (the bounds') and one table: the same bits
            qkv_test::require_clean(ctx);
        }
}

TEST_CASE("paged_call: lengths on the device with appends, rotary, cache_batch_idx and cache_leftpad",
          "[paged][paged_pool][paged_call][paged_append]") {
    // The new rows written at each sequence's device length (crossing pages), q and the new keys
    // turned at the positions the device lengths give (interleaved, the causal rule; a window with
    // ALiBi), the table's rows permuted with leftpads, GQA 6:3: the float64 reference of
    // flash_attn_with_kvcache; with a host table and with a device one.
    qkv::vulkan::context& ctx = qkv_test::gpu();
    for (const bool device_table : {false, true})
        for (const qkv::sdpa_options& options :
             {qkv::sdpa_options{.causal = true, .alignment = qkv::causal_alignment::bottom_right, .return_lse = true},
              qkv::sdpa_options{.window_left = 4, .alibi_max_bias = 4.0f, .return_lse = true}}) {
            INFO((device_table ? "device table" : "host table") << ", causal " << options.causal);
            qkv_test::owned_paged o = qkv_test::random_paged({.kv_lens = {40, 9, 33, 17},
                                                              .q_len = 3,
                                                              .q_heads = 6,
                                                              .kv_heads = 3,
                                                              .d_qk = 20,
                                                              .d_v = 12,
                                                              .page_size = 16,
                                                              .seed = 491});
            qkv_test::make_appends(o, 3, 24);
            qkv_test::make_rotary(o, 16, 64, true);
            qkv_test::permute_table(o, {2, 4, 0, 1}, 5, {5, 0, 30, 14});
            o.problem.options = options;
            o.problem.cascade = false;
            const qkv::paged_problem host = without_pool(o.problem);
            qkv::vulkan::kv_cache pool = device_pool(ctx, o.problem, element_type::f32);
            qkv::vulkan::paged_call call(ctx, description_of(host, false), pool);
            append_tensors a(ctx, o, element_type::f32);
            qkv::vulkan::tensor lengths = lengths_tensor(ctx, host.cache_seqlens);
            qkv::vulkan::tensor table = table_tensor(ctx, host.block_table, host.max_pages);
            qkv::vulkan::paged_tensors t = a.with(&host);
            t.cache_seqlens = {}, t.cache_seqlens_tensor = &lengths;
            if (device_table) t.block_table = {}, t.block_table_tensor = &table;
            call.run(t);
            check_appended(downloaded(a.out, &a.lse), o.problem);
            qkv_test::require_clean(ctx);
        }
}

TEST_CASE("paged_call: a bad device length fails the run, reads nothing outside the pool, appends nothing",
          "[paged][paged_pool][paged_call][paged_append]") {
    qkv::vulkan::context& ctx = qkv_test::gpu();
    qkv_test::owned_paged o = appending_problem(element_type::f32, 16, 3, 495, 29);
    o.problem.options = causal;
    o.problem.cascade = false;
    const qkv::paged_problem host = without_pool(o.problem);
    const auto capacity = static_cast<std::int32_t>(host.max_pages * host.page_size);
    // Negative; one past the table row's keys less the new rows; far past it.
    for (const auto& [at, bad] : {std::pair{std::size_t{0}, -1}, std::pair{std::size_t{2}, capacity - 2},
                                  std::pair{std::size_t{1}, std::numeric_limits<std::int32_t>::max()}}) {
        INFO("cache_seqlens[" << at << "] = " << bad);
        std::vector<std::int32_t> broken(host.cache_seqlens.begin(), host.cache_seqlens.end());
        broken[at] = bad;
        qkv::vulkan::tensor lengths = lengths_tensor(ctx, broken);
        expect_refused_then_repaired(
            ctx, o, [&](qkv::vulkan::paged_tensors& t) { t.cache_seqlens = {}, t.cache_seqlens_tensor = &lengths; },
            [&] { lengths.upload(host.cache_seqlens); }, {"cache_seqlens tensor", "no row was appended"});
    }
}

TEST_CASE("paged_call: device lengths' refusals", "[paged][paged_pool][paged_call]") {
    qkv::vulkan::context& ctx = qkv_test::gpu();
    qkv_test::owned_paged o = call_batch(16, false, 497);
    qkv::vulkan::kv_cache pool = device_pool(ctx, o.problem, element_type::f32);
    const qkv::paged_problem host = without_pool(o.problem);
    qkv::vulkan::tensor q(ctx, rows_shape(host, host.d_qk)), out(ctx, rows_shape(host, host.d_v));
    q.upload(o.q);
    qkv::vulkan::tensor lengths = lengths_tensor(ctx, host.cache_seqlens);
    qkv::paged_problem desc = description_of(host, false);
    desc.options.return_lse = false;
    qkv::vulkan::paged_call cascading(ctx, desc, pool);  // cascade, the default
    qkv::vulkan::paged_tensors t{
        .q = &q, .out = &out, .block_table = host.block_table, .cache_seqlens_tensor = &lengths};
    qkv_test::expect_invalid([&] { cascading.run(t); }, {"cache_seqlens_tensor", "cascade = false"});
    desc.cascade = false;
    qkv::vulkan::paged_call call(ctx, desc, pool);
    t.cache_seqlens = host.cache_seqlens;
    qkv_test::expect_invalid([&] { call.run(t); }, {"cache_seqlens span and a cache_seqlens_tensor"});
    t.cache_seqlens = {};
    qkv::vulkan::tensor floats(ctx, {host.cache_seqlens.size()});
    t.cache_seqlens_tensor = &floats;
    qkv_test::expect_invalid([&] { call.run(t); }, {"cache_seqlens tensor", "f32", "i32"});
    qkv::vulkan::tensor two_d(ctx, {host.cache_seqlens.size(), 1}, element_type::i32);
    t.cache_seqlens_tensor = &two_d;
    qkv_test::expect_invalid([&] { call.run(t); }, {"cache_seqlens tensor"});
    qkv::vulkan::tensor fewer(ctx, {host.cache_seqlens.size() - 1}, element_type::i32);
    t.cache_seqlens_tensor = &fewer;
    qkv_test::expect_invalid([&] { call.run(t); }, {"block_table"});  // B from the lengths: the table is not B rows
    t.cache_seqlens_tensor = &lengths;
    call.run(t);  // and with the right one
    qkv_test::require_clean(ctx);
}

TEST_CASE("paged_call: two appends into one pool row through a device table fail the run and write nothing",
          "[paged][paged_pool][paged_call][paged_append]") {
    // The device's counterpart of the host's refusal: sequences 0 and 1 name one page in their
    // table rows and their new rows meet at rows 2 and 3 of it. As a span the host refuses the
    // table; as a tensor (or with the lengths as a tensor) the run fails after the device saw it,
    // naming the page and row, with the pool's rows unchanged (the other sequences' appends are not
    // written either); the same table fixed on the device (sequence 1's second page moved to a
    // spare) then runs, as the float64 reference of flash_attn_with_kvcache says. A sequence
    // replays the refusal.
    qkv::vulkan::context& ctx = qkv_test::gpu();
    qkv_test::owned_paged o = shared_page_appends(17, 2, 480);
    const qkv::paged_problem host = without_pool(o.problem);
    const std::int32_t page = o.table[1];  // sequence 0's second page, sequence 1's too
    REQUIRE(o.table[host.max_pages + 1] == page);
    qkv::vulkan::kv_cache pool = device_pool(ctx, o.problem, element_type::f32);
    qkv::vulkan::paged_call call(ctx, description_of(host, false), pool);
    append_tensors a(ctx, o, element_type::f32);
    qkv_test::expect_invalid([&] { call.run(a.with(&host)); },
                             {"same row of the pool", "appends must not share a row"});
    qkv::vulkan::tensor table = table_tensor(ctx, host.block_table, host.max_pages);
    qkv::vulkan::paged_tensors t = a.with(&host);
    t.block_table = {}, t.block_table_tensor = &table;
    qkv_test::expect_invalid([&] { call.run(t); }, {"block table", "found on the device", "same row of the pool",
                                                    "(page " + std::to_string(page) + ", row 3",
                                                    "appends must not share a row", "no row was appended"});
    check_nothing_appended(ctx, pool, o);
    {  // through a sequence: the same refusal when it runs, and still nothing written
        qkv::vulkan::sequence seq(ctx);
        seq.record(call, t);
        qkv_test::expect_invalid([&] { seq.run(); }, {"block table", "same row of the pool"});
        check_nothing_appended(ctx, pool, o);
    }
    {  // the table as a span and the lengths on the device: the host cannot see the rows either
        qkv::vulkan::tensor device_lengths = lengths_tensor(ctx, host.cache_seqlens);
        qkv::vulkan::paged_tensors by_lengths = a.with(&host);
        by_lengths.cache_seqlens = {}, by_lengths.cache_seqlens_tensor = &device_lengths;
        qkv_test::expect_invalid([&] { call.run(by_lengths); },
                                 {"found on the device", "same row of the pool", "row 3", "no row was appended"});
        check_nothing_appended(ctx, pool, o);
    }
    // Fixed on the device: sequence 1's second page is a spare one (its rows there the spare's).
    std::vector<std::int32_t> fixed(o.table);
    fixed[host.max_pages + 1] = spare_page(o);
    table.upload(fixed);
    call.run(t);
    qkv::paged_problem want = o.problem;
    want.block_table = fixed;
    check_appended(downloaded(a.out, &a.lse), want);
    qkv_test::require_clean(ctx);
}

TEST_CASE("paged_call: appends into one page through a device table at other rows, or past a shared prefix, run",
          "[paged][paged_pool][paged_call][paged_append]") {
    // What the host allows is accepted on the device: two sequences appending to one page at rows
    // 2..4 and 7..9 (each reading the other's new rows: append, then attend), and a prefix page
    // both read with the appends in pages of their own; the float64 reference, and the bits of the
    // same step with the table as a span. Run, and recorded into a sequence.
    qkv::vulkan::context& ctx = qkv_test::gpu();
    for (const std::size_t shared : {2u, 1u}) {
        INFO(shared << " shared pages");
        qkv_test::owned_paged o = shared_page_appends(23, shared, 490 + shared);
        const qkv::paged_problem host = without_pool(o.problem);
        REQUIRE((o.table[1] == o.table[host.max_pages + 1]) == (shared == 2));
        qkv::varlen_output spans;
        {
            qkv::vulkan::kv_cache pool = device_pool(ctx, o.problem, element_type::f32);
            qkv::vulkan::paged_call call(ctx, description_of(host, false), pool);
            append_tensors a(ctx, o, element_type::f32);
            call.run(a.with(&host));
            spans = downloaded(a.out, &a.lse);
            check_appended(spans, o.problem);
        }
        for (const bool sequence : {false, true}) {
            INFO((sequence ? "sequence" : "run"));
            qkv::vulkan::kv_cache pool = device_pool(ctx, o.problem, element_type::f32);
            qkv::vulkan::paged_call call(ctx, description_of(host, false), pool);
            append_tensors a(ctx, o, element_type::f32);
            qkv::vulkan::tensor table = table_tensor(ctx, host.block_table, host.max_pages);
            qkv::vulkan::paged_tensors t = a.with(&host);
            t.block_table = {}, t.block_table_tensor = &table;
            if (sequence) {
                qkv::vulkan::sequence seq(ctx);
                seq.record(call, t);
                seq.run();
            } else {
                call.run(t);
            }
            const qkv::varlen_output got = downloaded(a.out, &a.lse);
            check_appended(got, o.problem);
            CHECK(got.output == spans.output);
            CHECK(got.lse == spans.lse);
            std::vector<std::int32_t> lengths;
            check_appended(ctx.sdpa(after_append(host, lengths), pool), o.problem);  // the rows are the pool's
        }
        qkv_test::require_clean(ctx);
    }
}
