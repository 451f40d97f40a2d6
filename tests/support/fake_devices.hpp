// Fake Vulkan devices for the tests of the pure planning code (the fused kernel's tiles, the plan,
// the split-S decode plan): device descriptions as src/vk/instance.cpp would fill them in, with
// the subgroup size control a device offers, and no Vulkan device behind them. One list, so that
// every planner is checked against the same devices.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/flash_tiles.hpp"
#include "qkv/vulkan/device_info.hpp"
#include "vk/device_desc.hpp"

namespace qkv::test {

struct fake_device {
    std::string name;
    vulkan::device_info info;
    vulkan::detail::subgroup_control control;
};

/// A device description with the given subgroup, shared-memory and workgroup limits; the other
/// limits generous (65,535 workgroups per dimension, 4 GiB storage buffers, 16 GiB of device-local
/// memory, 16-bit storage).
inline vulkan::device_info describe_device(vulkan::device_type type, std::uint32_t subgroup, bool arithmetic,
                                           std::uint32_t shared, std::uint32_t invocations) {
    vulkan::device_info d;
    d.name = "fake";
    d.type = type;
    d.subgroup_size = subgroup;
    d.subgroup_arithmetic = arithmetic;
    d.max_shared_memory = shared;
    d.max_workgroup_invocations = invocations;
    d.max_workgroup_count[0] = d.max_workgroup_count[1] = d.max_workgroup_count[2] = 65535;
    d.max_storage_buffer_range = 0xffffffffu;
    d.device_local_memory = 16ull << 30;
    d.fp16_storage = true;
    return d;
}

/// A cooperative-matrix list (VkCooperativeMatrixPropertiesKHR) entry of f16·f16 + f32 -> f32 at
/// subgroup scope, m x n x k.
inline vulkan::cooperative_matrix_shape f16_f32(std::uint32_t m, std::uint32_t n, std::uint32_t k) {
    return {m,
            n,
            k,
            vulkan::matrix_component::f16,
            vulkan::matrix_component::f16,
            vulkan::matrix_component::f32,
            vulkan::matrix_component::f32,
            false,
            true};
}
/// The same with a float16 accumulator (the family never takes these).
inline vulkan::cooperative_matrix_shape f16_f16(std::uint32_t m, std::uint32_t n, std::uint32_t k) {
    return {m,
            n,
            k,
            vulkan::matrix_component::f16,
            vulkan::matrix_component::f16,
            vulkan::matrix_component::f16,
            vulkan::matrix_component::f16,
            false,
            true};
}
/// An 8-bit integer entry.
inline vulkan::cooperative_matrix_shape s8_s32(std::uint32_t m, std::uint32_t n, std::uint32_t k) {
    return {m,
            n,
            k,
            vulkan::matrix_component::s8,
            vulkan::matrix_component::s8,
            vulkan::matrix_component::s32,
            vulkan::matrix_component::s32,
            false,
            true};
}

/// `d` with VK_KHR_cooperative_matrix usable, this list, and the driver (a VkDriverId); on a GPU
/// with subgroup shuffles too (the CPU devices keep theirs as the cpu family's tests expect).
inline vulkan::device_info with_matrices(vulkan::device_info d, std::uint32_t driver_id,
                                         std::vector<vulkan::cooperative_matrix_shape> list) {
    d.driver_id = driver_id;
    d.cooperative_matrices = std::move(list);
    d.cooperative_matrix = true;
    if (d.type != vulkan::device_type::cpu) d.subgroup_shuffle = true;
    return d;
}

// VkDriverId values of the drivers the fake devices stand for.
inline constexpr std::uint32_t driver_amd_proprietary = 1, driver_radv = 3, driver_nvidia = 4, driver_anv = 6,
                               driver_llvmpipe = 13;

/// Index of each device in fake_devices(), for tests that expect a particular device's choice.
enum fake_index : std::size_t {
    discrete_32 = 0,
    discrete_64 = 1,
    discrete_64_only = 2,
    integrated_16 = 3,
    cpu_8 = 4,
    minimal = 5,
    cpu_16 = 6,
    cpu_4 = 7,
    xe2_16 = 8,
    amd_proprietary = 9,
    lavapipe_26 = 10,
};

/// Discrete GPUs with subgroups of 32 and 64, an integrated GPU, a CPU implementation like
/// lavapipe (8 lanes, also 16 and 4), and the smallest device the Vulkan spec allows, in the
/// order of fake_index. Their cooperative-matrix lists (VK_KHR_cooperative_matrix) are those of
/// the drivers they stand for, as far as the f16 entries go: NVIDIA 16x16x16, 16x8x16, 16x8x8;
/// RADV on RDNA3 16x16x16; Intel Arc (no size control here) and Xe2 8x16x16... ; lavapipe 26 8x8x8.
inline std::vector<fake_device> fake_devices() {
    using vulkan::device_type;
    return {
        // NVIDIA: warps of 32, 48 KiB of static shared memory per workgroup, tensor cores
        {"discrete, subgroup 32",
         with_matrices(describe_device(device_type::discrete_gpu, 32, true, 49152, 1024), driver_nvidia,
                       {f16_f16(16, 16, 16), f16_f32(16, 16, 16), f16_f16(16, 8, 16), f16_f32(16, 8, 16),
                        f16_f32(16, 8, 8), s8_s32(16, 16, 32)}),
         {32, 32, true, true, 32}},
        // AMD (RDNA3 with RADV, wave64 default): 64 KiB of LDS, wave32..64 selectable, WMMA
        {"discrete, subgroup 64",
         with_matrices(describe_device(device_type::discrete_gpu, 64, true, 65536, 1024), driver_radv,
                       {f16_f16(16, 16, 16), f16_f32(16, 16, 16), s8_s32(16, 16, 16)}),
         {32, 64, true, true, 16}},
        // AMD GCN: wave64 only
        {"discrete, subgroup 64 only",
         describe_device(device_type::discrete_gpu, 64, true, 65536, 1024),
         {64, 64, true, true, 16}},
        // Intel integrated: SIMD8..32, no subgroup size control offered here (so no cooperative matrices
        // for qkv, whose matrices need a fixed subgroup), an Arc-like list
        {"integrated, subgroup 16",
         with_matrices(describe_device(device_type::integrated_gpu, 16, true, 65536, 512), driver_anv,
                       {f16_f32(8, 8, 16)}),
         {}},
        // lavapipe (Mesa 26.1): 8 lanes per AVX2 vector, 32 KiB, 8x8x8 matrices emulated
        {"cpu, subgroup 8",
         with_matrices(describe_device(device_type::cpu, 8, true, 32768, 1024), driver_llvmpipe,
                       {f16_f16(8, 8, 8), f16_f32(8, 8, 8), s8_s32(8, 8, 8)}),
         {8, 8, true, true, 128}},
        // the Vulkan minimum: 16 KiB, 128 invocations, no subgroup arithmetic, size unknown
        {"minimal", describe_device(device_type::other, 0, false, 16384, 128), {}},
        // lavapipe's subgroup is its vector width / 32: 16 lanes with 512-bit vectors, 4 with 128-bit
        // ones (LP_NATIVE_VECTOR_WIDTH=512 or 128)
        {"cpu, subgroup 16",
         with_matrices(describe_device(device_type::cpu, 16, true, 32768, 1024), driver_llvmpipe, {f16_f32(8, 8, 8)}),
         {16, 16, true, true, 64}},
        {"cpu, subgroup 4", describe_device(device_type::cpu, 4, true, 32768, 1024), {4, 4, true, true, 256}},
        // Intel Xe2 (ANV): SIMD16..32 with size control, 64 KiB, XMX
        {"integrated, subgroup 16..32 (Xe2)",
         with_matrices(describe_device(device_type::integrated_gpu, 16, true, 65536, 1024), driver_anv,
                       {f16_f32(8, 16, 16), f16_f16(8, 16, 16)}),
         {16, 32, true, true, 64}},
        // AMD's proprietary driver: the extension on a GPU without matrix units (gated manual)
        {"discrete, subgroup 64 (AMD proprietary)",
         with_matrices(describe_device(device_type::discrete_gpu, 64, true, 65536, 1024), driver_amd_proprietary,
                       {f16_f32(16, 16, 16)}),
         {32, 64, true, true, 16}},
        // lavapipe as Mesa 26.1 describes itself: 8 lanes with shuffles, 8x8x8 matrices (emulated)
        {"cpu, subgroup 8, shuffles (lavapipe 26)",
         [] {
             vulkan::device_info d =
                 with_matrices(describe_device(device_type::cpu, 8, true, 32768, 1024), driver_llvmpipe,
                               {f16_f16(8, 8, 8), f16_f32(8, 8, 8), s8_s32(8, 8, 8)});
             d.subgroup_shuffle = true;
             return d;
         }(),
         {8, 8, true, true, 128}},
    };
}

/// The planners' description of a fake device: its info and subgroup control, with the limits the
/// Vulkan spec guarantees or common drivers report (alignments of 16 and 64, 2^27 texels, 128
/// bytes of push constants) and both texel formats, unless the test changes them; as seen by a build
/// that holds the cooperative-matrix shaders.
inline vulkan::detail::device_desc desc_of(const fake_device& f) {
    vulkan::detail::device_desc d;
    d.info = f.info;
    d.subgroups = f.control;
    d.storage_alignment = 64;
    d.texel_alignment = 16;
    d.max_texel_elements = 1u << 27;
    d.max_push_bytes = 128;
    d.max_workgroup_size_x = f.info.max_workgroup_invocations;
    d.texels_rgba32f = d.texels_rgba16f = true;
    d.coopmat_shaders = true;
    return d;
}

}  // namespace qkv::test
