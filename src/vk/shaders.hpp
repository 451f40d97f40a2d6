// The compute shaders, compiled to SPIR-V at build time (src/CMakeLists.txt) and embedded. Every
// shader id, with its bindings and push-constant size, is a row of shaders/shader_table.def, the
// one table CMake and C++ both read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "contract/ceiling.h"
#include "contract/decode.h"
#include "contract/flash.h"
#include "contract/gemm.h"
#include "contract/range_guard.h"
#include "contract/softmax.h"

namespace qkv::vulkan::detail {

enum class shader_id {
#define QKV_SHADER(id, source, defines, bindings, push) id,
#include "shader_table.def"
#undef QKV_SHADER
};

/// A row of the shader table: what a pipeline for the shader needs besides its SPIR-V.
struct shader_row {
    const char* name;
    /// One letter per binding 0, 1, ...: 's' storage buffer, 't' uniform texel buffer.
    std::string_view bindings;
    std::uint32_t push_bytes;
};

inline constexpr shader_row shader_table[] = {
#define QKV_PUSH(type) static_cast<std::uint32_t>(sizeof(::qkv::contract::type))
#define QKV_SHADER(id, source, defines, bindings, push) {#id, bindings, push},
#include "shader_table.def"
#undef QKV_SHADER
#undef QKV_PUSH
};

constexpr const shader_row& describe(shader_id id) { return shader_table[static_cast<std::size_t>(id)]; }

/// The SPIR-V words of a shader.
std::span<const std::uint32_t> spirv(shader_id id);
inline const char* shader_name(shader_id id) { return describe(id).name; }

}  // namespace qkv::vulkan::detail
