// The compute shaders, compiled to SPIR-V at build time (src/CMakeLists.txt) and embedded. Every
// shader id, with its bindings and push-constant size, is a row of shaders/shader_table.def, the
// one table CMake and C++ both read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <type_traits>

#include "contract/backward.h"
#include "contract/ceiling.h"
#include "contract/coop.h"
#include "contract/decode.h"
#include "contract/flash.h"
#include "contract/gemm.h"
#include "contract/paged.h"
#include "contract/range_guard.h"
#include "contract/softmax.h"
#include "contract/tensor.h"

namespace qkv::vulkan::detail {

enum class shader_id {
#define QKV_SHADER(id, source, defines, bindings, push, spec) id,
#include "shader_table.def"
#undef QKV_SHADER
};

/// A row of the shader table: what a pipeline for the shader needs besides its SPIR-V.
struct shader_row {
    const char* name;
    /// One letter per binding 0, 1, ...: 's' storage buffer, 't' uniform texel buffer.
    std::string_view bindings;
    std::uint32_t push_bytes;
    /// Bytes of the specialization-constant struct (4 per constant, constant_id n at 4·n); 0: none.
    std::uint32_t spec_bytes;
};

inline constexpr shader_row shader_table[] = {
#define QKV_PUSH(type) static_cast<std::uint32_t>(sizeof(::qkv::contract::type))
#define QKV_SPEC(type) static_cast<std::uint32_t>(sizeof(::qkv::contract::type))
#define QKV_NO_SPEC 0u
#define QKV_SHADER(id, source, defines, bindings, push, spec) {#id, bindings, push, spec},
#include "shader_table.def"
#undef QKV_SHADER
#undef QKV_NO_SPEC
#undef QKV_SPEC
#undef QKV_PUSH
};

constexpr const shader_row& describe(shader_id id) { return shader_table[static_cast<std::size_t>(id)]; }

/// Every row names only binding types pipeline_set knows, and a push block every device offers.
constexpr bool table_well_formed() {
    for (const shader_row& row : shader_table) {
        if (row.bindings.empty() || row.push_bytes > ::qkv::contract::PUSH_CONSTANT_BYTES_GUARANTEED ||
            row.spec_bytes % 4 != 0)
            return false;
        for (const char c : row.bindings)
            if (c != 's' && c != 't') return false;
    }
    return true;
}
static_assert(table_well_formed(),
              "shaders/shader_table.def: a row with a binding letter other than s or t, a push "
              "block over 128 bytes, or a specialization struct that is not whole 32-bit words");

/// The shader takes no specialization constants (QKV_NO_SPEC in its row).
struct no_spec {};

/// Bytes of a specialization struct as the table counts them (no_spec: 0).
template <class Spec>
constexpr std::uint32_t spec_bytes() {
    if constexpr (std::is_same_v<Spec, no_spec>)
        return 0;
    else
        return static_cast<std::uint32_t>(sizeof(Spec));
}

/// Whether a shader's row states exactly these bindings (one letter each, as in the table), the
/// push block `Push` and the specialization struct `Spec`. Recorders static_assert it for what they
/// push, bind and specialise, so a row that disagrees with its recorder fails the build.
template <class Push, class Spec>
constexpr bool row_matches(shader_id id, std::string_view bindings) {
    return describe(id).bindings == bindings && describe(id).push_bytes == sizeof(Push) &&
           describe(id).spec_bytes == spec_bytes<Spec>();
}

/// The SPIR-V words of a shader (none for a shader this build left out: cmake/qkv_shaders.cmake).
std::span<const std::uint32_t> spirv(shader_id id);
/// Whether this build holds the cooperative-matrix shaders (the rows that name QKV_COOPMAT), which
/// need a glslang that compiles GL_KHR_cooperative_matrix.
bool coopmat_shaders_built();
inline const char* shader_name(shader_id id) { return describe(id).name; }

}  // namespace qkv::vulkan::detail
