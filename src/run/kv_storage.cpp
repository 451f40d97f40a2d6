#include "run/kv_storage.hpp"

#include <string>

#include "qkv/runtime/error.hpp"
#include "qkv/runtime/half.hpp"
#include "qkv/vulkan/error.hpp"
#include "run/io.hpp"

namespace qkv::vulkan::detail {
namespace {

[[noreturn]] void rethrow_named(const qkv::invalid_argument& e, element_type type, const char* what) {
    throw qkv::invalid_argument(std::string(what) + " stored as kv_type " + std::string(to_string(type)) + ": " +
                                e.what());
}

}  // namespace

std::vector<float> stored_values(element_type type, std::span<const float> values, const char* what) {
    if (type == element_type::f32) return {values.begin(), values.end()};
    if (type == element_type::f16) {
        std::vector<std::uint16_t> halves(values.size());
        put_halves(reinterpret_cast<std::byte*>(halves.data()), values, what);  // refuses what float16 cannot hold
        std::vector<float> out(values.size());
        qkv::from_half_bits(halves, out);
        return out;
    }
    try {
        return round_trip(type, values);
    } catch (const qkv::invalid_argument& e) {
        rethrow_named(e, type, what);
    }
}

void put_block_rows(std::byte* at, element_type type, const float* src, std::size_t rows, std::size_t width,
                    const char* what) {
    const std::size_t row_bytes = bytes_for(type, width);
    try {
        for (std::size_t r = 0; r < rows; ++r)
            quantize(type, {src + r * width, width}, {at + r * row_bytes, row_bytes});
    } catch (const qkv::invalid_argument& e) {
        rethrow_named(e, type, what);
    }
}

}  // namespace qkv::vulkan::detail
