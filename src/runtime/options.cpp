// The generic side of sdpa_options' field list (qkv/runtime/options.hpp): what every field gets
// without naming it, by its type: bytes, text, comparison.
#include "qkv/runtime/options.hpp"

#include <array>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>

#include "qkv/runtime/error.hpp"

namespace qkv {
namespace {

template <class T>
struct is_optional : std::false_type {};
template <class T>
struct is_optional<std::optional<T>> : std::true_type {
    using value_type = T;
};

// ---- bytes ----

/// The bytes of one value: a bool one byte, an enum four, integers and floats their own width,
/// little-endian on every host.
template <class T>
constexpr std::size_t value_bytes() {
    if constexpr (std::is_same_v<T, bool>)
        return 1;
    else if constexpr (std::is_enum_v<T>)
        return 4;
    else
        return sizeof(T);
}

template <class T>
void put_value(std::vector<std::byte>& out, const T& value) {
    std::array<unsigned char, 8> raw{};
    std::uint64_t bits = 0;
    if constexpr (std::is_same_v<T, bool>) {
        bits = value ? 1 : 0;
    } else if constexpr (std::is_enum_v<T>) {
        bits = static_cast<std::uint32_t>(static_cast<std::int32_t>(value));
    } else if constexpr (std::is_same_v<T, float>) {
        std::uint32_t b = 0;
        std::memcpy(&b, &value, 4);
        bits = b;
    } else {
        static_assert(std::is_integral_v<T>);
        bits = static_cast<std::uint64_t>(value);
    }
    for (std::size_t i = 0; i < value_bytes<T>(); ++i) raw[i] = static_cast<unsigned char>(bits >> (8 * i));
    for (std::size_t i = 0; i < value_bytes<T>(); ++i) out.push_back(static_cast<std::byte>(raw[i]));
}

template <class T>
T get_value(std::span<const std::byte> in, std::size_t& at) {
    std::uint64_t bits = 0;
    for (std::size_t i = 0; i < value_bytes<T>(); ++i)
        bits |= static_cast<std::uint64_t>(std::to_integer<unsigned char>(in[at + i])) << (8 * i);
    at += value_bytes<T>();
    if constexpr (std::is_same_v<T, bool>) {
        return bits != 0;
    } else if constexpr (std::is_enum_v<T>) {
        return static_cast<T>(static_cast<std::int32_t>(static_cast<std::uint32_t>(bits)));
    } else if constexpr (std::is_same_v<T, float>) {
        const auto b = static_cast<std::uint32_t>(bits);
        float f = 0;
        std::memcpy(&f, &b, 4);
        return f;
    } else {
        return static_cast<T>(bits);
    }
}

template <class T>
void put_field(std::vector<std::byte>& out, const T& value) {
    if constexpr (is_optional<T>::value) {
        put_value(out, value.has_value());
        put_value(out, value.value_or(typename is_optional<T>::value_type{}));
    } else {
        put_value(out, value);
    }
}

template <class T>
void get_field(std::span<const std::byte> in, std::size_t& at, T& value) {
    if constexpr (is_optional<T>::value) {
        const bool set = get_value<bool>(in, at);
        const auto v = get_value<typename is_optional<T>::value_type>(in, at);
        value = set ? T(v) : T();
    } else {
        value = get_value<T>(in, at);
    }
}

// ---- text ----

template <class T>
std::string value_text(const T& value) {
    if constexpr (is_optional<T>::value) {
        return value ? value_text(*value) : std::string();
    } else if constexpr (std::is_same_v<T, bool>) {
        return value ? "true" : "false";
    } else if constexpr (std::is_enum_v<T>) {
        const std::string_view name = name_of(value);
        return name.empty() ? std::to_string(static_cast<int>(value)) : std::string(name);
    } else if constexpr (std::is_same_v<T, float>) {
        char text[32];
        std::snprintf(text, sizeof text, "%.9g", static_cast<double>(value));
        return text;
    } else {
        return std::to_string(value);
    }
}

[[noreturn]] void refuse(const std::string& why) { throw invalid_argument(why); }

/// A float32, strictly: a whole decimal or hexadecimal number, finite as a float32, not a
/// nonzero value that rounds to 0.
float parse_float(std::string_view text) {
    const std::string s(text);
    if (s.empty() || std::isspace(static_cast<unsigned char>(s.front()))) refuse("expected a number");
    char* end = nullptr;
    const double value = std::strtod(s.c_str(), &end);
    if (end == s.c_str() || *end != '\0') refuse("expected a number");
    if (!std::isfinite(value)) refuse("must be finite");
    if (std::fabs(value) > static_cast<double>(std::numeric_limits<float>::max()))
        refuse("beyond the float32 range (it must be finite as a float32, at most 3.4028235e38)");
    const float f = static_cast<float>(value);
    if (value != 0 && f == 0) refuse("rounds to 0 as a float32");
    return f;
}

std::int64_t parse_integer(std::string_view text) {
    std::int64_t v = 0;
    const char* end = text.data() + text.size();
    const auto [at, ec] = std::from_chars(text.data(), end, v);
    if (text.empty() || ec != std::errc() || at != end) refuse("expected a whole number");
    return v;
}

template <class T>
T parse_value(std::string_view text, const option_field& field) {
    if constexpr (std::is_same_v<T, bool>) {
        if (text == "yes" || text == "true" || text == "1") return true;
        if (text == "no" || text == "false" || text == "0") return false;
        refuse("expected no or yes");
    } else if constexpr (std::is_enum_v<T>) {
        if (const auto v = parse_name<T>(text)) return *v;
        refuse("expected one of " + names_joined<T>(", "));
    } else if constexpr (std::is_same_v<T, float>) {
        const float f = parse_float(text);
        if (field.rule == option_rule::off_or_positive && !(f > 0))
            refuse("must be above 0 (leave " + std::string(field.flag) + " out to turn it off)");
        if (field.rule == option_rule::probability && !(f >= 0 && f < 1)) refuse("must be at least 0 and below 1");
        return f;
    } else if constexpr (std::is_unsigned_v<T>) {
        T v = 0;
        const char* end = text.data() + text.size();
        const auto [at, ec] = std::from_chars(text.data(), end, v);
        if (text.empty() || ec != std::errc() || at != end) refuse("expected a whole number from 0 to 2^64 - 1");
        return v;
    } else {
        const std::int64_t v = parse_integer(text);
        if (field.rule == option_rule::window_side && v < -1) refuse("each side must be -1 (unbounded) or at least 0");
        if (field.rule == option_rule::position && (v > (std::int64_t{1} << 62) || v < -(std::int64_t{1} << 62)))
            refuse("must be within +-2^62");
        return v;
    }
}

}  // namespace

std::vector<std::byte> to_bytes(const sdpa_options& o) {
    std::vector<std::byte> out;
    visit_options(o, [&](const option_field&, const auto& value) { put_field(out, value); });
    return out;
}

std::size_t options_bytes() {
    static const std::size_t n = to_bytes(sdpa_options{}).size();
    return n;
}

sdpa_options options_from_bytes(std::span<const std::byte> bytes) {
    if (bytes.size() != options_bytes())
        throw invalid_argument("options_from_bytes: " + std::to_string(bytes.size()) + " bytes, expected " +
                               std::to_string(options_bytes()));
    sdpa_options o;
    std::size_t at = 0;
    visit_options(o, [&](const option_field&, auto& value) { get_field(bytes, at, value); });
    return o;
}

std::vector<const option_field*> changed_fields(const sdpa_options& o) {
    std::vector<const option_field*> out;
    visit_options(o, sdpa_options{}, [&](const option_field& f, const auto& a, const auto& b) {
        if (!(a == b)) out.push_back(&f);
    });
    return out;
}

bool same_options(const sdpa_options& a, const sdpa_options& b) {
    // Bitwise where floats are compared (a NaN option equals itself: the bytes are the value).
    return to_bytes(a) == to_bytes(b);
}

std::string field_text(const sdpa_options& o, const option_field& field) {
    std::string out;
    visit_options(o, [&](const option_field& f, const auto& value) {
        if (&f == &field || f.name == field.name) out = value_text(value);
    });
    return out;
}

void set_field(sdpa_options& o, const option_field& field, std::string_view text) {
    if (field.sdpa == sdpa_flag::pair) {
        // "LEFT,RIGHT": this field and the next.
        const std::size_t comma = text.find(',');
        const std::string want = "expected LEFT,RIGHT (two integers; -1 leaves a side unbounded)";
        if (comma == std::string_view::npos || text.find(',', comma + 1) != std::string_view::npos) refuse(want);
        const option_field* second = nullptr;
        for (std::size_t i = 0; i + 1 < std::size(sdpa_option_fields); ++i)
            if (sdpa_option_fields[i].name == field.name) second = &sdpa_option_fields[i + 1];
        std::int64_t sides[2] = {0, 0};
        for (int s = 0; s < 2; ++s) {
            const std::string_view part = s == 0 ? text.substr(0, comma) : text.substr(comma + 1);
            try {
                sides[s] = parse_integer(part);
            } catch (const invalid_argument&) {
                refuse(want);
            }
        }
        for (const std::int64_t side : sides)
            if (side < -1) refuse("each side must be -1 (unbounded) or at least 0");
        visit_options(o, [&](const option_field& f, auto& value) {
            using T = std::remove_cvref_t<decltype(value)>;
            if constexpr (std::is_same_v<T, std::int64_t>) {
                if (f.name == field.name) value = sides[0];
                if (second && f.name == second->name) value = sides[1];
            }
        });
        return;
    }
    visit_options(o, [&](const option_field& f, auto& value) {
        if (f.name != field.name) return;
        using T = std::remove_cvref_t<decltype(value)>;
        if constexpr (is_optional<T>::value)
            value = parse_value<typename is_optional<T>::value_type>(text, f);
        else
            value = parse_value<T>(text, f);
    });
}

void set_switch(sdpa_options& o, const option_field& field, bool on) {
    visit_options(o, [&](const option_field& f, auto& value) {
        using T = std::remove_cvref_t<decltype(value)>;
        if constexpr (std::is_same_v<T, bool>)
            if (f.name == field.name) value = on;
    });
}

bool holds_bool(const option_field& field) {
    bool b = false;
    const sdpa_options defaults;
    visit_options(defaults, [&](const option_field& f, const auto& value) {
        if (f.name == field.name) b = std::is_same_v<std::remove_cvref_t<decltype(value)>, bool>;
    });
    return b;
}

const option_field* find_field(std::string_view name) {
    for (const option_field& f : sdpa_option_fields)
        if (f.name == name) return &f;
    return nullptr;
}

}  // namespace qkv
