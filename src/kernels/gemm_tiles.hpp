// The matrix products' and the staged softmax's per-device choices (tiles, K chunks, workgroup
// sizes): pure functions of a device description, so they are unit-tested against fake devices
// without one (tests/plan_test.cpp). make_plan (src/plan/attention_plan.cpp) makes every choice of a call.
#pragma once

#include <cstdint>
#include <vector>

#include "plan/settings.hpp"
#include "qkv/runtime/problem.hpp"
#include "qkv/vulkan/device_info.hpp"
#include "vk/shaders.hpp"

namespace qkv::vulkan::detail {

/// The most loop iterations one invocation may run on a CPU implementation: llvmpipe ends every
/// loop of an invocation silently once 65,535 iterations have run in total (LP_MAX_TGSI_LOOP_ITERATIONS).
inline constexpr std::uint64_t cpu_loop_limit = 65535;

/// True when the matrix products use the CPU-device family (gemm_core.glsl, QKV_GEMM_CPU).
bool cpu_kernels(const device_info& info, qkv::kernel_family requested);

/// Whether the cpu family's kernels (flash_cpu, sdpa_decode's cpu variant) with a workgroup of
/// `workgroup` invocations may share K and V rows by subgroupShuffle: only on a CPU device whose
/// subgroup is its SIMD vector and equals the workgroup, with shuffles in compute shaders.
/// settings::cpu_shuffle false (QKV_CPU_SHUFFLE=0) says never (for before/after measurements,
/// and to test both variants).
bool cpu_shuffle(const device_info& info, std::uint32_t workgroup, const settings& set);

/// The workgroup of the CPU family's products: one subgroup of the device's reported size (at
/// least 1, at most the device's workgroup limit).
std::uint32_t cpu_lanes(const device_info& info);

/// Tile shape of the matrix product (specialization constants GEMM_SPEC_*, contract/gemm.h).
/// GPU family: BM x BN tiles through shared memory, BK deep, TM x TN per invocation.
/// CPU family (`cpu`): `lanes` invocations, BM rows x BN = lanes·TN columns per workgroup, the k
/// loop unrolled BK times, no shared memory (TM = BM).
struct gemm_tiles {
    std::uint32_t bm = 64, bn = 64, bk = 16, tm = 4, tn = 4;
    bool cpu = false;
    [[nodiscard]] std::uint32_t threads() const { return (bm / tm) * (bn / tn); }
    [[nodiscard]] std::uint32_t shared_bytes() const { return cpu ? 0 : (bm + bn) * bk * 4; }
    [[nodiscard]] contract::gemm_spec spec() const;
    /// Loop iterations one invocation runs (an upper bound, counting every loop the shader keeps
    /// as a loop) for an inner dimension of `k`.
    [[nodiscard]] std::uint64_t loop_iterations(std::uint64_t k) const;
};

/// Tiles for an M x N product on this device: the largest of a few shapes that fits the
/// device's shared memory and workgroup limits, smaller when the product itself is small.
/// `cpu`: the CPU-device family, one subgroup per workgroup.
gemm_tiles choose_gemm_tiles(const device_info& info, std::uint64_t m, std::uint64_t n, bool cpu = false);

/// Tiles of the projection's CPU-family kernel (project.comp's rows variant): one subgroup per
/// workgroup, each lane owning TM rows, every lane sharing the BN = TN columns.
gemm_tiles choose_projection_tiles_cpu(const device_info& info, std::uint64_t m, std::uint64_t n);

/// How much of K one dispatch of the product covers: all of it, except on CPU implementations,
/// where each dispatch covers as many BK steps as keep one invocation under cpu_loop_limit.
std::uint32_t gemm_chunk_k(const device_info& info, const gemm_tiles& tiles, std::uint32_t k);

/// Loop iterations one softmax invocation runs for rows of `cols` (an upper bound).
std::uint64_t softmax_loop_iterations(std::uint32_t workgroup, std::uint32_t cols, std::uint32_t subgroup_size,
                                      bool subgroup_arithmetic);

/// Workgroup size of the softmax: a power of two no larger than the row needs or the device allows.
std::uint32_t softmax_workgroup(const device_info& info, std::uint64_t cols);

/// One matrix product of a call as the plan chose it: the shader (of the chosen family), its
/// tiles, and how much of K each dispatch covers.
struct gemm_step {
    shader_id shader = shader_id::project;
    gemm_tiles tiles;
    std::uint32_t chunk_k = 1;
    // Texel variants only (texel_gemm), as specialization constants (contract/gemm.h):
    bool vec_store = true;   ///< C's rows, offset and N multiples of 4 (GEMM_SPEC_VEC_STORE)
    bool skip_zero = false;  ///< a zero of A adds nothing, not 0·NaN (GEMM_SPEC_SKIP_ZERO; set per call)
};

/// The product C (m x n) = A (m x k) · B with `shader` (project, scores, aggregate, or their
/// _f16): its CPU-family twin where `cpu`, the projection's rows variant there, tiles and K chunk.
gemm_step plan_gemm(const device_info& info, bool cpu, shader_id shader, std::uint64_t m, std::uint64_t n,
                    std::uint32_t k);

/// The projection's texel variant (project_cpu_tx, or project_cpu_tx_f16 where `fp16`): X and
/// the packed weights through RGBA32F uniform texel buffers, each lane owning TM rows, every lane
/// sharing BN = TN columns (a multiple of 4). Where cpu_shuffle allows, the _shuffle twin, which
/// fetches the weights' texels one per lane and shares them by subgroupShuffle. The caller checks
/// that the device reads such texel buffers, that n and k are multiples of 4 and that the
/// operands start on whole texels.
gemm_step plan_projection_texels(const device_info& info, const settings& set, bool fp16, std::uint64_t m,
                                 std::uint64_t n, std::uint32_t k);

/// The staged scores (`scores`: S = Q·Kᵀ, m queries x n keys, k = head width) or aggregation
/// (`aggregate`: O = P·V, m queries x n = head width of V, k = keys) through texel views, lanes
/// owning rows, B's texels shared by shuffles: scores_cpu_tx, aggregate_cpu_tx. The caller checks
/// that the device shuffles (cpu_shuffle), reads the views' formats, and that every operand starts
/// and strides on whole texels (choose_kernels in src/plan/attention_plan.cpp).
gemm_step plan_staged_texels(const device_info& info, shader_id shader, std::uint64_t m, std::uint64_t n,
                             std::uint32_t k);

/// Whether `shader` is one of the projection's texel variants (X and W through one view of the inputs).
constexpr bool projection_texels(shader_id shader) {
    switch (shader) {
        case shader_id::project_cpu_tx:
        case shader_id::project_cpu_tx_f16:
        case shader_id::project_cpu_tx_shuffle:
        case shader_id::project_cpu_tx_shuffle_f16:
        case shader_id::project_cpu_tx_wide:
        case shader_id::project_cpu_tx_wide_f16:
            return true;
        default:
            return false;
    }
}
/// Whether `shader` is any texel variant of a matrix product (the projection's, scores_cpu_tx,
/// aggregate_cpu_tx): A and B bound as texel views, bounds and store flags as specialization constants.
constexpr bool texel_gemm(shader_id shader) {
    return projection_texels(shader) || shader == shader_id::scores_cpu_tx || shader == shader_id::aggregate_cpu_tx;
}

}  // namespace qkv::vulkan::detail
