// What the planners know about a device: a plain value, filled in from a real device
// (device::desc()) or written by hand for the tests' fake devices (tests/support/fake_devices.hpp),
// so that every per-device choice of a call is a pure function of it.
#pragma once

#include <cstdint>

#include "qkv/vulkan/device_info.hpp"

#include <string>

namespace qkv::vulkan::detail {

/// What a device offers for choosing the subgroup size of a pipeline (VK_EXT_subgroup_size_control,
/// core in Vulkan 1.3): the range, and whether a compute pipeline may require a size (and full
/// subgroups). All zero / false where the device does not offer it.
struct subgroup_control {
    std::uint32_t min_size = 0, max_size = 0;
    bool required_size = false;       ///< subgroupSizeControl, with the compute stage in requiredSubgroupSizeStages
    bool full_subgroups = false;      ///< computeFullSubgroups
    std::uint32_t max_subgroups = 0;  ///< maxComputeWorkgroupSubgroups
};

struct device_desc {
    device_info info;                        ///< kind, subgroups, shared memory, workgroup and buffer limits, features
    subgroup_control subgroups;              ///< subgroup size control, where offered and enabled
    std::uint64_t storage_alignment = 16;    ///< max(16, minStorageBufferOffsetAlignment)
    std::uint64_t texel_alignment = 16;      ///< max(16, minTexelBufferOffsetAlignment)
    std::uint64_t max_texel_elements = 0;    ///< maxTexelBufferElements
    std::uint32_t max_push_bytes = 128;      ///< maxPushConstantsSize
    std::uint32_t max_workgroup_size_x = 0;  ///< maxComputeWorkGroupSize[0]
    bool texels_rgba32f = false;             ///< R32G32B32A32_SFLOAT uniform texel buffers
    bool texels_rgba16f = false;             ///< R16G16B16A16_SFLOAT uniform texel buffers
    /// This build holds the cooperative-matrix shaders (vk/shaders.hpp, coopmat_shaders_built): a
    /// fact of the library, not of the device, carried here so that the plans stay pure functions.
    bool coopmat_shaders = false;

    /// Uniform texel buffers of four float32 (or, with `fp16`, four float16) values.
    [[nodiscard]] bool uniform_texels(bool fp16) const { return fp16 ? texels_rgba16f : texels_rgba32f; }
    /// The most invocations one workgroup of x-only size may have.
    [[nodiscard]] std::uint32_t max_workgroup_x() const {
        return max_workgroup_size_x && max_workgroup_size_x < info.max_workgroup_invocations
                   ? max_workgroup_size_x
                   : info.max_workgroup_invocations;
    }
};

/// The end of a refusal for a feature `info`'s device lacks: "<name> does not offer it", or, on a
/// caller's device, that the caller did not enable it.
inline std::string lacks(const device_info& info) {
    return info.caller_device ? "the caller's device (" + info.name + ") was not created with it enabled"
                              : info.name + " does not offer it";
}

}  // namespace qkv::vulkan::detail
