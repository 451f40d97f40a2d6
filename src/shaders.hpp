// The compute shaders, compiled to SPIR-V at build time (shaders/CMakeLists.txt) and embedded.
#pragma once

#include <cstdint>
#include <span>

namespace qkv::vulkan::detail {

// X(id, spirv array name)
#define QKV_SHADERS(X)                                \
    X(project, qkv_spv_project)                       \
    X(project_f16, qkv_spv_project_f16)               \
    X(scores, qkv_spv_scores)                         \
    X(scores_f16, qkv_spv_scores_f16)                 \
    X(softmax, qkv_spv_softmax)                       \
    X(softmax_subgroup, qkv_spv_softmax_subgroup)     \
    X(aggregate, qkv_spv_aggregate)                   \
    X(aggregate_f16, qkv_spv_aggregate_f16)           \
    X(flash, qkv_spv_flash)                           \
    X(flash_f16, qkv_spv_flash_f16)                   \
    X(flash_subgroup, qkv_spv_flash_subgroup)         \
    X(flash_subgroup_f16, qkv_spv_flash_subgroup_f16) \
    X(range_guard, qkv_spv_range_guard)               \
    X(range_guard_f16, qkv_spv_range_guard_f16)       \
    X(flash_cpu, qkv_spv_flash_cpu)                   \
    X(flash_cpu_pack, qkv_spv_flash_cpu_pack)         \
    X(flash_cpu_pack_f16, qkv_spv_flash_cpu_pack_f16) \
    X(flash_weights, qkv_spv_flash_weights)           \
    X(flash_weights_f16, qkv_spv_flash_weights_f16)   \
    X(ceiling_fma, qkv_spv_ceiling_fma)               \
    X(ceiling_copy, qkv_spv_ceiling_copy)             \
    X(project_cpu, qkv_spv_project_cpu)               \
    X(project_cpu_f16, qkv_spv_project_cpu_f16)       \
    X(scores_cpu, qkv_spv_scores_cpu)                 \
    X(scores_cpu_f16, qkv_spv_scores_cpu_f16)         \
    X(aggregate_cpu, qkv_spv_aggregate_cpu)           \
    X(aggregate_cpu_f16, qkv_spv_aggregate_cpu_f16)

enum class shader_id {
#define QKV_SHADER_ENUM(id, array) id,
    QKV_SHADERS(QKV_SHADER_ENUM)
#undef QKV_SHADER_ENUM
};

/// The SPIR-V words of a shader.
std::span<const std::uint32_t> spirv(shader_id id);
const char* shader_name(shader_id id);

}  // namespace qkv::vulkan::detail
