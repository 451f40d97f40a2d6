// The host twin of examples/shaders/fill_qkv.comp's values, bit for bit.
#pragma once

#include <cstdint>
#include <vector>

namespace app {

inline float hashed_value(std::uint32_t i, std::uint32_t salt) {
    std::uint32_t h = (i ^ (salt * 0x9e3779b9u)) * 2654435761u;
    h ^= h >> 15;
    return static_cast<float>(h >> 8) * (1.0f / 8388608.0f) - 1.0f;
}

/// The n values fill_qkv writes for tensor `which` (0 q, 1 k, 2 v) with `salt`.
inline std::vector<float> hashed_values(std::size_t n, std::uint32_t which, std::uint32_t salt) {
    std::vector<float> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = hashed_value(static_cast<std::uint32_t>(i), salt * 3u + which + 1u);
    return v;
}

}  // namespace app
