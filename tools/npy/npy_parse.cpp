// qkv::npy, the parser: the .npy preamble and its header, a Python dict literal.
#include "npy_detail.hpp"

#include <algorithm>
#include <cstdint>
#include <utility>

namespace qkv::npy {

using namespace detail;

namespace {

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

}  // namespace

namespace detail {

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
        } else if (d == "<i4" || d == "=i4") {
            type = dtype::i4;
        } else if (d == ">i4") {
            type = dtype::i4;
            swap = true;
        } else {
            fail(name, "unsupported dtype " + repr(*descr) + " (expected float32, float64, bool or int32)");
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

}  // namespace detail

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

}  // namespace qkv::npy
