#include "shaders.hpp"

#include <cstddef>

// Defined in the generated spv_*.cpp files.
#define QKV_SHADER_DECL(id, array)          \
    extern "C" const std::uint32_t array[]; \
    extern "C" const std::size_t array##_words;
QKV_SHADERS(QKV_SHADER_DECL)
#undef QKV_SHADER_DECL

namespace qkv::vulkan::detail {

std::span<const std::uint32_t> spirv(shader_id id) {
    switch (id) {
#define QKV_SHADER_CASE(id, array) \
    case shader_id::id:            \
        return {array, array##_words};
        QKV_SHADERS(QKV_SHADER_CASE)
#undef QKV_SHADER_CASE
    }
    return {};
}

const char* shader_name(shader_id id) {
    switch (id) {
#define QKV_SHADER_NAME(id, array) \
    case shader_id::id:            \
        return #id;
        QKV_SHADERS(QKV_SHADER_NAME)
#undef QKV_SHADER_NAME
    }
    return "?";
}

}  // namespace qkv::vulkan::detail
