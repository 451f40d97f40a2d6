// One numeric .npy input of the commands (`qkv attention`, `qkv sdpa`, `qkv merge`) as read:
// float32 or float64 data, kept as the file has it until the backend is known, then narrowed to
// float32 (a finite value beyond float32's range refused, naming the file and the element) or
// widened to float64 (exactly). No Vulkan here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "npy/npy.hpp"

namespace qkv::cli {

struct numeric_input {
    std::string name;                ///< the file, for messages
    std::vector<std::size_t> shape;  ///< as in the file
    bool float64 = false;            ///< the file holds float64
    std::vector<float> f32;          ///< the values as float32 (as read, or after narrow)
    std::vector<double> f64;         ///< the values as float64 (as read, or after widen)
};

/// The values of `a`, float32 or float64 as the file holds them; a bool file is a usage_error
/// ("<file> has dtype bool: <role> must be float32 or float64").
[[nodiscard]] numeric_input numbers(const qkv::npy::array& a, const std::string& role);

/// Fills f32 from a float64 input; throws usage_error naming the file and the element when a
/// finite value is beyond the float32 range (f32 left empty).
void narrow(numeric_input& n);

/// Fills f64 from a float32 input, exactly.
void widen(numeric_input& n);

/// The values as T: f32 for float, f64 for double (after narrow or widen).
template <class T>
[[nodiscard]] const std::vector<T>& values(const numeric_input& n) {
    if constexpr (std::is_same_v<T, float>)
        return n.f32;
    else
        return n.f64;
}

/// A mask file: a bool one into `mask`, a float one into `additive`.
void read_mask(const qkv::npy::array& m, std::vector<std::uint8_t>& mask, numeric_input& additive);

}  // namespace qkv::cli
