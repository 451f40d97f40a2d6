// qkv::npy — see npy.hpp. Format reference: numpy/lib/format.py (NEP 1).
#include "npy.hpp"

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

namespace {

namespace fs = std::filesystem;

constexpr std::size_t size_max = std::numeric_limits<std::size_t>::max();
// Largest data size (in bytes) accepted or written, as numpy: the byte count must fit in intptr_t.
constexpr std::size_t max_data_bytes = static_cast<std::size_t>(std::numeric_limits<std::ptrdiff_t>::max());
constexpr std::size_t max_repr = 80;                // longest header value quoted in an error message
constexpr int max_nesting = 32;                     // deepest (), [], {} nesting the header parser accepts
constexpr std::size_t array_align = 64;             // numpy's ARRAY_ALIGN
constexpr std::size_t growth_axis_max_digits = 21;  // numpy's GROWTH_AXIS_MAX_DIGITS
constexpr unsigned char magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

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

// ---------------------------------------------------------------------------------------------
// The header: a Python dict literal. This is a parser for the literal subset numpy writes
// (and a little more: either quote style, trailing commas, any whitespace, Python 2 'L' suffixes).

struct value {
    enum class kind : std::uint8_t { str, integer, boolean, none, tuple, list, dict };
    kind k = kind::none;
    bool flag = false;         // boolean
    std::string text;          // str: decoded characters; integer: optional '-' then digits
    std::vector<value> items;  // tuple, list: elements; dict: key0, value0, key1, value1, ...
};

void append_repr(const value& v, std::string& out) {
    if (out.size() > max_repr) return;
    switch (v.k) {
        case value::kind::str:
            append_quoted(v.text, out);
            break;
        case value::kind::integer:
            out += v.text;
            break;
        case value::kind::boolean:
            out += v.flag ? "True" : "False";
            break;
        case value::kind::none:
            out += "None";
            break;
        case value::kind::tuple:
        case value::kind::list: {
            const bool tuple = v.k == value::kind::tuple;
            out += tuple ? '(' : '[';
            for (std::size_t i = 0; i < v.items.size() && out.size() <= max_repr; ++i) {
                if (i != 0) out += ", ";
                append_repr(v.items[i], out);
            }
            if (tuple && v.items.size() == 1) out += ',';
            out += tuple ? ')' : ']';
            break;
        }
        case value::kind::dict:
            out += '{';
            for (std::size_t i = 0; i + 1 < v.items.size() && out.size() <= max_repr; i += 2) {
                if (i != 0) out += ", ";
                append_repr(v.items[i], out);
                out += ": ";
                append_repr(v.items[i + 1], out);
            }
            out += '}';
            break;
    }
}

std::string repr(const value& v) {
    std::string out;
    append_repr(v, out);
    if (out.size() > max_repr) {
        out.resize(max_repr);
        out += "...";
    }
    return out;
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }
int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

class header_parser {
public:
    header_parser(std::string_view text, std::string_view name) : s_(text), name_(name) {}

    value parse() {
        skip_space();
        value v = parse_value(0);
        skip_space();
        if (!at_end()) fail_here("unexpected " + describe_here() + " after the header dict");
        return v;
    }

private:
    std::string_view s_;
    std::string_view name_;
    std::size_t pos_ = 0;

    [[noreturn]] void fail_here(std::string_view what) const {
        fail(name_, "invalid header: " + std::string(what) + " at header offset " + std::to_string(pos_));
    }
    bool at_end() const { return pos_ >= s_.size(); }
    char peek() const { return s_[pos_]; }
    std::string describe_here() const {
        return at_end() ? std::string("end of header") : "character " + py_quote(s_.substr(pos_, 1));
    }
    void skip_space() {
        while (!at_end()) {
            if (is_space(peek())) {
                ++pos_;
            } else if (peek() == '\\' && pos_ + 1 < s_.size() && s_[pos_ + 1] == '\n') {
                pos_ += 2;  // explicit line continuation
            } else {
                break;
            }
        }
    }

    value parse_value(int depth) {
        if (depth > max_nesting) fail_here("nesting deeper than " + std::to_string(max_nesting) + " levels");
        if (at_end()) fail_here("expected a value but found end of header");
        const char c = peek();
        if (c == '\'' || c == '"') return parse_string();
        if (c == '(') return parse_parenthesized(depth);
        if (c == '[') return parse_list(depth);
        if (c == '{') return parse_dict(depth);
        if (c == '-' || c == '+' || is_digit(c)) return parse_integer();
        if (is_name_start(c)) return parse_name();
        fail_here("expected a value but found " + describe_here());
    }

    value parse_string() {
        const char quote = s_[pos_++];
        value v;
        v.k = value::kind::str;
        for (;;) {
            if (at_end()) fail_here("unterminated string");
            const char c = s_[pos_];
            if (c == quote) {
                ++pos_;
                return v;
            }
            if (c == '\n' || c == '\r') fail_here("newline inside a string");
            if (c != '\\') {
                v.text += c;
                ++pos_;
                continue;
            }
            if (pos_ + 1 >= s_.size()) fail_here("unterminated string");
            const char e = s_[pos_ + 1];
            pos_ += 2;
            switch (e) {
                case '\n':
                    break;  // line continuation inside a string
                case '\\':
                case '\'':
                case '"':
                    v.text += e;
                    break;
                case 'n':
                    v.text += '\n';
                    break;
                case 't':
                    v.text += '\t';
                    break;
                case 'r':
                    v.text += '\r';
                    break;
                case 'a':
                    v.text += '\a';
                    break;
                case 'b':
                    v.text += '\b';
                    break;
                case 'f':
                    v.text += '\f';
                    break;
                case 'v':
                    v.text += '\v';
                    break;
                case 'x': {
                    const int hi = pos_ < s_.size() ? hex_value(s_[pos_]) : -1;
                    const int lo = pos_ + 1 < s_.size() ? hex_value(s_[pos_ + 1]) : -1;
                    if (hi < 0 || lo < 0) fail_here("invalid \\x escape in string");
                    v.text += static_cast<char>(static_cast<unsigned char>(hi * 16 + lo));
                    pos_ += 2;
                    break;
                }
                default:  // Python keeps unknown escapes verbatim; octal/\u/\N are rare enough to keep too
                    v.text += '\\';
                    v.text += e;
                    break;
            }
        }
    }

    value parse_integer() {
        bool negative = false;
        if (peek() == '-' || peek() == '+') {
            negative = peek() == '-';
            ++pos_;
            skip_space();
            if (at_end() || !is_digit(peek())) fail_here("expected digits after a sign");
        }
        const std::size_t start = pos_;
        while (!at_end() && is_digit(peek())) ++pos_;
        std::string_view digits = s_.substr(start, pos_ - start);
        if (!at_end() && (peek() == 'L' || peek() == 'l')) ++pos_;  // Python 2 long literal, e.g. (3L, 4L)
        if (!at_end() && (is_name_char(peek()) || peek() == '.')) {
            fail_here("unsupported number syntax (only decimal integers are allowed)");
        }
        while (digits.size() > 1 && digits.front() == '0') digits.remove_prefix(1);
        value v;
        v.k = value::kind::integer;
        if (negative && digits != "0") v.text = "-";
        v.text.append(digits);
        return v;
    }

    value parse_name() {
        const std::size_t start = pos_;
        while (!at_end() && is_name_char(peek())) ++pos_;
        const std::string_view word = s_.substr(start, pos_ - start);
        value v;
        if (word == "True" || word == "False") {
            v.k = value::kind::boolean;
            v.flag = word == "True";
        } else if (word == "None") {
            v.k = value::kind::none;
        } else {
            pos_ = start;
            fail_here("unexpected name " + py_quote(word) + " (only literals are allowed)");
        }
        return v;
    }

    // Parses ", item, item, ...)" after the first element of a tuple or list, up to `close`.
    void parse_rest(value& seq, char close, int depth) {
        for (;;) {
            skip_space();
            if (at_end()) fail_here(std::string("expected ',' or '") + close + "' but found end of header");
            if (peek() == close) {
                ++pos_;
                return;
            }
            if (peek() != ',') fail_here(std::string("expected ',' or '") + close + "' but found " + describe_here());
            ++pos_;
            skip_space();
            if (!at_end() && peek() == close) {
                ++pos_;
                return;
            }
            seq.items.push_back(parse_value(depth + 1));
        }
    }

    value parse_parenthesized(int depth) {
        ++pos_;
        skip_space();
        value v;
        v.k = value::kind::tuple;
        if (!at_end() && peek() == ')') {
            ++pos_;
            return v;  // ()
        }
        value first = parse_value(depth + 1);
        skip_space();
        if (!at_end() && peek() == ')') {
            ++pos_;
            return first;  // (x) is x, not a tuple
        }
        v.items.push_back(std::move(first));
        parse_rest(v, ')', depth);
        return v;
    }

    value parse_list(int depth) {
        ++pos_;
        skip_space();
        value v;
        v.k = value::kind::list;
        if (!at_end() && peek() == ']') {
            ++pos_;
            return v;
        }
        v.items.push_back(parse_value(depth + 1));
        parse_rest(v, ']', depth);
        return v;
    }

    value parse_dict(int depth) {
        ++pos_;
        value v;
        v.k = value::kind::dict;
        skip_space();
        if (!at_end() && peek() == '}') {
            ++pos_;
            return v;
        }
        for (;;) {
            v.items.push_back(parse_value(depth + 1));
            skip_space();
            if (at_end() || peek() != ':') fail_here("expected ':' after a dict key but found " + describe_here());
            ++pos_;
            skip_space();
            v.items.push_back(parse_value(depth + 1));
            skip_space();
            if (at_end()) fail_here("expected ',' or '}' but found end of header");
            if (peek() == '}') {
                ++pos_;
                return v;
            }
            if (peek() != ',') fail_here("expected ',' or '}' but found " + describe_here());
            ++pos_;
            skip_space();
            if (!at_end() && peek() == '}') {
                ++pos_;
                return v;
            }
        }
    }
};

bool valid_utf8(std::string_view s) {
    std::size_t i = 0;
    while (i < s.size()) {
        const auto c = static_cast<unsigned char>(s[i]);
        std::size_t len = 0;
        std::uint32_t cp = 0;
        if (c < 0x80) {
            ++i;
            continue;
        } else if (c >= 0xc2 && c <= 0xdf) {
            len = 2;
            cp = c & 0x1fu;
        } else if (c >= 0xe0 && c <= 0xef) {
            len = 3;
            cp = c & 0x0fu;
        } else if (c >= 0xf0 && c <= 0xf4) {
            len = 4;
            cp = c & 0x07u;
        } else {
            return false;
        }
        if (s.size() - i < len) return false;
        for (std::size_t k = 1; k < len; ++k) {
            const auto cc = static_cast<unsigned char>(s[i + k]);
            if ((cc & 0xc0u) != 0x80u) return false;
            cp = (cp << 6) | (cc & 0x3fu);
        }
        if ((len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
            return false;
        }
        i += len;
    }
    return true;
}

// Parses a decimal digit string (as produced by header_parser) into a size_t.
bool to_size(std::string_view digits, std::size_t& out) {
    std::size_t n = 0;
    for (const char c : digits) {
        const auto d = static_cast<std::size_t>(c - '0');
        if (n > (size_max - d) / 10) return false;
        n = n * 10 + d;
    }
    out = n;
    return true;
}

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
    }
    return "";
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

std::FILE* open_file(const fs::path& path, const char* mode) {
#if defined(_WIN32)
    std::wstring wmode(mode, mode + std::strlen(mode));
    return _wfopen(path.c_str(), wmode.c_str());
#else
    return std::fopen(path.c_str(), mode);
#endif
}

/// A new file opened for binary writing; fails (errno EEXIST) if `path` exists. fopen's "wbx":
/// except on Windows, where msvcrt.dll (MinGW-w64's default C runtime) ignores the 'x' and
/// would truncate an existing file, so the file is created with _O_EXCL instead.
std::FILE* create_new_file(const fs::path& path) {
#if defined(_WIN32)
    const int fd = _wopen(path.c_str(), _O_WRONLY | _O_CREAT | _O_EXCL | _O_BINARY, _S_IREAD | _S_IWRITE);
    if (fd < 0) return nullptr;
    std::FILE* f = _fdopen(fd, "wb");
    if (!f) {
        const int err = errno;
        _close(fd);
        errno = err;
    }
    return f;
#else
    return std::fopen(path.c_str(), "wbx");
#endif
}

struct file_closer {
    void operator()(std::FILE* f) const noexcept { std::fclose(f); }
};
using file_ptr = std::unique_ptr<std::FILE, file_closer>;

}  // namespace

std::string_view dtype_name(dtype t) noexcept {
    switch (t) {
        case dtype::f32:
            return "float32";
        case dtype::f64:
            return "float64";
        case dtype::b1:
            return "bool";
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
    }
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

namespace {

// Checks the magic string, the version and the header length field; returns the offset of the
// first data byte (preamble + header). Needs only the first 12 bytes (fewer: truncated).
std::size_t header_end(std::span<const std::byte> bytes, std::string_view name) {
    const std::size_t n = bytes.size();
    const auto byte_at = [&bytes](std::size_t i) { return std::to_integer<unsigned>(bytes[i]); };

    for (std::size_t i = 0; i < std::min(n, sizeof magic); ++i) {
        if (byte_at(i) != magic[i]) fail(name, "not a .npy file (missing \\x93NUMPY magic string)");
    }
    if (n < sizeof magic + 2) {
        fail(name, "truncated: file ends inside the .npy preamble after " + std::to_string(n) + " bytes");
    }
    const unsigned major = byte_at(6);
    const unsigned minor = byte_at(7);
    std::size_t length_bytes = 0;
    if (major == 1 && minor == 0) {
        length_bytes = 2;
    } else if ((major == 2 || major == 3) && minor == 0) {
        length_bytes = 4;
    } else {
        fail(name, "unsupported .npy format version " + std::to_string(major) + "." + std::to_string(minor) +
                       " (expected 1.0, 2.0 or 3.0)");
    }
    const std::size_t header_start = sizeof magic + 2 + length_bytes;
    if (n < header_start) {
        fail(name, "truncated: file ends inside the .npy preamble after " + std::to_string(n) + " bytes");
    }
    std::size_t header_len = 0;
    for (std::size_t i = 0; i < length_bytes; ++i) header_len |= std::size_t{byte_at(8 + i)} << (8 * i);
    return header_start + header_len;
}

// What a header describes.
struct layout {
    dtype type = dtype::f32;
    bool swap = false;  // big-endian data
    std::vector<std::size_t> dims;
    std::size_t data_start = 0;  // offset of the first data byte
    std::size_t data_bytes = 0;  // what the shape and dtype need
};

// Parses the preamble and the header; `bytes` must hold at least all of them (else: truncated).
layout parse_header(std::span<const std::byte> bytes, std::string_view name) {
    const std::size_t n = bytes.size();
    const std::size_t end = header_end(bytes, name);
    const unsigned major = std::to_integer<unsigned>(bytes[6]);
    const std::size_t header_start = major == 1 ? 10 : 12;
    const std::size_t header_len = end - header_start;
    if (header_len > n - header_start) {
        fail(name, "truncated: header is declared as " + std::to_string(header_len) + " bytes but only " +
                       std::to_string(n - header_start) + " follow");
    }
    const std::string_view header(reinterpret_cast<const char*>(bytes.data()) + header_start, header_len);
    if (major == 3 && !valid_utf8(header)) fail(name, "invalid header: not valid UTF-8 (format 3.0)");

    const value dict = header_parser(header, name).parse();
    if (dict.k != value::kind::dict) fail(name, "invalid header: expected a dict, found " + repr(dict));
    const value* descr = nullptr;
    const value* fortran = nullptr;
    const value* shape = nullptr;
    for (std::size_t i = 0; i + 1 < dict.items.size(); i += 2) {
        const value& key = dict.items[i];
        const value** slot = nullptr;
        if (key.k == value::kind::str) {
            if (key.text == "descr") slot = &descr;
            if (key.text == "fortran_order") slot = &fortran;
            if (key.text == "shape") slot = &shape;
        }
        if (slot == nullptr) {
            fail(name,
                 "invalid header: unexpected key " + repr(key) + " (expected 'descr', 'fortran_order' and 'shape')");
        }
        if (*slot != nullptr) fail(name, "invalid header: duplicate key " + repr(key));
        *slot = &dict.items[i + 1];
    }
    if (descr == nullptr) fail(name, "invalid header: missing key 'descr'");
    if (fortran == nullptr) fail(name, "invalid header: missing key 'fortran_order'");
    if (shape == nullptr) fail(name, "invalid header: missing key 'shape'");

    dtype type = dtype::f32;
    bool swap = false;
    {
        const std::string_view d = descr->k == value::kind::str ? std::string_view(descr->text) : std::string_view();
        if (d == "<f4" || d == "=f4") {
            type = dtype::f32;
        } else if (d == ">f4") {
            type = dtype::f32;
            swap = true;
        } else if (d == "<f8" || d == "=f8") {
            type = dtype::f64;
        } else if (d == ">f8") {
            type = dtype::f64;
            swap = true;
        } else if (d == "|b1" || d == "<b1" || d == ">b1" || d == "=b1") {
            type = dtype::b1;
        } else {
            fail(name, "unsupported dtype " + repr(*descr) + " (expected float32, float64 or bool)");
        }
    }

    if (fortran->k != value::kind::boolean) {
        fail(name, "invalid header: 'fortran_order' must be True or False, found " + repr(*fortran));
    }
    if (fortran->flag) fail(name, "Fortran-order arrays are not supported; save with np.ascontiguousarray");

    if (shape->k != value::kind::tuple) {
        fail(name, "invalid header: 'shape' must be a tuple of non-negative integers, found " + repr(*shape));
    }
    std::vector<std::size_t> dims;
    dims.reserve(shape->items.size());
    for (const value& dim : shape->items) {
        if (dim.k != value::kind::integer) {
            fail(name, "invalid header: 'shape' must be a tuple of non-negative integers, found " + repr(*shape));
        }
        if (dim.text.front() == '-') fail(name, "invalid header: negative dimension in shape " + repr(*shape));
        std::size_t d = 0;
        if (!to_size(dim.text, d)) fail(name, "invalid header: dimension too large in shape " + repr(*shape));
        dims.push_back(d);
    }

    const std::size_t item = itemsize(type);
    std::size_t count = 0;
    if (!element_count(dims, item, count)) {
        fail(name,
             "array of shape " + shape_brief(dims) + " and dtype " + std::string(dtype_name(type)) + " is too large");
    }
    layout l;
    l.type = type;
    l.swap = swap;
    l.dims = std::move(dims);
    l.data_start = end;
    l.data_bytes = count * item;
    return l;
}

}  // namespace

array parse(std::span<const std::byte> bytes, std::string_view name) {
    layout l = parse_header(bytes, name);
    const std::size_t need = l.data_bytes;
    const std::size_t have = bytes.size() - l.data_start;
    if (have < need) {
        fail(name, "truncated: expected " + std::to_string(need) + " bytes of data, found " + std::to_string(have));
    }
    if (have > need) {
        fail(name, "unexpected trailing data: expected " + std::to_string(need) + " bytes of data, found " +
                       std::to_string(have));
    }

    array a;
    a.name = std::string(name);
    a.shape = std::move(l.dims);
    a.type = l.type;
    const std::size_t item = itemsize(l.type);
    const auto payload = bytes.subspan(l.data_start);
    a.data.assign(payload.begin(), payload.end());
    if (l.swap) {
        for (auto it = a.data.begin(); it != a.data.end(); it += static_cast<std::ptrdiff_t>(item)) {
            std::reverse(it, it + static_cast<std::ptrdiff_t>(item));
        }
    }
    return a;
}

namespace {

// Appends up to `count` bytes from `f` to `buf`, in pieces of at most 64 MiB, so that a header
// declaring more than the file holds costs no more memory than the file. Returns the bytes read.
std::size_t read_more(std::FILE* f, std::vector<std::byte>& buf, std::size_t count, std::string_view name) {
    constexpr std::size_t piece = std::size_t{64} << 20;
    std::size_t got = 0;
    while (got < count) {
        const std::size_t want = std::min(piece, count - got);
        const std::size_t at = buf.size();
        buf.resize(at + want);
        errno = 0;
        const std::size_t n = std::fread(buf.data() + at, 1, want, f);
        buf.resize(at + n);
        got += n;
        if (n < want) {
            if (std::ferror(f)) fail(name, "read error: " + os_message(errno));
            break;  // end of file
        }
    }
    return got;
}

// Reads a .npy file, checking as it goes: the magic string and the preamble first (a file that
// is not .npy, /dev/zero included, fails after 12 bytes), then the header, then exactly the data
// the header declares and one byte more, to tell trailing data. Nothing is read past that.
std::vector<std::byte> read_file(const fs::path& path, std::string_view name) {
    errno = 0;
    file_ptr f(open_file(path, "rb"));
    if (!f) fail(name, "cannot open for reading: " + os_message(errno));
    std::vector<std::byte> buf;
    read_more(f.get(), buf, 12, name);  // magic, version, header length (2 or 4 bytes)
    const std::size_t end = header_end(buf, name);
    if (end > buf.size()) read_more(f.get(), buf, end - buf.size(), name);
    const layout l = parse_header(buf, name);                  // throws if the header is truncated or bad
    if (buf.size() > l.data_start + l.data_bytes) return buf;  // trailing data: parse() says so
    const std::size_t want = l.data_start + l.data_bytes + 1 - buf.size();
    std::error_code size_ec;
    const std::uintmax_t file_size = fs::file_size(path, size_ec);
    try {
        // A regular file that holds the data: one allocation of the whole (failing at once if it
        // cannot be had). Otherwise read_more grows the buffer as the data comes.
        if (!size_ec && file_size >= l.data_start + l.data_bytes) buf.reserve(l.data_start + l.data_bytes + 1);
    } catch (const std::bad_alloc&) {
        fail(name, "out of memory: the header declares " + std::to_string(l.data_bytes) + " bytes of data (shape " +
                       shape_brief(l.dims) + ", " + std::string(dtype_name(l.type)) + ")");
    }
    if (read_more(f.get(), buf, want, name) == want) {
        // More than the header declares: say how much, when the file's size is known.
        std::error_code ec;
        const std::uintmax_t size = fs::file_size(path, ec);
        if (!ec && size > l.data_start + l.data_bytes) {
            fail(name, "unexpected trailing data: expected " + std::to_string(l.data_bytes) + " bytes of data, found " +
                           std::to_string(size - l.data_start));
        }
        fail(name, "unexpected trailing data after the " + std::to_string(l.data_bytes) + " bytes of data");
    }
    return buf;
}

}  // namespace

array read(const std::filesystem::path& path) {
    const std::string name = path_to_utf8(path);
    try {
        const std::vector<std::byte> bytes = read_file(path, name);
        return parse(bytes, name);
    } catch (const std::bad_alloc&) {
        std::error_code ec;
        const std::uintmax_t size = fs::file_size(path, ec);
        fail(name, "out of memory reading the file" + (ec ? std::string() : " (" + std::to_string(size) + " bytes)"));
    }
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

namespace {

template <class T>
void write_named(const std::filesystem::path& path, std::span<const std::size_t> shape, std::span<const T> data) {
    const std::string name = path_to_utf8(path);
    const std::vector<std::byte> bytes = serialize_named(shape, data, name);
    const fs::path filename = path.filename();
    if (filename.empty() || filename == "." || filename == "..") fail(name, "cannot write: not a file name");

    // Create a fresh temporary file next to the target ("wx": fail if it exists).
    static std::atomic<std::uint64_t> counter{0};
    fs::path tmp;
    file_ptr f;
    for (int attempt = 0; !f; ++attempt) {
        const auto now = static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
        std::uint64_t tag = now ^ (counter.fetch_add(1) * 0x9e3779b97f4a7c15u) ^
                            static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(&tmp));
        char hex[17];
        std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(tag));
        // A fixed-length name, whatever the target's: "." + filename + suffix could exceed NAME_MAX.
        tmp = path.parent_path() / path_from_utf8(std::string(".npy-") + hex + ".tmp");
        errno = 0;
        f.reset(create_new_file(tmp));
        if (!f && (errno != EEXIST || attempt >= 100)) {
            fail(name, "cannot create temporary file " + py_quote(path_to_utf8(tmp)) + ": " + os_message(errno));
        }
    }

    const auto abandon = [&](std::string what, int err) {
        f.reset();
        std::error_code ignored;
        fs::remove(tmp, ignored);
        fail(name, what + ": " + os_message(err));
    };
    errno = 0;
    if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), f.get()) != bytes.size()) {
        abandon("write error", errno);
    }
    if (std::fflush(f.get()) != 0) abandon("write error", errno);
#if defined(_WIN32)
    if (_commit(_fileno(f.get())) != 0) abandon("cannot sync", errno);
#else
    if (::fsync(::fileno(f.get())) != 0) abandon("cannot sync", errno);
#endif
    if (std::fclose(f.release()) != 0) abandon("write error", errno);

    std::error_code ec;
    fs::rename(tmp, path, ec);
    if (ec) {
        std::error_code ignored;
        fs::remove(tmp, ignored);
        fail(name, "cannot replace file with " + py_quote(path_to_utf8(tmp)) + ": " + ec.message());
    }
}

}  // namespace

void write(const std::filesystem::path& path, std::span<const std::size_t> shape, std::span<const float> data) {
    write_named(path, shape, data);
}

void write(const std::filesystem::path& path, std::span<const std::size_t> shape, std::span<const double> data) {
    write_named(path, shape, data);
}

}  // namespace qkv::npy
