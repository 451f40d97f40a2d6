// The Vulkan entry points against the capability table (qkv/runtime/capabilities.hpp): what the
// table says they take, they compute (against the float64 CPU backend), over device tensors, in
// sequences and recordings too: the log-sum-exp and the weights into tensors, K and V as q8_0 /
// q4_0 (or of another type than q) tensors, a quantized cache decoded and appended from tensors;
// and what the table refuses, each refuses with its reason. Every entry point of the table has a
// runner here, or is named as tested elsewhere (docs/architecture.md, "How to add an entry
// point"). Validation layer on.
#include <qkv/runtime/capabilities.hpp>
#include <qkv/runtime/cpu.hpp>
#include <qkv/vulkan/runtime.hpp>

#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/gpu.hpp"
#include "support/sdpa_problems.hpp"

using qkv::element_type;
using qkv::entry_point;
using qkv_test::require_clean;

namespace {

double nmse(const std::vector<float>& got, const std::vector<double>& want) {
    REQUIRE(got.size() == want.size());
    double num = 0, den = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
        if (std::isinf(want[i])) {  // an lse of a row with no key: -inf on both sides
            CHECK(got[i] == static_cast<float>(want[i]));
            continue;
        }
        REQUIRE(std::isfinite(got[i]));
        num += (got[i] - want[i]) * (got[i] - want[i]);
        den += want[i] * want[i];
    }
    return den > 0 ? num / den : num;
}

/// A problem with every rule on: GQA 2, causal bottom-right, a window, softcap, ALiBi, sinks.
qkv_test::owned_sdpa every_rule(std::size_t q_len, std::size_t kv_len, std::size_t d, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    qkv_test::owned_sdpa o = qkv_test::random_sdpa(
        {.shape = {.batch = 1, .q_heads = 4, .kv_heads = 2, .q_len = q_len, .kv_len = kv_len, .d_qk = d, .d_v = d}},
        rng);
    o.sinks = {0.25f, -0.5f, 1.0f, -std::numeric_limits<float>::infinity()};
    o.problem.sinks = o.sinks;
    o.problem.options = {.causal = true,
                         .alignment = qkv::causal_alignment::bottom_right,
                         .window_left = static_cast<std::int64_t>(kv_len / 2),
                         .window_right = 0,
                         .softcap = 20.0f,
                         .alibi_max_bias = 4.0f};
    return o;
}

/// The tensor of `values` in `type`, of `shape`.
qkv::vulkan::tensor uploaded(qkv::vulkan::context& ctx, std::vector<std::size_t> shape,
                             const std::vector<float>& values, element_type type = element_type::f32) {
    qkv::vulkan::tensor t(ctx, std::move(shape), type);
    t.upload(values);
    return t;
}

/// sdpa_call over tensors of the types the options say (q: precision's; k, v: stored_kv_type),
/// with lse and weights tensors where asked, run or recorded in a sequence; against the CPU.
void check_over_tensors(qkv::vulkan::context& ctx, qkv_test::owned_sdpa& o, bool in_sequence) {
    const qkv::sdpa_problem& p = o.problem;
    const qkv::sdpa_shape& s = p.shape;
    // The reference of the values as stored: K and V by kv_type (the CPU backend's rule), q
    // through float16 where the precision stores it so.
    qkv::sdpa_problem stored = p;
    const std::vector<float> q16 = qkv::round_trip(element_type::f16, o.q);
    if (p.options.precision == qkv::precision::fp16) stored.q = q16;
    const qkv::sdpa_output_f64 want = qkv::cpu::sdpa_f64(stored);
    qkv::sdpa_problem desc = p;
    desc.q = {}, desc.k = {}, desc.v = {};
    qkv::vulkan::sdpa_call call(ctx, desc);
    const element_type q_type = p.options.precision == qkv::precision::fp16 ? element_type::f16 : element_type::f32;
    const element_type kv_type = qkv::stored_kv_type(p.options);
    qkv::vulkan::tensor q = uploaded(ctx, {s.batch, s.q_heads, s.q_len, s.d_qk}, o.q, q_type);
    qkv::vulkan::tensor k = uploaded(ctx, {s.batch, s.kv_heads, s.kv_len, s.d_qk}, o.k, kv_type);
    qkv::vulkan::tensor v = uploaded(ctx, {s.batch, s.kv_heads, s.kv_len, s.d_v}, o.v, kv_type);
    qkv::vulkan::tensor out(ctx, {s.batch, s.q_heads, s.q_len, s.d_v}), lse, weights;
    if (p.options.return_lse) lse = qkv::vulkan::tensor(ctx, {s.batch, s.q_heads, s.q_len});
    if (p.options.return_weights) weights = qkv::vulkan::tensor(ctx, {s.batch, s.q_heads, s.q_len, s.kv_len});
    const qkv::vulkan::sdpa_tensors t{
        .q = &q, .k = &k, .v = &v, .out = &out, .lse = lse ? &lse : nullptr, .weights = weights ? &weights : nullptr};
    if (in_sequence) {
        qkv::vulkan::sequence seq(ctx);
        seq.record(call, t);
        seq.run();
    } else {
        call.run(t);
    }
    const double tol = 1e-9;
    CHECK(nmse(out.download(), want.output) <= tol);
    if (lse) CHECK(nmse(lse.download(), want.lse) <= tol);
    if (weights) CHECK(nmse(weights.download(), want.weights) <= tol);
    require_clean(ctx);
}

}  // namespace

TEST_CASE("capabilities: lse and weights over tensors, run and in a sequence, both routes", "[capabilities][tensor]") {
    qkv::vulkan::context& ctx = qkv_test::gpu();
    for (const std::size_t S : {113u, 1500u}) {  // fused, decode
        INFO("kv_len " << S);
        qkv_test::owned_sdpa o = every_rule(S > 1000 ? 2 : 17, S, 32, 60 + S);
        o.problem.options.return_lse = true;
        check_over_tensors(ctx, o, false);
        check_over_tensors(ctx, o, true);
    }
    qkv_test::owned_sdpa w = every_rule(17, 113, 32, 61);
    w.problem.options.return_weights = true;
    w.problem.options.return_lse = true;
    check_over_tensors(ctx, w, false);
}

TEST_CASE("capabilities: quantized K/V tensors, and K/V of another type than q, over tensors",
          "[capabilities][tensor]") {
    qkv::vulkan::context& ctx = qkv_test::gpu();
    for (const std::size_t S : {113u, 1500u})
        for (const element_type t : {element_type::q8_0, element_type::q4_0}) {
            INFO("kv_len " << S << ", " << qkv::to_string(t));
            qkv_test::owned_sdpa o = every_rule(S > 1000 ? 1 : 17, S, 32, 70 + S);
            o.problem.options.kv_type = t;
            o.problem.options.return_lse = true;
            check_over_tensors(ctx, o, S > 1000);
        }
    // fp16 q with f32 K/V, and fp32 q with f16 K/V: each read as it is stored.
    for (const auto& [precision, kv] :
         {std::pair{qkv::precision::fp16, element_type::f32}, std::pair{qkv::precision::fp32, element_type::f16}})
        for (const std::size_t S : {113u, 1500u}) {
            INFO("kv_len " << S << ", K/V " << qkv::to_string(kv));
            qkv_test::owned_sdpa o = every_rule(S > 1000 ? 2 : 17, S, 32, 80 + S);
            o.problem.options.precision = precision;
            o.problem.options.kv_type = kv;
            check_over_tensors(ctx, o, false);
        }
}

TEST_CASE("capabilities: a quantized cache decoded over tensors and appended from tensors, in a sequence",
          "[capabilities][tensor][cache]") {
    qkv::vulkan::context& ctx = qkv_test::gpu();
    for (const element_type t : {element_type::q8_0, element_type::q4_0}) {
        INFO(qkv::to_string(t));
        const std::size_t S = 1100, first = 700;
        qkv_test::owned_sdpa o = every_rule(1, S, 32, 90);
        o.problem.options.return_lse = true;
        o.problem.options.kv_type = t;
        const qkv::sdpa_output_f64 want = qkv::cpu::sdpa_f64(o.problem);
        qkv::vulkan::kv_cache cache(ctx, {.batch = 1, .kv_heads = 2, .capacity = S, .d_qk = 32, .d_v = 32, .type = t});
        // The first rows from the host; the rest as t tensors, appended in a sequence with the decode.
        const auto rows = [&](const std::vector<float>& x, std::size_t from, std::size_t to) {
            std::vector<float> r;
            for (std::size_t z = 0; z < 2; ++z)
                r.insert(r.end(), x.begin() + static_cast<std::ptrdiff_t>((z * S + from) * 32),
                         x.begin() + static_cast<std::ptrdiff_t>((z * S + to) * 32));
            return r;
        };
        cache.append(rows(o.k, 0, first), rows(o.v, 0, first), first);
        qkv::vulkan::tensor k = uploaded(ctx, {1, 2, S - first, 32}, rows(o.k, first, S), t);
        qkv::vulkan::tensor v = uploaded(ctx, {1, 2, S - first, 32}, rows(o.v, first, S), t);
        qkv::sdpa_problem desc = o.problem;
        desc.q = {}, desc.k = {}, desc.v = {};
        desc.shape.kv_len = 0;  // the cache's size when it runs
        qkv::vulkan::sdpa_call call(ctx, desc, cache);
        qkv::vulkan::tensor q = uploaded(ctx, {1, 4, 1, 32}, o.q), out(ctx, {1, 4, 1, 32}), lse(ctx, {1, 4, 1});
        qkv::vulkan::sequence seq(ctx);
        seq.record_append(cache, k, v, S - first);
        seq.record(call, {.q = &q, .out = &out, .lse = &lse});
        seq.run();
        CHECK(cache.size() == S);
        CHECK(nmse(out.download(), want.output) <= 1e-9);
        CHECK(nmse(lse.download(), want.lse) <= 1e-9);
        // The same call run, against the host path over the same cache.
        call.run({.q = &q, .out = &out, .lse = &lse});
        qkv::sdpa_problem host = o.problem;
        host.k = {}, host.v = {}, host.shape.kv_len = 0, host.options.kv_type.reset();
        const qkv::sdpa_output same = ctx.sdpa(host, cache);
        CHECK(out.download() == same.output);
        require_clean(ctx);
    }
}

TEST_CASE("capabilities: every Vulkan entry point refuses from the table what it does not take", "[capabilities]") {
    qkv::vulkan::context& ctx = qkv_test::gpu();
    qkv_test::owned_sdpa o = every_rule(1, 40, 32, 99);
    qkv::vulkan::kv_cache cache(ctx, {.batch = 1, .kv_heads = 2, .capacity = 64, .d_qk = 32, .d_v = 32});
    cache.append(std::vector<float>(2 * 40 * 32, 0.5f), std::vector<float>(2 * 40 * 32, 0.25f), 40);
    std::vector<float> x(3 * 8 * 4, 0.5f), w(4 * 4, 0.25f);
    const qkv::attention_problem attention{
        .shape = {.batch = 1, .seq = 8, .d_in = 4, .d_k = 4, .d_v = 4}, .x = x, .wq = w, .wk = w, .wv = w};
    // A runner per entry point: it calls the entry point with a problem that asks for `f`.
    using runner = std::function<void(qkv::feature)>;
    // The features the runners can ask for: every one the table refuses from these entry points.
    const std::vector<qkv::feature> askable{"return_weights", "dropout_p", "kv_type", qkv::inputs::kv_quantized,
                                            qkv::values::coopmat};
    const auto sdpa_with = [&](qkv::feature f) {
        qkv::sdpa_problem p = o.problem;
        if (f == "return_weights") p.options.return_weights = true;
        if (f == "dropout_p") p.options.dropout_p = 0.25f;
        if (f == "kv_type" || f == qkv::inputs::kv_quantized) p.options.kv_type = qkv::element_type::q8_0;
        if (f == qkv::values::coopmat) p.options.kernel = qkv::kernel_family::coopmat;
        return p;
    };
    const auto description = [](qkv::sdpa_problem p) {
        p.q = {}, p.k = {}, p.v = {};
        return p;
    };
    const qkv::sdpa_shape& s = o.problem.shape;
    const std::vector<float> d_out(s.batch * s.q_heads * s.q_len * s.d_v, 0.5f);  // the backward's, valid
    const std::map<entry_point, runner> runners{
        {entry_point::context_sdpa, [&](qkv::feature f) { (void)ctx.sdpa(sdpa_with(f)); }},
        {entry_point::context_decode,
         [&](qkv::feature f) {
             qkv::sdpa_problem p = sdpa_with(f);
             p.k = {}, p.v = {};
             (void)ctx.sdpa(p, cache);
         }},
        {entry_point::sdpa_call, [&](qkv::feature f) { qkv::vulkan::sdpa_call(ctx, description(sdpa_with(f))); }},
        {entry_point::sdpa_call_decode,
         [&](qkv::feature f) { qkv::vulkan::sdpa_call(ctx, description(sdpa_with(f)), cache); }},
        {entry_point::context_sdpa_backward,
         [&](qkv::feature f) { (void)ctx.sdpa_backward({.forward = sdpa_with(f), .d_out = d_out}); }},
        {entry_point::sdpa_backward_call,
         [&](qkv::feature f) { qkv::vulkan::sdpa_backward_call(ctx, {.forward = description(sdpa_with(f))}); }},
        {entry_point::context_attention,
         [&](qkv::feature f) {
             qkv::attention_problem p = attention;
             p.options.return_weights = f == "return_weights";
             (void)ctx.attention(p);
         }},
        {entry_point::attention_call,
         [&](qkv::feature f) {
             qkv::attention_problem p{.shape = attention.shape};
             p.options.return_weights = f == "return_weights";
             qkv::vulkan::attention_call(ctx, p);
         }},
        {entry_point::paged_call,
         [&](qkv::feature f) {
             // The cache as a pool of 5 pages of 8 rows; one sequence of 20 keys.
             const std::vector<std::int32_t> table{3, 0, 4}, lens{20};
             const qkv::paged_problem p{.q_heads = s.q_heads,
                                        .kv_heads = s.kv_heads,
                                        .d_qk = s.d_qk,
                                        .d_v = s.d_v,
                                        .page_size = 8,
                                        .max_pages = 3,
                                        .block_table = table,
                                        .cache_seqlens = lens,
                                        .options = sdpa_with(f).options};
             qkv::vulkan::paged_call(ctx, p, cache);
         }},
    };
    // The entry points tested elsewhere: the CPU backend's (tests/capabilities_test.cpp: they refuse
    // nothing), the MPI ones (tests/mpi/mpi_test.cpp), the recordings (they record the calls
    // above: the sdpa_call and attention_call rows' refusals come first, at the calls' making), and
    // the appends (of every storage type: the cases above and tests/kv_cache_test.cpp), the ragged
    // batches (tests/varlen_test.cpp, tests/varlen_vulkan_test.cpp: their refusals with the reason)
    // and the paged batches and their appends (tests/paged_test.cpp, tests/paged_vulkan_test.cpp; a
    // paged_call's recordings there and in tests/interop_test.cpp).
    const std::vector<entry_point> elsewhere{
        entry_point::cpu_sdpa,          entry_point::cpu_attention, entry_point::mpi_sdpa,
        entry_point::mpi_decode,        entry_point::mpi_append,    entry_point::sequence_record,
        entry_point::interop_record,    entry_point::cache_append,  entry_point::cache_append_tensors,
        entry_point::cpu_sdpa_backward, entry_point::cpu_varlen,    entry_point::context_varlen,
        entry_point::cpu_paged,         entry_point::context_paged, entry_point::paged_append};
    for (const entry_point e : qkv::entry_points()) {
        INFO(qkv::name_of(e));
        const bool has_runner = runners.count(e) > 0;
        CHECK((has_runner || std::count(elsewhere.begin(), elsewhere.end(), e) == 1));  // a new entry point needs one
        if (!has_runner) continue;
        for (const qkv::refusal& r : qkv::refusals()) {
            if (r.entry != e) continue;
            INFO(r.what);
            REQUIRE(std::count(askable.begin(), askable.end(), r.what) == 1);  // a runner can ask for it
            CHECK_THROWS_WITH(runners.at(e)(r.what), Catch::Matchers::Contains(std::string(r.why)));
        }
    }
    require_clean(ctx);
}
