// qkv::mpi on Vulkan (lavapipe in CI), validation and synchronisation validation on: context-
// parallel sdpa against the single-process context::sdpa of the same device, both kernel families,
// position offsets on the device, device tensors, and a sharded cache of kv_caches.
#include <qkv/mpi/mpi.hpp>
#include <qkv/mpi/vulkan.hpp>
#include <qkv/runtime/cpu.hpp>
#include <qkv/vulkan/context.hpp>
#include <qkv/vulkan/kv_cache.hpp>
#include <qkv/vulkan/tensor.hpp>

#include <mpi.h>

#include <string>
#include <vector>

#include "mpi/support.hpp"
#include "support/catch.hpp"
#include "support/gpu.hpp"

namespace {

using namespace qkv_mpi_test;
using qkv::mpi::cp_mode;
using qkv::mpi::layout;

qkv::sdpa_shape shape(std::size_t hq, std::size_t hkv, std::size_t l, std::size_t s, std::size_t e, std::size_t ev) {
    return {.batch = 1, .q_heads = hq, .kv_heads = hkv, .q_len = l, .kv_len = s, .d_qk = e, .d_v = ev};
}

constexpr qkv::causal_alignment bottom_right = qkv::causal_alignment::bottom_right;

}  // namespace

TEST_CASE("position_offset on the device matches the cpu backend", "[mpi][vulkan]") {
    qkv::vulkan::context& gpu = qkv_test::gpu();
    for (const qkv::kernel_family family : {qkv::kernel_family::row_tiles, qkv::kernel_family::block_tiles})
        for (const std::int64_t offset : {-9, 0, 4, 40})
            for (const std::size_t l : {1u, 5u, 21u}) {
                INFO("family " << static_cast<int>(family) << ", offset " << offset << ", L " << l);
                spec s{shape(2, 1, l, 37, 16, 16), {.causal = true, .kernel = family, .position_offset = offset}};
                const whole_problem w(s);
                const qkv::sdpa_output want = qkv::cpu::sdpa(w.problem());
                const qkv::sdpa_output got = gpu.sdpa(w.problem());
                CHECK(nmse(got.output, want.output) <= 1e-9);
                check_lse(got.lse, want.lse, 1e-4);
            }
    qkv_test::require_clean(gpu);
}

TEST_CASE("context-parallel sdpa on Vulkan matches the single-process call", "[mpi][vulkan]") {
    const int ranks = world_size(), rank = world_rank();
    qkv::vulkan::context& gpu = qkv_test::gpu();
    qkv::mpi::vulkan_backend compute(gpu);
    using qkv::element_type;
    const spec cases[] = {
        {shape(4, 2, 9, 26, 16, 16), {.causal = true, .alignment = bottom_right}},
        {shape(2, 2, 19, 13, 16, 8), {.causal = true, .kernel = qkv::kernel_family::block_tiles}},
        {shape(4, 2, 10, 33, 32, 32),
         {.causal = true,
          .alignment = bottom_right,
          .window_left = 9,
          .window_right = 0,
          .softcap = 20,
          .alibi_max_bias = 8,
          .kv_type = element_type::q8_0},
         mask_kind::none,
         true},
        {shape(3, 3, 12, 17, 16, 16), {.window_left = 6, .window_right = 1}, mask_kind::additive_heads},
        {shape(4, 1, 1, 40, 16, 16), {.causal = true, .alignment = bottom_right, .window_left = 8, .window_right = 0}},
    };
    for (const spec& s : cases) {
        const whole_problem w(s);
        const qkv::sdpa_output reference = gpu.sdpa(w.problem());
        const qkv::sdpa_output exact = qkv::cpu::sdpa(w.problem());
        CHECK(nmse(reference.output, exact.output) <= 1e-9);
        for (const cp_mode mode : {cp_mode::ring, cp_mode::allgather}) {
            INFO("mode " << qkv::mpi::to_string(mode) << ", L " << s.shape.q_len << ", S " << s.shape.kv_len);
            whole_problem mine(s);
            const qkv::mpi::cp_output got =
                qkv::mpi::sdpa(MPI_COMM_WORLD, compute, mine.part(layout::zigzag, ranks, rank), {.mode = mode});
            const auto qs = qkv::mpi::slice_of(s.shape.q_len, ranks, rank, layout::zigzag);
            const qkv::sdpa_shape& h = s.shape;
            CHECK(nmse(got.output, qkv::mpi::take_rows<float>(reference.output, h.q_heads, h.q_len, h.d_v, qs)) <=
                  1e-9);
            check_lse(got.lse, qkv::mpi::take_rows<float>(reference.lse, h.q_heads, h.q_len, 1, qs), 1e-4);
            const qkv::mpi::cp_output again =
                qkv::mpi::sdpa(MPI_COMM_WORLD, compute, mine.part(layout::zigzag, ranks, rank), {.mode = mode});
            CHECK(same_bits(again.output, got.output));
        }
    }
    qkv_test::require_clean(gpu);
}

TEST_CASE("context-parallel sdpa over device tensors", "[mpi][vulkan]") {
    const int ranks = world_size(), rank = world_rank();
    qkv::vulkan::context& gpu = qkv_test::gpu();
    const spec s{shape(2, 2, 14, 14, 16, 16), {.causal = true}};
    whole_problem w(s);
    const qkv::sdpa_output reference = gpu.sdpa(w.problem());
    const qkv::mpi::cp_problem part = w.part(layout::zigzag, ranks, rank);
    const auto qs = qkv::mpi::slice_of(14, ranks, rank, layout::zigzag);
    const auto ks = qkv::mpi::slice_of(14, ranks, rank, layout::zigzag);
    const auto make = [&](std::size_t rows, std::span<const float> data) {
        qkv::vulkan::tensor t(gpu, {1, 2, rows, 16});
        t.upload(data);
        return t;
    };
    const qkv::vulkan::tensor q = make(qs.rows(), part.q), k = make(ks.rows(), part.k), v = make(ks.rows(), part.v);
    qkv::vulkan::tensor out(gpu, {1, 2, qs.rows(), 16});
    qkv::mpi::cp_problem description = part;
    description.q = description.k = description.v = {};
    (void)qkv::mpi::sdpa(MPI_COMM_WORLD, gpu, description, {.q = &q, .k = &k, .v = &v, .out = &out});
    CHECK(nmse(out.download(), qkv::mpi::take_rows<float>(reference.output, 2, 14, 16, qs)) <= 1e-9);
    qkv_test::require_clean(gpu);
}

TEST_CASE("a sharded cache of Vulkan kv_caches", "[mpi][vulkan][cache]") {
    const int rank = world_rank();
    qkv::vulkan::context& gpu = qkv_test::gpu();
    qkv::mpi::vulkan_backend compute(gpu);
    for (const qkv::element_type type : {qkv::element_type::f32, qkv::element_type::q8_0}) {
        INFO("type " << qkv::to_string(type));
        qkv::mpi::sharded_kv_cache cache(MPI_COMM_WORLD, compute,
                                         {.kv_heads = 2, .capacity = 6, .d_qk = 32, .d_v = 32, .type = type});
        const std::size_t total = cache.capacity();
        const whole_problem rows(spec{shape(4, 2, 2, total, 32, 32), {}});
        const std::vector<float> sinks = {0.5f, -1.0f, 2.0f, 0.0f};
        for (std::size_t size = 0; size < total;) {
            const std::size_t n = std::min<std::size_t>(4, total - size);
            const qkv::mpi::sequence_slice fresh{{{size, size + n}}};
            const std::vector<float> k = qkv::mpi::take_rows<float>(rows.k, 2, total, 32, fresh);
            const std::vector<float> v = qkv::mpi::take_rows<float>(rows.v, 2, total, 32, fresh);
            cache.append(rank == 0 ? std::span<const float>(k) : std::span<const float>(),
                         rank == 0 ? std::span<const float>(v) : std::span<const float>(), n);
            size += n;
            // The reference: one Vulkan kv_cache holding every row appended so far.
            qkv::vulkan::kv_cache one(gpu, {.kv_heads = 2, .capacity = total, .d_qk = 32, .d_v = 32, .type = type});
            const qkv::mpi::sequence_slice held{{{0, size}}};
            one.append(qkv::mpi::take_rows<float>(rows.k, 2, total, 32, held),
                       qkv::mpi::take_rows<float>(rows.v, 2, total, 32, held), size);
            const std::vector<float> q(rows.q.begin(), rows.q.begin() + 4 * 2 * 32);
            const qkv::sdpa_problem asked{.shape = shape(4, 2, 2, 0, 32, 32),
                                          .q = q,
                                          .options = {.causal = true,
                                                      .alignment = bottom_right,
                                                      .window_left = 7,
                                                      .window_right = 0,
                                                      .alibi_max_bias = 8,
                                                      .return_lse = true},
                                          .sinks = sinks};
            const qkv::sdpa_output reference = gpu.sdpa(asked, one);
            const qkv::sdpa_output got = cache.decode(asked);
            if (rank == 0) {
                CHECK(nmse(got.output, reference.output) <= 1e-9);
                check_lse(got.lse, reference.lse, 1e-4);
            }
        }
    }
    qkv_test::require_clean(gpu);
}
