// qkv::mpi on 1, 2 or 3 ranks (the same executable alone and under mpirun): context-parallel sdpa
// against the single-process call of the same backend, for every feature, both modes and both
// slicings; identical bits on equal runs; failures on one rank seen by all; the sharded cache.
#include <qkv/mpi/mpi.hpp>
#include <qkv/runtime/capabilities.hpp>
#include <qkv/runtime/cpu.hpp>

#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "mpi/support.hpp"
#include "support/catch.hpp"
#include "support/options.hpp"

namespace {

using namespace qkv_mpi_test;
using qkv::mpi::cp_mode;
using qkv::mpi::layout;

constexpr qkv::causal_alignment top_left = qkv::causal_alignment::top_left;
constexpr qkv::causal_alignment bottom_right = qkv::causal_alignment::bottom_right;

qkv::sdpa_shape shape(std::size_t hq, std::size_t hkv, std::size_t l, std::size_t s, std::size_t e, std::size_t ev,
                      std::size_t b = 1) {
    return {.batch = b, .q_heads = hq, .kv_heads = hkv, .q_len = l, .kv_len = s, .d_qk = e, .d_v = ev};
}

struct named_spec {
    const char* name;
    spec s;
};

/// Every feature, alone and together, on odd shapes: L != S both ways, S not divisible by the
/// ranks, rows with no key, ranks with no rows.
std::vector<named_spec> feature_cases() {
    using qkv::element_type;
    return {
        {"plain", {shape(2, 2, 17, 17, 16, 16), {}}},
        {"causal top-left, GQA 4/2", {shape(4, 2, 23, 23, 16, 8), {.causal = true}}},
        {"causal bottom-right, L < S", {shape(2, 1, 7, 29, 16, 16), {.causal = true, .alignment = bottom_right}}},
        {"causal bottom-right, L > S", {shape(2, 2, 29, 11, 8, 16), {.causal = true, .alignment = bottom_right}}},
        {"causal top-left, L < S", {shape(1, 1, 13, 31, 16, 16), {.causal = true, .alignment = top_left}}},
        {"window 5,0 causal bottom-right",
         {shape(2, 2, 19, 37, 16, 16),
          {.causal = true, .alignment = bottom_right, .window_left = 5, .window_right = 0}}},
        {"window 3,4 bidirectional", {shape(2, 2, 21, 21, 16, 16), {.window_left = 3, .window_right = 4}}},
        {"window -1,2 bottom-right", {shape(1, 1, 9, 26, 16, 16), {.alignment = bottom_right, .window_right = 2}}},
        {"ALiBi 8, Hq 6 over 3, causal bottom-right",
         {shape(6, 3, 11, 25, 16, 16), {.causal = true, .alignment = bottom_right, .alibi_max_bias = 8}}},
        {"ALiBi bidirectional, Hq 3 over 1", {shape(3, 1, 15, 15, 16, 16), {.alibi_max_bias = 4}}},
        {"softcap 10, scale 0.7, causal",
         {shape(2, 2, 16, 16, 16, 16), {.scale = 0.7f, .causal = true, .softcap = 10}}},
        {"sinks, causal top-left, L > S (empty rows)",
         {shape(4, 4, 13, 7, 16, 16), {.causal = true}, mask_kind::none, true}},
        {"bool mask (L, S) with an empty row, causal",
         {shape(2, 1, 14, 19, 16, 16), {.causal = true, .alignment = bottom_right}, mask_kind::boolean_full}},
        {"bool padding mask (B, 1, 1, S), batch 2", {shape(2, 2, 10, 23, 16, 16, 2), {}, mask_kind::boolean_rows}},
        {"additive mask (Hq, L, S) with -inf, window",
         {shape(3, 3, 12, 17, 16, 16), {.window_left = 6, .window_right = 1}, mask_kind::additive_heads}},
        {"kv f16, causal", {shape(2, 2, 15, 22, 16, 16), {.causal = true, .kv_type = element_type::f16}}},
        {"kv q8_0, causal bottom-right",
         {shape(2, 1, 9, 27, 32, 32), {.causal = true, .alignment = bottom_right, .kv_type = element_type::q8_0}}},
        {"kv q4_0, Ev 64", {shape(2, 2, 11, 20, 32, 64), {.kv_type = element_type::q4_0}}},
        {"everything: GQA, causal bottom-right, window, ALiBi, softcap, sinks, q8_0",
         {shape(4, 2, 10, 33, 32, 32),
          {.causal = true,
           .alignment = bottom_right,
           .window_left = 9,
           .window_right = 0,
           .softcap = 20,
           .alibi_max_bias = 8,
           .kv_type = element_type::q8_0},
          mask_kind::none,
          true}},
        {"decode row: L 1, window 8,0",
         {shape(4, 1, 1, 40, 16, 16),
          {.causal = true, .alignment = bottom_right, .window_left = 8, .window_right = 0}}},
        {"a position_offset of the whole", {shape(2, 2, 12, 18, 16, 16), {.causal = true, .position_offset = 3}}},
        {"tiny: L 2, S 3 (ranks without rows)", {shape(1, 1, 2, 3, 8, 8), {.causal = true, .alignment = bottom_right}}},
    };
}

/// Runs `s` context-parallel on `compute` in every mode and slicing; compares this rank's rows with
/// `reference` (the single-process call) and, on rank 0, the gathered whole.
void check_against(const spec& s, qkv::mpi::backend& compute, const qkv::sdpa_output& reference, double max_nmse,
                   double lse_tol) {
    const int ranks = world_size(), rank = world_rank();
    const qkv::sdpa_shape& h = s.shape;
    for (const cp_mode mode : {cp_mode::ring, cp_mode::allgather})
        for (const layout how : {layout::zigzag, layout::contiguous}) {
            INFO("mode " << qkv::mpi::to_string(mode) << ", slicing " << qkv::mpi::to_string(how) << ", rank " << rank
                         << " of " << ranks);
            whole_problem w(s);
            const qkv::mpi::cp_options o{.mode = mode, .slicing = how};
            const qkv::mpi::cp_output got = qkv::mpi::sdpa(MPI_COMM_WORLD, compute, w.part(how, ranks, rank), o);
            const auto qs = qkv::mpi::slice_of(h.q_len, ranks, rank, how);
            const std::vector<float> want =
                qkv::mpi::take_rows<float>(reference.output, h.batch * h.q_heads, h.q_len, h.d_v, qs);
            const std::vector<float> want_lse =
                qkv::mpi::take_rows<float>(reference.lse, h.batch * h.q_heads, h.q_len, 1, qs);
            CHECK(nmse(got.output, want) <= max_nmse);
            check_lse(got.lse, want_lse, lse_tol);
            CHECK(got.stats.rank == rank);
            CHECK(got.stats.ranks == ranks);
            // The whole, gathered on rank 0.
            const std::vector<float> whole_out =
                qkv::mpi::gather_rows(MPI_COMM_WORLD, got.output, h.batch * h.q_heads, h.q_len, h.d_v, how);
            if (rank == 0) {
                CHECK(nmse(whole_out, reference.output) <= max_nmse);
            } else {
                CHECK(whole_out.empty());
            }
            // Identical bits on an equal run.
            const qkv::mpi::cp_output again = qkv::mpi::sdpa(MPI_COMM_WORLD, compute, w.part(how, ranks, rank), o);
            CHECK(same_bits(again.output, got.output));
            CHECK(same_bits(again.lse, got.lse));
        }
}

}  // namespace

TEST_CASE("slice_of: contiguous and zigzag cover the sequence once, balanced", "[mpi][layout]") {
    for (const layout how : {layout::contiguous, layout::zigzag})
        for (int ranks = 1; ranks <= 5; ++ranks)
            for (const std::size_t n : {0u, 1u, 2u, 3u, 7u, 10u, 113u}) {
                std::vector<int> owner(n, -1);
                std::size_t most = 0, least = SIZE_MAX;
                for (int r = 0; r < ranks; ++r) {
                    const qkv::mpi::sequence_slice s = qkv::mpi::slice_of(n, ranks, r, how);
                    most = std::max(most, s.rows());
                    least = std::min(least, s.rows());
                    for (const qkv::mpi::row_range& range : s.ranges) {
                        CHECK(range.size() > 0);
                        for (std::size_t i = range.first; i < range.end; ++i) {
                            CHECK(owner[i] == -1);
                            owner[i] = r;
                        }
                    }
                }
                for (const int o : owner) CHECK(o >= 0);
                CHECK(most - least <= (how == layout::zigzag ? 2u : 1u));
            }
    const qkv::mpi::sequence_slice z = qkv::mpi::slice_of(16, 4, 1, layout::zigzag);
    REQUIRE(z.ranges.size() == 2);
    CHECK(z.ranges[0] == qkv::mpi::row_range{2, 4});
    CHECK(z.ranges[1] == qkv::mpi::row_range{12, 14});
    CHECK_THROWS_AS(qkv::mpi::slice_of(8, 0, 0, layout::zigzag), qkv::invalid_argument);
    CHECK_THROWS_AS(qkv::mpi::slice_of(8, 2, 2, layout::zigzag), qkv::invalid_argument);
    // take_rows / put_rows are inverses.
    const std::vector<float> whole = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};  // (2, 3, 2)
    const qkv::mpi::sequence_slice s{{{2, 3}, {0, 1}}};
    const std::vector<float> part = qkv::mpi::take_rows<float>(whole, 2, 3, 2, s);
    CHECK(part == std::vector<float>{4, 5, 0, 1, 10, 11, 6, 7});
    std::vector<float> back(12, -1.0f);
    qkv::mpi::put_rows<float>(part, 2, 3, 2, s, back);
    CHECK(back == std::vector<float>{0, 1, -1, -1, 4, 5, 6, 7, -1, -1, 10, 11});
    CHECK_THROWS_AS(qkv::mpi::take_rows<float>(whole, 2, 4, 2, s), qkv::invalid_argument);
}

TEST_CASE("default_timeout reads QKV_MPI_TIMEOUT", "[mpi][timeout]") {
    // The variable is not set in the test environment: 120 s.
    CHECK(qkv::mpi::default_timeout() == std::chrono::milliseconds(120000));
}

TEST_CASE("context-parallel sdpa on the cpu backend matches the single-process call", "[mpi][cpu]") {
    qkv::mpi::cpu_backend compute;
    for (const named_spec& c : feature_cases()) {
        INFO(c.name);
        const whole_problem w(c.s);
        const qkv::sdpa_output reference = qkv::cpu::sdpa(w.problem());
        check_against(c.s, compute, reference, 1e-12, 1e-5);
    }
}

TEST_CASE("ring and all-gather skip the blocks causal and the window hide", "[mpi][cpu]") {
    const int ranks = world_size(), rank = world_rank();
    qkv::mpi::cpu_backend compute;
    // A window far narrower than a rank's slice: the ring forwards each block one hop at most.
    spec s{shape(1, 1, 6 * static_cast<std::size_t>(ranks), 6 * static_cast<std::size_t>(ranks), 8, 8),
           {.causal = true, .window_left = 2, .window_right = 0}};
    whole_problem w(s);
    const qkv::mpi::cp_output o = qkv::mpi::sdpa(MPI_COMM_WORLD, compute, w.part(layout::contiguous, ranks, rank),
                                                 {.slicing = layout::contiguous});
    const std::uint64_t block = 6 * 8 * 2 * 4;  // 6 rows of K and V, f32
    CHECK(o.stats.bytes_sent == (rank + 1 < ranks ? block : 0));
    CHECK(o.stats.blocks_computed == (rank > 0 ? 2u : 1u));
    CHECK(o.stats.blocks_skipped == static_cast<std::size_t>(ranks) - o.stats.blocks_computed);
    const whole_problem ref(s);
    const qkv::sdpa_output reference = qkv::cpu::sdpa(ref.problem());
    const auto qs = qkv::mpi::slice_of(s.shape.q_len, ranks, rank, layout::contiguous);
    CHECK(nmse(o.output, qkv::mpi::take_rows<float>(reference.output, 1, s.shape.q_len, 8, qs)) <= 1e-12);
}

TEST_CASE("a failure on one rank is every rank's failure, naming the rank", "[mpi][failure]") {
    const int ranks = world_size(), rank = world_rank(), last = ranks - 1;
    qkv::mpi::cpu_backend cpu;
    const spec s{shape(2, 2, 12, 12, 8, 8), {.causal = true}};
    const std::string who = "rank " + std::to_string(last) + " of " + std::to_string(ranks) + ": ";
    SECTION("bad input on one rank") {
        whole_problem w(s);
        qkv::mpi::cp_problem p = w.part(layout::zigzag, ranks, rank);
        if (rank == last) p.q = p.q.subspan(1);
        CHECK_THROWS_AS(qkv::mpi::sdpa(MPI_COMM_WORLD, cpu, p), qkv::invalid_argument);
        CHECK_THROWS_WITH(qkv::mpi::sdpa(MPI_COMM_WORLD, cpu, p),
                          Catch::Matchers::Contains(who + "qkv::mpi::sdpa: q holds"));
    }
    SECTION("ranks that disagree on the options") {
        whole_problem w(s);
        qkv::mpi::cp_problem p = w.part(layout::zigzag, ranks, rank);
        if (rank == last && ranks > 1) p.options.softcap = 5;
        if (ranks > 1)
            CHECK_THROWS_WITH(
                qkv::mpi::sdpa(MPI_COMM_WORLD, cpu, p),
                Catch::Matchers::Contains(who + "its") && Catch::Matchers::Contains("differs from rank 0's"));
    }
    SECTION("ranks whose whole inputs differ (their checksums do)") {
        // Each rank's whole K, one value of it changed on the last rank (as two files of the same
        // name and shape, other bytes): the slices alone could not tell, the checksum does.
        whole_problem w(s);
        if (rank == last && ranks > 1) w.k[w.k.size() - 1] += 0.5f;
        qkv::mpi::cp_problem p = w.part(layout::zigzag, ranks, rank);
        p.inputs_checksum = qkv::mpi::checksum(w.v, qkv::mpi::checksum(w.k, qkv::mpi::checksum(w.q)));
        if (ranks > 1)
            CHECK_THROWS_WITH(
                qkv::mpi::sdpa(MPI_COMM_WORLD, cpu, p),
                Catch::Matchers::Contains(who + "its") && Catch::Matchers::Contains("the whole inputs' checksum"));
        const std::vector<float> one{1.0f}, other{1.0f + 1e-7f}, zero{0.0f};
        CHECK(qkv::mpi::checksum(one) != qkv::mpi::checksum(other));
        CHECK(qkv::mpi::checksum(zero) != qkv::mpi::checksum({}));
        CHECK(qkv::mpi::checksum(one) == qkv::mpi::checksum(std::vector<float>{1.0f}));
    }
    SECTION("a backend that throws in the middle of the ring") {
        for (const cp_mode mode : {cp_mode::ring, cp_mode::allgather}) {
            faulty_backend broken(cpu, last, 2, faulty_backend::fault::throws);
            whole_problem w(s);
            try {
                (void)qkv::mpi::sdpa(MPI_COMM_WORLD, broken, w.part(layout::zigzag, ranks, rank), {.mode = mode});
                FAIL("no exception");
            } catch (const qkv::invalid_argument&) {
                FAIL("the wrong type");
            } catch (const qkv::error& e) {
                CHECK_THAT(e.what(), Catch::Matchers::Contains(who + "injected failure in block 2"));
            }
        }
    }
    SECTION("the type travels") {
        faulty_backend broken(cpu, last, 1, faulty_backend::fault::invalid);
        whole_problem w(s);
        CHECK_THROWS_AS(qkv::mpi::sdpa(MPI_COMM_WORLD, broken, w.part(layout::zigzag, ranks, rank)),
                        qkv::invalid_argument);
    }
    SECTION("return_weights is refused") {
        whole_problem w(s);
        qkv::mpi::cp_problem p = w.part(layout::zigzag, ranks, rank);
        p.options.return_weights = true;
        CHECK_THROWS_WITH(qkv::mpi::sdpa(MPI_COMM_WORLD, cpu, p), Catch::Matchers::Contains("return_weights"));
    }
    SECTION("dropout is refused, not ignored") {
        whole_problem w(s);
        qkv::mpi::cp_problem p = w.part(layout::zigzag, ranks, rank);
        p.options.dropout_p = 0.1f;
        CHECK_THROWS_WITH(qkv::mpi::sdpa(MPI_COMM_WORLD, cpu, p), Catch::Matchers::Contains("dropout"));
    }
    SECTION("agree") {
        std::exception_ptr mine;
        if (rank == last) mine = std::make_exception_ptr(qkv::invalid_argument("cannot read q.npy"));
        CHECK_THROWS_WITH(qkv::mpi::agree(MPI_COMM_WORLD, mine), who + "cannot read q.npy");
        CHECK_NOTHROW(qkv::mpi::agree(MPI_COMM_WORLD, nullptr));
    }
    // And afterwards everything works.
    whole_problem w(s);
    const qkv::sdpa_output reference = qkv::cpu::sdpa(w.problem());
    const qkv::mpi::cp_output o = qkv::mpi::sdpa(MPI_COMM_WORLD, cpu, w.part(layout::zigzag, ranks, rank));
    const auto qs = qkv::mpi::slice_of(12, ranks, rank, layout::zigzag);
    CHECK(nmse(o.output, qkv::mpi::take_rows<float>(reference.output, 2, 12, 8, qs)) <= 1e-12);
}

TEST_CASE("a failure notice sent in the next stage is kept for it by a rank still ending the agreement",
          "[mpi][failure]") {
    // A rank slow to leave the opening agreement (descheduled on a loaded machine) can find there
    // the notice another rank sent after failing in the stage that follows. It must keep it for that
    // stage and meet the others in the closing agreement; taking it for a late failure of the
    // opening one made it leave alone, the others waiting for it until their timeout. Rank 0 is
    // made that slow: its first look for notices waits until the last rank's has come.
    const int ranks = world_size(), rank = world_rank(), last = ranks - 1;
    if (ranks < 2) return;  // a notice needs another rank
    qkv::mpi::cpu_backend cpu;
    const spec s{shape(2, 2, 12, 12, 8, 8), {.causal = true}};
    const std::string who = "rank " + std::to_string(last) + " of " + std::to_string(ranks) + ": ";
    for (const cp_mode mode : {cp_mode::ring, cp_mode::allgather}) {
        INFO("mode " << qkv::mpi::to_string(mode));
        faulty_backend broken(cpu, last, 1, faulty_backend::fault::throws);  // its first block
        whole_problem w(s);
        if (rank == 0) hold_next_probe(std::chrono::seconds(20));
        CHECK_THROWS_WITH(qkv::mpi::sdpa(MPI_COMM_WORLD, broken, w.part(layout::zigzag, ranks, rank),
                                         {.mode = mode, .comm = {.timeout = std::chrono::seconds(10)}}),
                          who + "injected failure in block 1");
        hold_next_probe(std::chrono::milliseconds(0));
    }
    // Every rank is in step again.
    CHECK_NOTHROW(qkv::mpi::agree(MPI_COMM_WORLD, nullptr));
}

TEST_CASE("a rank that hangs makes the others time out, never hang", "[mpi][hang]") {
    // One timeout per process: after a timeout the ranks are no longer in step (the late rank
    // still enters calls the others have left), so the program must end (collective.hpp). The
    // mode comes from QKV_TEST_MODE (ring by default; CTest runs both).
    const int ranks = world_size(), rank = world_rank();
    if (ranks < 2) return;  // one rank waits on nobody
    const char* chosen = std::getenv("QKV_TEST_MODE");
    const cp_mode mode = chosen && std::string(chosen) == "allgather" ? cp_mode::allgather : cp_mode::ring;
    INFO("mode " << qkv::mpi::to_string(mode));
    qkv::mpi::cpu_backend cpu;
    faulty_backend slow(cpu, 1, 1, faulty_backend::fault::sleeps, std::chrono::milliseconds(3000));
    const spec s{shape(1, 1, 12, 12, 8, 8), {}};
    whole_problem w(s);
    const auto start = std::chrono::steady_clock::now();
    CHECK_THROWS_AS(qkv::mpi::sdpa(MPI_COMM_WORLD, slow, w.part(layout::zigzag, ranks, rank),
                                   {.mode = mode, .comm = {.timeout = std::chrono::milliseconds(300)}}),
                    qkv::mpi::timeout);
    const auto waited = std::chrono::steady_clock::now() - start;
    // The sleeping rank wakes after 3 s; the others give up well before.
    if (rank != 1) CHECK(waited < std::chrono::milliseconds(2500));
}

TEST_CASE("a sharded K/V cache fills the ranks in turn and decodes like one cache", "[mpi][cache]") {
    const int ranks = world_size(), rank = world_rank();
    qkv::mpi::cpu_backend cpu;
    for (const qkv::element_type type : {qkv::element_type::f32, qkv::element_type::q8_0}) {
        INFO("type " << qkv::to_string(type));
        const qkv::kv_layout cs{.batch = 1, .kv_heads = 2, .capacity = 5, .d_qk = 32, .d_v = 32, .type = type};
        qkv::mpi::sharded_kv_cache cache(MPI_COMM_WORLD, cpu, cs);
        CHECK(cache.capacity() == 5 * static_cast<std::size_t>(ranks));
        const std::size_t total = cache.capacity();
        // Every rank draws the same rows; root's are the ones read.
        const spec all{shape(4, 2, 3, total, 32, 32), {}};
        const whole_problem rows(all);
        std::size_t size = 0;
        while (size < total) {
            const std::size_t n = std::min<std::size_t>(3, total - size);
            const qkv::mpi::sequence_slice fresh{{{size, size + n}}};
            const std::vector<float> k = qkv::mpi::take_rows<float>(rows.k, 2, total, 32, fresh);
            const std::vector<float> v = qkv::mpi::take_rows<float>(rows.v, 2, total, 32, fresh);
            if (rank == 0)
                cache.append(k, v, n);
            else
                cache.append({}, {}, n);
            size += n;
            REQUIRE(cache.size() == size);
            // Fill in turn: rank r holds [5r, 5r + 5) of what is there.
            const std::size_t first = 5 * static_cast<std::size_t>(rank);
            CHECK(cache.local_rows() == qkv::mpi::row_range{first, std::max(first, std::min(size, first + 5))});
            for (const auto& [l, options] : {std::pair{std::size_t{1}, qkv::sdpa_options{}},
                                             std::pair{std::size_t{3}, qkv::sdpa_options{.causal = true,
                                                                       .alignment = bottom_right,
                                                                       .window_left = 6,
                                                                       .window_right = 0,
                                                                       .alibi_max_bias = 8,
                                                                       .return_lse = true}}}) {
                INFO("size " << size << ", L " << l);
                // The single-process reference over the rows appended so far.
                qkv::sdpa_shape hs = shape(4, 2, l, size, 32, 32);
                const std::vector<float> q(rows.q.begin(), rows.q.begin() + static_cast<std::ptrdiff_t>(4 * l * 32));
                const qkv::mpi::sequence_slice held{{{0, size}}};
                const std::vector<float> kh = qkv::mpi::take_rows<float>(rows.k, 2, total, 32, held);
                const std::vector<float> vh = qkv::mpi::take_rows<float>(rows.v, 2, total, 32, held);
                const std::vector<float> sinks = {0.5f, -1.0f, 2.0f, -std::numeric_limits<float>::infinity()};
                qkv::sdpa_problem whole{.shape = hs, .q = q, .k = kh, .v = vh, .options = options, .sinks = sinks};
                whole.options.kv_type = type;
                whole.options.return_lse = true;
                const qkv::sdpa_output reference = qkv::cpu::sdpa(whole);
                qkv::sdpa_problem asked = whole;
                asked.k = {};
                asked.v = {};
                asked.shape.kv_len = 0;
                const qkv::sdpa_output got = cache.decode(asked);
                if (rank == 0) {
                    CHECK(nmse(got.output, reference.output) <= 1e-12);
                    check_lse(got.lse, reference.lse, 1e-5);
                } else {
                    CHECK(got.output.empty());
                }
            }
        }
        // Dropout is refused (on every rank, root's refusal agreed), not ignored.
        {
            const std::vector<float> q(4 * 32, 0.5f);
            qkv::sdpa_problem dropped{.shape = shape(4, 2, 1, 0, 32, 32), .q = q};
            dropped.options.dropout_p = 0.25f;
            CHECK_THROWS_WITH(cache.decode(dropped), Catch::Matchers::Contains("dropout"));
        }
        // Full: one row more is refused on every rank, and nothing is appended.
        const std::vector<float> one(2 * 32, 1.0f);
        CHECK_THROWS_WITH(cache.append(rank == 0 ? std::span<const float>(one) : std::span<const float>(),
                                       rank == 0 ? std::span<const float>(one) : std::span<const float>(), 1),
                          Catch::Matchers::Contains("rank ") && Catch::Matchers::Contains("capacity"));
        CHECK(cache.size() == total);
    }
}

// ALiBi slopes given per head are per-head data the ranks do not receive: the sharded decode
// refuses them from the capability table, on every rank, and appends nothing.
TEST_CASE("a sharded decode refuses per-head ALiBi slopes on every rank", "[mpi][capabilities]") {
    const int ranks = world_size(), rank = world_rank();
    qkv::mpi::cpu_backend cpu;
    const std::size_t total = 2 * static_cast<std::size_t>(ranks);
    qkv::mpi::sharded_kv_cache cache(MPI_COMM_WORLD, cpu, {.kv_heads = 2, .capacity = 2, .d_qk = 32, .d_v = 32});
    const whole_problem rows({shape(2, 2, 1, total, 32, 32), {}});
    cache.append(rank == 0 ? std::span<const float>(rows.k) : std::span<const float>(),
                 rank == 0 ? std::span<const float>(rows.v) : std::span<const float>(), total);
    const std::vector<float> slopes{0.5f, 0.25f};
    qkv::sdpa_problem asked{.shape = shape(2, 2, 1, total, 32, 32), .q = rows.q};
    asked.alibi_slopes = slopes;
    CHECK_THROWS_WITH(cache.decode(asked), Catch::Matchers::Contains("alibi_slopes is not available"));
    CHECK(cache.size() == total);
}

// The option list (qkv/runtime/sdpa_options.def) reaches every rank without naming a field: the
// fingerprint the ranks compare covers every field (a rank given another value of any one fails
// every rank), and the decode step's header carries every field to the ranks that hold rows (a
// sharded decode with any field changed equals the single-process call). A field added to the
// list is tested here without an edit.
TEST_CASE("every option of the list is in the fingerprint and on the wire", "[mpi][options]") {
    const int ranks = world_size(), rank = world_rank();
    qkv::mpi::cpu_backend cpu;
    const qkv::sdpa_options base{.causal = true, .alignment = bottom_right};
    for (const qkv::option_field& f : qkv::sdpa_option_fields) {
        INFO(f.name);
        const qkv::sdpa_options changed = qkv_test::with_other(base, f);
        const bool refused = qkv::refused(qkv::entry_point::mpi_sdpa, f.name) != nullptr;
        // The fingerprint: rank 1 alone asks for the other value of the field (a field the entry
        // point refuses fails on rank 1 before the ranks compare, and so on every rank).
        if (ranks > 1) {
            whole_problem w({shape(2, 2, 6, 9, 32, 32), base});
            qkv::mpi::cp_problem mine = w.part(layout::contiguous, ranks, rank);
            mine.options = rank == 1 ? changed : base;
            CHECK_THROWS_WITH(qkv::mpi::sdpa(MPI_COMM_WORLD, cpu, mine),
                              Catch::Matchers::Contains(refused ? "not available" : "differs from rank 0's"));
        }
        // The wire: a sharded decode with the field changed, against the single-process call.
        if (refused || f.name == "kv_type") continue;  // the cache's storage is the cache's own
        const std::size_t total = 4 * static_cast<std::size_t>(ranks);
        qkv::mpi::sharded_kv_cache cache(MPI_COMM_WORLD, cpu, {.kv_heads = 2, .capacity = 4, .d_qk = 32, .d_v = 32});
        const whole_problem rows({shape(4, 2, 2, total, 32, 32), {}});
        cache.append(rank == 0 ? std::span<const float>(rows.k) : std::span<const float>(),
                     rank == 0 ? std::span<const float>(rows.v) : std::span<const float>(), total);
        qkv::sdpa_problem whole{.shape = shape(4, 2, 2, total, 32, 32), .q = rows.q, .k = rows.k, .v = rows.v};
        whole.options = changed;
        whole.options.return_lse = true;
        const qkv::sdpa_output reference = qkv::cpu::sdpa(whole);
        qkv::sdpa_problem asked = whole;
        asked.k = {}, asked.v = {};
        const qkv::sdpa_output got = cache.decode(asked);
        if (rank == 0) {
            CHECK(nmse(got.output, reference.output) <= 1e-12);
            check_lse(got.lse, reference.lse, 1e-6);
        }
    }
}
