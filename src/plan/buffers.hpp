// What a plan says of a call's device buffers, apart from any device: the buffers by role, the
// bytes each role needs, the regions the host reads back, and the arithmetic of their layout.
// The run I/O (run/io.hpp) makes and fills the buffers.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace qkv::vulkan::detail {

/// The device buffers of a call, by what they hold. Every one is a storage buffer that may also be
/// read through texel views.
enum class role : std::uint8_t {
    inputs,         ///< every host input of the call, packed at the plan's offsets
    qkv,            ///< attention: the projected Q|K|V rows
    scores,         ///< staged attention: the scores, then the weights; sdpa: the returned weights
    concat,         ///< attention with an output projection: the heads side by side
    out,            ///< the output
    state,          ///< the fused kernels' (max, sum) per row between key chunks / for the weights
    texels,         ///< the fused cpu family's Q, K, V as texels (flash_cpu_pack.comp)
    partial_stats,  ///< decode: (max, sum) per (row, chunk)
    partial_acc,    ///< decode: the accumulator per (row, chunk)
    widened,        ///< a call over tensors: its float16 or quantized tensors read as float32 (tensor_widen.comp)
};
inline constexpr std::size_t role_count = 10;
/// The role's name, for messages.
const char* role_name(role r);

/// What one call needs of the buffers: bytes per role (0: not used; the buffer is released, so
/// that memory follows the calls).
struct buffer_plan {
    std::array<std::uint64_t, role_count> bytes{};
    void need(role r, std::uint64_t size) { bytes[static_cast<std::size_t>(r)] = size; }
    [[nodiscard]] std::uint64_t of(role r) const { return bytes[static_cast<std::size_t>(r)]; }
};

/// A region of a call buffer the host reads after the call.
struct download {
    role from = role::out;
    std::uint64_t offset = 0, bytes = 0;
};

/// Bytes of the bits of a mask of `elements` values (whole 32-bit words).
[[nodiscard]] constexpr std::uint64_t mask_bits_bytes(std::uint64_t elements) { return (elements + 31) / 32 * 4; }
[[nodiscard]] constexpr std::uint64_t align_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }

}  // namespace qkv::vulkan::detail
