// Private to tools/npy: what the parser (npy_parse.cpp), the format (npy_format.cpp) and the
// file I/O (npy_file.cpp) share. Not installed, not part of qkv::npy's interface.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "npy.hpp"

namespace qkv::npy::detail {

namespace fs = std::filesystem;

inline constexpr std::size_t size_max = std::numeric_limits<std::size_t>::max();
// Largest data size (in bytes) accepted or written, as numpy: the byte count must fit in intptr_t.
inline constexpr std::size_t max_data_bytes = static_cast<std::size_t>(std::numeric_limits<std::ptrdiff_t>::max());
inline constexpr std::size_t max_repr = 80;                // longest header value quoted in an error message
inline constexpr int max_nesting = 32;                     // deepest (), [], {} nesting the header parser accepts
inline constexpr std::size_t array_align = 64;             // numpy's ARRAY_ALIGN
inline constexpr std::size_t growth_axis_max_digits = 21;  // numpy's GROWTH_AXIS_MAX_DIGITS
inline constexpr unsigned char magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

/// Throws qkv::npy::error "<name>: <what>".
[[noreturn]] void fail(std::string_view name, std::string_view what);
/// The message of an errno value.
std::string os_message(int err);
/// Python-style single-quoted rendering; bytes outside printable ASCII become \xNN.
void append_quoted(std::string_view text, std::string& out);
/// The same, cut to max_repr characters.
std::string py_quote(std::string_view text);
/// A shape as Python writes a tuple: (3,), (2, 4).
std::string shape_repr(std::span<const std::size_t> shape);
/// A shape for an error message, abbreviated if it has very many dimensions.
std::string shape_brief(std::span<const std::size_t> shape);
/// Sets `count` to the element count of `shape` and returns true, or returns false when the
/// byte size (count * item) would exceed max_data_bytes.
bool element_count(std::span<const std::size_t> shape, std::size_t item, std::size_t& count);

/// The preamble and header np.save writes for a C-order array of `type` and `shape`, which must
/// hold `values` elements (npy_format.cpp).
std::vector<std::byte> header_named(std::span<const std::size_t> shape, dtype type, std::size_t values,
                                    std::string_view name);

template <class T>
std::vector<std::byte> serialize_named(std::span<const std::size_t> shape, std::span<const T> data,
                                       std::string_view name) {
    constexpr dtype type = sizeof(T) == 4 ? dtype::f32 : dtype::f64;
    std::vector<std::byte> out = header_named(shape, type, data.size(), name);
    if (!data.empty()) {
        const std::size_t at = out.size();
        out.resize(at + data.size() * sizeof(T));
        std::memcpy(out.data() + at, data.data(), data.size() * sizeof(T));
    }
    return out;
}

/// Checks the magic string, the version and the header length field; returns the offset of the
/// first data byte (preamble + header). Needs only the first 12 bytes (fewer: truncated).
std::size_t header_end(std::span<const std::byte> bytes, std::string_view name);

// What a header describes.
struct layout {
    dtype type = dtype::f32;
    bool swap = false;  // big-endian data
    std::vector<std::size_t> dims;
    std::size_t data_start = 0;  // offset of the first data byte
    std::size_t data_bytes = 0;  // what the shape and dtype need
};

/// Parses the preamble and the header; `bytes` must hold at least all of them (else: truncated).
layout parse_header(std::span<const std::byte> bytes, std::string_view name);

}  // namespace qkv::npy::detail
