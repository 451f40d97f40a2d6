// The stages as host code: push-constant blocks (mirroring shaders/*.glsl), tile choices per
// device, and the recording of one stage's dispatch.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "executor.hpp"
#include "flash_tiles.hpp"
#include "pipelines.hpp"
#include "qkv/vulkan/problem.hpp"

namespace qkv::vulkan::detail {

/// Mirrors the push-constant block of shaders/gemm_core.glsl, member for member.
struct gemm_push {
    group_offset offset;
    std::uint32_t M = 0, N = 0, K = 0;
    std::uint32_t heads = 1;
    std::uint32_t a_bs = 0, a_hs = 0, a_rs = 0;
    std::uint32_t b_bs = 0, b_hs = 0, b_rs = 0, b_cs = 1;
    std::uint32_t c_bs = 0, c_hs = 0, c_rs = 0;
    std::uint32_t a_off = 0, b_off = 0, c_off = 0;
    float scale = 1.0f;
    std::uint32_t flags = 0;
    std::uint32_t mask_bs = 0;
    std::uint32_t add_bs = 0;
    std::uint32_t k_begin = 0;  // set by record_gemm, per K chunk
};
static_assert(sizeof(gemm_push) == 25 * 4 && sizeof(gemm_push) <= 128, "push constants: 128 bytes are guaranteed");

/// Mirrors shaders/softmax.comp.
struct softmax_push {
    group_offset offset;
    std::uint32_t cols = 0, rows = 0;
};

/// The widest head (of Q/K and of V) the fused kernel takes; wider heads use the staged path.
inline constexpr std::uint32_t fused_max_head = 256;

// Flags of the scores and aggregate shaders (the fused kernels' are in shaders/contract/flash.h).
inline constexpr std::uint32_t flag_bias = 1;               // project
inline constexpr std::uint32_t flag_causal = 1;             // scores, aggregate
inline constexpr std::uint32_t flag_mask = 2;               // scores
inline constexpr std::uint32_t flag_additive = 4;           // scores
inline constexpr std::uint32_t flag_gemm_accumulate = 256;  // project, scores, aggregate: add to C (set by record_gemm)
inline constexpr std::uint32_t flag_gemm_partial = 512;     // project, scores, aggregate: more K chunks follow

/// The most loop iterations one invocation may run on a CPU implementation: llvmpipe ends every
/// loop of an invocation silently once 65,535 iterations have run in total (LP_MAX_TGSI_LOOP_ITERATIONS).
inline constexpr std::uint64_t cpu_loop_limit = 65535;

/// True when the matrix products use the CPU-device family (gemm_core.glsl, QKV_GEMM_CPU).
bool cpu_kernels(const device_info& info, qkv::kernel_family requested);

/// Tile shape of the matrix product (specialization constants 1..5; 0 is the workgroup size).
/// GPU family: BM x BN tiles through shared memory, BK deep, TM x TN per invocation.
/// CPU family (`cpu`): `lanes` invocations, BM rows x BN = lanes·TN columns per workgroup, the k
/// loop unrolled BK times, no shared memory (TM = BM).
struct gemm_tiles {
    std::uint32_t bm = 64, bn = 64, bk = 16, tm = 4, tn = 4;
    bool cpu = false;
    [[nodiscard]] std::uint32_t threads() const { return (bm / tm) * (bn / tn); }
    [[nodiscard]] std::uint32_t shared_bytes() const { return cpu ? 0 : (bm + bn) * bk * 4; }
    [[nodiscard]] std::vector<std::uint32_t> spec() const { return {threads(), bm, bn, bk, tm, tn}; }
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

/// Records the product over `batches` (batch x heads) grids: `shader` names the GPU-family
/// shader (project, scores, aggregate, or their _f16), `cpu` picks its CPU-family twin. One
/// dispatch per K chunk (gemm_chunk_k), with a barrier between them.
void record_gemm(executor& exec, pipeline_set& pipes, const device_info& info, bool cpu, shader_id shader,
                 std::initializer_list<binding> bindings, const gemm_push& push, std::uint32_t batches);

/// Records the in-place softmax of `rows` rows of `cols` scores (make_plan has checked the loop
/// budget: see softmax_loop_iterations).
void record_softmax(executor& exec, pipeline_set& pipes, const device_info& info, binding scores, std::uint32_t rows,
                    std::uint32_t cols);

}  // namespace qkv::vulkan::detail
