// qkv::npy, the format: dtypes, the conversions of array, and the preamble and header np.save
// writes (numpy/lib/format.py, NEP 1); the helpers the other parts share.
#include "npy_detail.hpp"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <system_error>
#include <utility>

#if defined(_WIN32)
#include <fcntl.h>
#include <io.h>
#include <sys/stat.h>
#else
#include <unistd.h>
#endif

namespace qkv::npy {

static_assert(std::endian::native == std::endian::little,
              "qkv::npy stores and writes little-endian data and assumes a little-endian host");
static_assert(std::numeric_limits<float>::is_iec559 && std::numeric_limits<double>::is_iec559,
              "qkv::npy assumes IEEE-754 float and double");
static_assert(sizeof(float) == 4 && sizeof(double) == 8);

using namespace detail;

namespace {

// Converts a double to the nearest float without relying on out-of-range conversions.
float narrow(double d) {
    constexpr double float_max = std::numeric_limits<float>::max();
    constexpr double rounds_to_infinity = 0x1.ffffffp127;  // FLT_MAX + half an ulp
    if (std::isfinite(d) && std::fabs(d) > float_max) {
        const float magnitude = std::fabs(d) >= rounds_to_infinity ? std::numeric_limits<float>::infinity()
                                                                   : std::numeric_limits<float>::max();
        return d < 0 ? -magnitude : magnitude;
    }
    return static_cast<float>(d);
}

// Checks that a.data matches a.shape and a.type; returns the element count.
std::size_t checked_count(const array& a) {
    const std::size_t item = itemsize(a.type);
    if (item == 0) fail(a.name, "invalid dtype value " + std::to_string(static_cast<unsigned>(a.type)));
    std::size_t count = 0;
    if (!element_count(a.shape, item, count) || a.data.size() != count * item) {
        fail(a.name, "array data holds " + std::to_string(a.data.size()) + " bytes, which does not match shape " +
                         shape_brief(a.shape) + " of " + std::string(dtype_name(a.type)));
    }
    return count;
}

std::string_view descr_of(dtype type) {
    switch (type) {
        case dtype::f32:
            return "<f4";
        case dtype::f64:
            return "<f8";
        case dtype::b1:
            return "|b1";
        case dtype::i4:
            return "<i4";
    }
    return "";
}

}  // namespace

namespace detail {

[[noreturn]] void fail(std::string_view name, std::string_view what) {
    std::string message(name.empty() ? std::string_view("<npy>") : name);
    message.append(": ").append(what);
    throw error(message);
}

std::string os_message(int err) { return std::error_code(err, std::generic_category()).message(); }

// Python-style single-quoted rendering; bytes outside printable ASCII become \xNN.
void append_quoted(std::string_view text, std::string& out) {
    static constexpr char hex[] = "0123456789abcdef";
    out += '\'';
    for (const char ch : text) {
        const auto c = static_cast<unsigned char>(ch);
        if (c == '\\' || c == '\'') {
            out += '\\';
            out += ch;
        } else if (c >= 0x20 && c < 0x7f) {
            out += ch;
        } else {
            out += "\\x";
            out += hex[c >> 4];
            out += hex[c & 15];
        }
    }
    out += '\'';
}

std::string py_quote(std::string_view text) {
    std::string out;
    append_quoted(text.substr(0, max_repr), out);
    if (text.size() > max_repr) out.insert(out.size() - 1, "...");
    return out;
}

std::string shape_repr(std::span<const std::size_t> shape) {
    std::string s = "(";
    for (std::size_t i = 0; i < shape.size(); ++i) {
        if (i != 0) s += ", ";
        s += std::to_string(shape[i]);
    }
    if (shape.size() == 1) s += ',';
    s += ')';
    return s;
}

// A shape for an error message, abbreviated if it has very many dimensions.
std::string shape_brief(std::span<const std::size_t> shape) {
    std::string s = shape_repr(shape);
    if (s.size() > max_repr) {
        s.resize(max_repr);
        s += "...";
    }
    return s;
}

// Sets `count` to the element count of `shape` and returns true, or returns false when the
// byte size (count * item) would exceed max_data_bytes. Dimensions of zero make the count zero
// but, as in numpy, the other dimensions must still multiply to something addressable.
bool element_count(std::span<const std::size_t> shape, std::size_t item, std::size_t& count) {
    const std::size_t limit = max_data_bytes / item;
    std::size_t n = 1;
    bool zero = false;
    for (const std::size_t d : shape) {
        if (d == 0) {
            zero = true;
        } else if (n > limit / d) {
            return false;
        } else {
            n *= d;
        }
    }
    count = zero ? 0 : n;
    return true;
}

// The preamble and header np.save writes for a C-order array of `type` and `shape`, which must
// hold `values` elements.
std::vector<std::byte> header_named(std::span<const std::size_t> shape, dtype type, std::size_t values,
                                    std::string_view name) {
    const std::size_t item = itemsize(type);
    if (item == 0) fail(name, "invalid dtype value " + std::to_string(static_cast<unsigned>(type)));
    std::size_t count = 0;
    if (!element_count(shape, item, count)) fail(name, "shape " + shape_brief(shape) + " is too large");
    if (count != values) {
        fail(name, "shape " + shape_brief(shape) + " holds " + std::to_string(count) + " elements but " +
                       std::to_string(values) + " values were given");
    }

    // Exactly what numpy's _write_array_header produces for a C-order array.
    std::string header = "{'descr': '" + std::string(descr_of(type)) +
                         "', 'fortran_order': False, 'shape': " + shape_repr(shape) + ", }";
    if (!shape.empty()) {
        const std::size_t digits = std::to_string(shape.front()).size();
        header.append(growth_axis_max_digits - std::min(digits, growth_axis_max_digits), ' ');
    }
    const std::size_t hlen = header.size() + 1;  // + the final '\n'
    std::size_t prefix = sizeof magic + 2 + 2;
    std::size_t padlen = array_align - (prefix + hlen) % array_align;
    unsigned char major = 1;
    if (hlen + padlen > 0xffff) {
        major = 2;
        prefix = sizeof magic + 2 + 4;
        padlen = array_align - (prefix + hlen) % array_align;
        if (hlen + padlen > 0xffffffffu) fail(name, "header of " + std::to_string(hlen) + " bytes is too large");
    }
    const std::size_t field = hlen + padlen;

    std::vector<std::byte> out;
    out.reserve(prefix + field);
    const auto put = [&out](unsigned c) { out.push_back(static_cast<std::byte>(c & 0xffu)); };
    for (const unsigned char c : magic) put(c);
    put(major);
    put(0);
    put(static_cast<unsigned>(field));
    put(static_cast<unsigned>(field >> 8));
    if (major == 2) {
        put(static_cast<unsigned>(field >> 16));
        put(static_cast<unsigned>(field >> 24));
    }
    for (const char c : header) put(static_cast<unsigned char>(c));
    out.insert(out.end(), padlen, static_cast<std::byte>(' '));
    put('\n');
    return out;
}

}  // namespace detail

std::string_view dtype_name(dtype t) noexcept {
    switch (t) {
        case dtype::f32:
            return "float32";
        case dtype::f64:
            return "float64";
        case dtype::b1:
            return "bool";
        case dtype::i4:
            return "int32";
    }
    return "invalid";
}

std::size_t itemsize(dtype t) noexcept {
    switch (t) {
        case dtype::f32:
            return 4;
        case dtype::f64:
            return 8;
        case dtype::b1:
            return 1;
        case dtype::i4:
            return 4;
    }
    return 0;
}

std::size_t array::size() const {
    std::size_t n = 1;
    if (std::find(shape.begin(), shape.end(), std::size_t{0}) != shape.end()) return 0;
    for (const std::size_t d : shape) {
        if (n > size_max / d) fail(name, "shape " + shape_brief(shape) + " overflows the element count");
        n *= d;
    }
    return n;
}

std::string array::shape_string() const { return shape_repr(shape); }

std::vector<float> array::to_float() const {
    const std::size_t n = checked_count(*this);
    std::vector<float> out(n);
    switch (type) {
        case dtype::f32:
            if (n != 0) std::memcpy(out.data(), data.data(), n * sizeof(float));
            break;
        case dtype::f64:
            for (std::size_t i = 0; i < n; ++i) {
                double d = 0;
                std::memcpy(&d, data.data() + i * sizeof(double), sizeof(double));
                out[i] = narrow(d);
            }
            break;
        case dtype::b1:
            fail(name, "cannot convert a bool array to float32");
        case dtype::i4:
            fail(name, "cannot convert an int32 array to float32 (expected float)");
    }
    return out;
}

std::vector<double> array::to_double() const {
    const std::size_t n = checked_count(*this);
    std::vector<double> out(n);
    switch (type) {
        case dtype::f32:
            for (std::size_t i = 0; i < n; ++i) {
                float f = 0;
                std::memcpy(&f, data.data() + i * sizeof(float), sizeof(float));
                out[i] = static_cast<double>(f);
            }
            break;
        case dtype::f64:
            if (n != 0) std::memcpy(out.data(), data.data(), n * sizeof(double));
            break;
        case dtype::b1:
            fail(name, "cannot convert a bool array to float64");
        case dtype::i4:
            fail(name, "cannot convert an int32 array to float64 (expected float)");
    }
    return out;
}

std::vector<std::int32_t> array::to_int32() const {
    const std::size_t n = checked_count(*this);
    if (type != dtype::i4) fail(name, "expected an int32 array, found " + std::string(dtype_name(type)));
    std::vector<std::int32_t> out(n);
    if (n != 0) std::memcpy(out.data(), data.data(), n * sizeof(std::int32_t));
    return out;
}

std::vector<std::uint8_t> array::to_bool() const {
    const std::size_t n = checked_count(*this);
    if (type != dtype::b1) fail(name, "expected a bool array, found " + std::string(dtype_name(type)));
    std::vector<std::uint8_t> out(n);
    for (std::size_t i = 0; i < n; ++i) {
        const auto b = std::to_integer<std::uint8_t>(data[i]);
        if (b > 1) {
            fail(name, "bool array holds byte value " + std::to_string(b) + " at element " + std::to_string(i) +
                           " (expected 0 or 1)");
        }
        out[i] = b;
    }
    return out;
}

std::vector<std::byte> header(std::span<const std::size_t> shape, dtype type) {
    std::size_t count = 0;
    const std::size_t item = itemsize(type);
    if (item == 0 || !element_count(shape, item, count)) {
        fail("qkv::npy::header", "shape " + shape_brief(shape) + " is too large (or the dtype is invalid)");
    }
    return header_named(shape, type, count, "qkv::npy::header");
}

std::vector<std::byte> serialize(std::span<const std::size_t> shape, std::span<const float> data) {
    return serialize_named(shape, data, "qkv::npy::serialize");
}

std::vector<std::byte> serialize(std::span<const std::size_t> shape, std::span<const double> data) {
    return serialize_named(shape, data, "qkv::npy::serialize");
}

}  // namespace qkv::npy
