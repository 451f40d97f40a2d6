// The plan of one attention call (context::attention): where every tensor lives on the device,
// which kernels run with which per-device parameters (tiles, K and key chunks, workgroup sizes, the
// fused kernel's family and its own plan), and the limit checks that run before any work is
// submitted. plan_attention is a pure function of the problem's shape and options (no data is
// read), a device description and the settings, so every choice is unit-tested against fake
// devices (tests/plan_test.cpp). The sdpa and decode calls have theirs in sdpa_plan.hpp.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/flash_coop_plan.hpp"
#include "kernels/flash_cpu_plan.hpp"
#include "kernels/flash_gpu_plan.hpp"
#include "kernels/flash_layout.hpp"
#include "kernels/flash_tiles.hpp"
#include "kernels/gemm_tiles.hpp"
#include "plan/settings.hpp"
#include "qkv/runtime/problem.hpp"
#include "qkv/vulkan/device_info.hpp"
#include "vk/device_desc.hpp"

namespace qkv::vulkan::detail {

/// A byte range inside a buffer.
struct range {
    std::uint64_t offset = 0, size = 0;
    [[nodiscard]] bool empty() const { return size == 0; }
};

struct plan {
    implementation impl = implementation::staged;
    bool fp16 = false;
    std::uint32_t batch = 0, seq = 0, d_in = 0, d_k = 0, d_v = 0, heads = 1, d_out = 0;
    std::uint32_t ld = 0;  ///< width of a projected Q|K|V row: 2·d_k + d_v
    bool bias = false, mask = false, additive = false, causal = false;
    bool mask_batched = false, additive_batched = false;
    float scale = 1.0f;

    // The inputs buffer: every host input, packed, each part aligned for a storage binding.
    range x, w, b, wo, bo, mask_bits, additive_mask;
    std::uint64_t inputs_bytes = 0;
    // Device-side tensors, one buffer each.
    std::uint64_t qkv_bytes = 0;     ///< batch x seq x ld, float32 or float16
    std::uint64_t scores_bytes = 0;  ///< batch x heads x seq x seq (staged only)
    std::uint64_t concat_bytes = 0;  ///< batch x seq x d_v (only with an output projection)
    std::uint64_t out_bytes = 0;     ///< batch x seq x out_width
    std::uint64_t readback_bytes = 0;
    std::uint64_t weights_bytes = 0;  ///< returned weights (0 unless requested)

    // The kernels (choose_kernels).
    kernel_family family = kernel_family::automatic;  ///< the fused kernel's family (automatic: staged)
    bool cpu_gemm = false;                            ///< the matrix products' family (QKV_GEMM_CPU)
    gemm_step project;                                ///< Q|K|V = X · [Wq|Wk|Wv] + b
    gemm_step scores, aggregate;                      ///< staged only
    gemm_step out_projection;                         ///< only with d_out
    shader_id softmax = shader_id::softmax;           ///< staged only, with softmax_workgroup invocations
    shader_id range_guard = shader_id::range_guard;   ///< after the projection (subgroup-reduced where offered)
    std::uint32_t softmax_workgroup = 0;
    std::uint32_t flash_chunk_keys = 0;  ///< fused: keys per dispatch (seq: one dispatch); staged: seq
    flash_layout layout;                 ///< fused: the kernels' view of Q|K|V and the output
    flash_cpu_plan cpu;                  ///< fused, cpu family: its tiles, texels and chunks
    flash_gpu_plan gpu;                  ///< fused, gpu family: its tiles and chunks
    flash_coop_plan coop;                ///< fused: the cooperative-matrix family's tiles and chunks, where it can run
};

/// Why the fused kernel's CPU family cannot run a call (empty: it can), and whether that is a
/// device limit (limit_exceeded) or a missing feature (unavailable). See flash_cpu.hpp.
struct family_refusal {
    std::string why;
    bool limit = false;
    bool automatic = false;  ///< the cooperative-matrix family only: `automatic` may choose it (no driver gate)
};

/// What the kernel choices need to know besides the device_info: facts derived from the device
/// description and the call (device_facts_for), as plain values.
struct device_facts {
    subgroup_control subgroups;                   ///< subgroup size control (device_desc::subgroups)
    std::uint32_t max_fused_keys = 0;             ///< settings::max_fused_keys (test hook)
    const device_info* fused_tiles_as = nullptr;  ///< settings::fused_tiles_as (test hook)
    std::uint32_t cpu_chunk_keys = 0;             ///< keys per dispatch of the CPU family (plan_flash_cpu)
    family_refusal cpu_refusal;                   ///< why the CPU family cannot run (check_flash_cpu); empty: it can
    /// Why the cooperative-matrix family cannot run (coop_refusal, which plan_attention fills in).
    family_refusal coop_refusal{"the cooperative-matrix family was not planned for this call", false, false};
    std::uint32_t coop_chunk_keys = 0;  ///< keys per dispatch of the cooperative-matrix family
    const settings* set = nullptr;      ///< tuning (cpu_shuffle, the projection's tiles); nullptr: the defaults
    /// The device reads R32G32B32A32_SFLOAT uniform texel buffers and one such view of the inputs
    /// from offset 0 through X and [Wq|Wk|Wv] fits maxTexelBufferElements (projection_view_bytes):
    /// the CPU-family projection may take its texel variant (project_cpu_tx).
    bool projection_texels = false;
    /// The device reads uniform texel buffers of Q|K|V's format (R32G32B32A32_SFLOAT, or
    /// R16G16B16A16_SFLOAT with fp16) and of R32G32B32A32_SFLOAT, and views of the whole Q|K|V and
    /// scores buffers fit maxTexelBufferElements: the CPU-family scores and aggregation may take
    /// their texel variants (scores_cpu_tx, aggregate_cpu_tx) where the device shuffles.
    bool staged_texels = false;
};

/// Bytes of the texel view of the inputs buffer that the projection's texel variant reads: from
/// offset 0 through the end of X and of the packed weights, in whole 16-byte texels.
std::uint64_t projection_view_bytes(const plan& p);

/// Which family of the fused kernel runs (run_options::kernel, sdpa_options::kernel):
///   asked for   device         runs
///   automatic   any            coopmat where it can run and coop.automatic (no driver gate), else:
///   automatic   CPU            cpu, or gpu where the cpu family cannot run here
///   automatic   GPU, other     gpu
///   cpu         any            cpu, or a typed error saying why it cannot (`refusal`)
///   gpu         any            gpu (shaders/flash.comp)
///   coopmat     any            coopmat (shaders/flash_coop.comp), or a typed error saying why it cannot (`coop`)
kernel_family choose_family(kernel_family asked, device_type type, const family_refusal& refusal,
                            const family_refusal& coop);

/// Why the cooperative-matrix family cannot run the fused call of `layout` on `desc` (check_coop),
/// and whether the automatic choice may take it; where it can, its plan in `plan`.
family_refusal coop_refusal(const device_desc& desc, const flash_layout& layout, const settings& set,
                            flash_coop_plan& plan);

/// Makes the kernel choices of `p` (laid out by make_plan) for this device: the family, tiles and
/// chunks of every product, the softmax's workgroup, the fused kernel's family and key chunks.
/// Throws limit_exceeded (too many dispatches) or unavailable (the CPU family asked for cannot run).
void choose_kernels(plan& p, const device_info& info, const device_facts& facts, kernel_family asked);

/// Lays out a validated problem. Throws limit_exceeded when a tensor is larger than
/// maxStorageBufferRange or everything together larger than the device's memory, and
/// unavailable when fp16 is asked of a device without 16-bit storage.
plan make_plan(const attention_problem& problem, const device_info& info, std::uint64_t storage_alignment);

/// The facts choose_kernels needs for `p` (laid out by make_plan, with p.cpu planned) on `desc`.
device_facts device_facts_for(const plan& p, const device_desc& desc, const settings& set);

/// The whole plan of an attention call: make_plan, the fused families' plans, choose_kernels.
/// Pure: reads the problem's shapes and options, never its data.
plan plan_attention(const attention_problem& problem, const device_desc& desc, const settings& set);

/// The fused kernels' view of the projected Q|K|V rows of `p`: head h of Q, K and V at columns
/// h·d, d_k + h·d, 2·d_k + h·dv of each row; the output's rows are d_v wide, head h at column h·dv.
flash_layout attention_layout(const plan& p);

}  // namespace qkv::vulkan::detail
