// qkv::npy — reader and writer for NumPy .npy files (format versions 1.0, 2.0, 3.0).
//
// Reading accepts C-order float32, float64, bool and int32 arrays in either byte order;
// everything else is refused with a qkv::npy::error whose what() starts with the
// file name. Reading checks the magic string and the header before it reads the data, and reads
// no more than the header declares (and one byte, to detect trailing data). Writing produces
// float32 ('<f4') or float64 ('<f8') files byte-identical to np.save.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace qkv::npy {

// Every failure of this component (bad input, I/O error, misuse) is reported as this.
class error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

enum class dtype : std::uint8_t { f32, f64, b1, i4 };

std::string_view dtype_name(dtype t) noexcept;  // "float32", "float64", "bool", "int32"
std::size_t itemsize(dtype t) noexcept;         // 4, 8, 1, 4

struct array {
    std::string name;                // source (file path or name given to parse), prefixes errors
    std::vector<std::size_t> shape;  // empty for a 0-d array (which holds one element)
    dtype type = dtype::f32;         // dtype as stored in the file
    std::vector<std::byte> data;     // C order, host (little-endian) byte order;
                                     // size() * itemsize(type) bytes

    std::size_t size() const;          // element count: product of shape (1 for 0-d)
    std::string shape_string() const;  // Python tuple syntax: "()", "(3,)", "(2, 3)"

    std::vector<float> to_float() const;         // f32 as is, f64 rounded to nearest; bool, int32 refused
    std::vector<double> to_double() const;       // f32 widened exactly, f64 as is; bool, int32 refused
    std::vector<std::uint8_t> to_bool() const;   // b1 only; every byte must be 0 or 1
    std::vector<std::int32_t> to_int32() const;  // i4 only (offsets, indices)
};

// Parses a complete .npy image; `name` prefixes error messages.
array parse(std::span<const std::byte> bytes, std::string_view name);

// File names as UTF-8 std::strings, on every platform (the qkv tool reads its Windows command
// line as UTF-16 and converts it to UTF-8). path(std::string) and path::string() would use the
// ANSI code page (MSVC) or the C locale (MinGW's libstdc++) on Windows, which cannot spell most
// names and, with libstdc++, do not even round-trip; char8_t is UTF-8 for both. On POSIX both
// functions copy the bytes unchanged.
inline std::filesystem::path path_from_utf8(std::string_view utf8) {
    return std::filesystem::path(std::u8string_view(reinterpret_cast<const char8_t*>(utf8.data()), utf8.size()));
}
inline std::string path_to_utf8(const std::filesystem::path& path) {
    const std::u8string s = path.u8string();
    return std::string(s.begin(), s.end());
}

// Reads and parses a .npy file; the path (in UTF-8) prefixes error messages.
array read(const std::filesystem::path& path);

// A float32 ('<f4', C order) .npy image exactly as np.save writes it: format 1.0
// unless the header needs more than 65535 bytes (then 2.0), data 64-byte aligned.
// Throws if the product of `shape` differs from data.size().
std::vector<std::byte> serialize(std::span<const std::size_t> shape, std::span<const float> data);

// The same for float64 ('<f8'): what np.save writes for a float64 array.
std::vector<std::byte> serialize(std::span<const std::size_t> shape, std::span<const double> data);

// What serialize() writes before the data, for a C-order little-endian array of `type`: the
// magic string, the version, the header length and the header. For writers that stream the data.
std::vector<std::byte> header(std::span<const std::size_t> shape, dtype type);

// Writes serialize(shape, data) atomically: a temporary file in the target's
// directory (a short fixed-length name, whatever the length of `path`'s) is written, flushed,
// synced and renamed over `path`. On failure the
// temporary file is removed, `path` is left untouched, and the error names the
// path and the OS error.
void write(const std::filesystem::path& path, std::span<const std::size_t> shape, std::span<const float> data);
void write(const std::filesystem::path& path, std::span<const std::size_t> shape, std::span<const double> data);

}  // namespace qkv::npy
