// The numeric inputs of the commands (see numeric_input.hpp).
#include "numeric_input.hpp"

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include "errors.hpp"

namespace qkv::cli {

numeric_input numbers(const qkv::npy::array& a, const std::string& role) {
    if (a.type != qkv::npy::dtype::f32 && a.type != qkv::npy::dtype::f64)
        throw usage_error(a.name + " has dtype " + std::string(qkv::npy::dtype_name(a.type)) + ": " + role +
                          " must be float32 or float64");
    numeric_input n;
    n.name = a.name;
    n.shape = a.shape;
    n.float64 = a.type == qkv::npy::dtype::f64;
    try {
        if (n.float64)
            n.f64 = a.to_double();
        else
            n.f32 = a.to_float();
    } catch (const qkv::npy::error& e) {
        throw usage_error(e.what());
    }
    return n;
}

void narrow(numeric_input& n) {
    if (!n.float64 || !n.f32.empty()) return;
    constexpr double max = std::numeric_limits<float>::max();
    n.f32.resize(n.f64.size());
    for (std::size_t i = 0; i < n.f64.size(); ++i) {
        const double v = n.f64[i];
        if (std::isfinite(v) && std::fabs(v) > max) {
            n.f32.clear();
            char text[32];
            std::snprintf(text, sizeof text, "%.9g", v);
            throw usage_error(n.name + ": element " + std::to_string(i) + " is " + text +
                              ", beyond the float32 range (|value| <= 3.4028235e+38); the Vulkan backend "
                              "computes in float32 (--backend cpu computes float64 inputs in float64)");
        }
        n.f32[i] = static_cast<float>(v);
    }
}

void read_mask(const qkv::npy::array& m, std::vector<std::uint8_t>& mask, numeric_input& additive) {
    if (m.type != qkv::npy::dtype::b1) {
        additive = numbers(m, "mask");
        return;
    }
    try {
        mask = m.to_bool();
    } catch (const qkv::npy::error& e) {
        throw usage_error(e.what());
    }
}

void widen(numeric_input& n) {
    if (n.float64 || !n.f64.empty()) return;
    n.f64.assign(n.f32.begin(), n.f32.end());
}

}  // namespace qkv::cli
