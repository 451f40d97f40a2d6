#include "vk/shaders.hpp"

// Defined in the generated spv_*.cpp files (cmake/qkv_shaders.cmake).
#define QKV_SHADER(id, source, defines, bindings, push, spec) \
    extern "C" const std::uint32_t qkv_spv_##id[];            \
    extern "C" const std::size_t qkv_spv_##id##_words;
#include "shader_table.def"
#undef QKV_SHADER

namespace qkv::vulkan::detail {

std::span<const std::uint32_t> spirv(shader_id id) {
    switch (id) {
#define QKV_SHADER(id, source, defines, bindings, push, spec) \
    case shader_id::id:                                       \
        return {qkv_spv_##id, qkv_spv_##id##_words};
#include "shader_table.def"
#undef QKV_SHADER
    }
    return {};
}

bool coopmat_shaders_built() { return !spirv(shader_id::flash_coop).empty(); }

}  // namespace qkv::vulkan::detail
