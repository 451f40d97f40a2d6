// K and V as a device storing them as options.kv_type holds them, for the CPU backend's forward
// (cpu_sdpa.cpp) and backward (cpu_sdpa_backward.cpp) passes. Internal to the library.
#pragma once

#include <cmath>
#include <cstddef>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "qkv/runtime/element_type.hpp"
#include "qkv/runtime/error.hpp"

namespace qkv::cpu::detail {

/// K or V as a device storing them as `type` holds them (options.kv_type): narrowed to float32
/// (a finite double beyond float32's range is refused), then quantize + dequantize.
template <class In>
inline std::vector<float> stored_as(element_type type, std::span<const In> values, const char* what) {
    std::vector<float> narrowed(values.size());
    for (std::size_t i = 0; i < values.size(); ++i) {
        const auto value = static_cast<double>(values[i]);
        if (std::isfinite(value) && std::abs(value) > static_cast<double>(std::numeric_limits<float>::max()))
            throw invalid_argument(std::string(what) + ": element " + std::to_string(i) +
                                   " is beyond the float32 range, and kv_type " + std::string(to_string(type)) +
                                   " stores float32 values");
        narrowed[i] = static_cast<float>(values[i]);
    }
    try {
        return round_trip(type, narrowed);
    } catch (const invalid_argument& e) {
        throw invalid_argument(std::string(what) + " stored as kv_type " + std::string(to_string(type)) + ": " +
                               e.what());
    }
}

}  // namespace qkv::cpu::detail
