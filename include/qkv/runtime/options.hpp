// qkv::sdpa_options, declared once: its fields are the rows of qkv/runtime/sdpa_options.def, and
// everything that lists them (validation, the MPI wire and fingerprint, the command-line flags, the
// bench's labels and JSON) does so through visit_options() or sdpa_option_fields, never by naming
// them. What each option means is written in qkv/runtime/sdpa.hpp.
//
//   qkv::sdpa_options o{.causal = true, .softcap = 30.f};   // an aggregate, in the rows' order
//   qkv::visit_options(o, [](const qkv::option_field& f, const auto& value) { ... });
//   std::vector<std::byte> wire = qkv::to_bytes(o);        // and qkv::options_from_bytes(wire)
//
// Also here: the names of the enums the options take (to_string, parse), one table each.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "qkv/causal.hpp"
#include "qkv/runtime/element_type.hpp"
#include "qkv/runtime/export.hpp"
#include "qkv/runtime/problem.hpp"

namespace qkv {

/// Where query i sits among the keys, for the causal rule, the window and ALiBi's distances: the
/// core's qkv::position_alignment (qkv/causal.hpp) under the run-time API's name.
using causal_alignment = position_alignment;

// ---- the names of the options' enums -----------------------------------------------------------

/// One name of an enum value. An alias is accepted by parse_name, never written by to_string.
template <class E>
struct enum_name {
    std::string_view name;
    E value;
    bool alias = false;
};

// The deprecated kernel names are aliases here: naming them is not a use of the enumerators.
inline constexpr enum_name<causal_alignment> causal_alignment_names[] = {
    {"top_left", causal_alignment::top_left}, {"bottom_right", causal_alignment::bottom_right}};
inline constexpr enum_name<precision> precision_names[] = {{"fp32", precision::fp32}, {"fp16", precision::fp16}};
inline constexpr enum_name<kernel_family> kernel_family_names[] = {
    {"auto", kernel_family::automatic},          {"row_tiles", kernel_family::row_tiles},
    {"block_tiles", kernel_family::block_tiles}, {"coopmat", kernel_family::coopmat},
    {"cpu", kernel_family::row_tiles, true},     {"gpu", kernel_family::block_tiles, true}};
inline constexpr enum_name<element_type> element_type_names[] = {
    {"f32", element_type::f32}, {"f16", element_type::f16}, {"q8_0", element_type::q8_0}, {"q4_0", element_type::q4_0}};

/// The name table of an enum the options take.
template <class E>
constexpr std::span<const enum_name<E>> names_of() {
    if constexpr (std::is_same_v<E, causal_alignment>)
        return causal_alignment_names;
    else if constexpr (std::is_same_v<E, precision>)
        return precision_names;
    else if constexpr (std::is_same_v<E, kernel_family>)
        return kernel_family_names;
    else
        return element_type_names;
}

/// Whether `E` is an enum with a name table.
template <class E>
inline constexpr bool has_names = std::is_same_v<E, causal_alignment> || std::is_same_v<E, precision> ||
                                  std::is_same_v<E, kernel_family> || std::is_same_v<E, element_type>;

/// The name of `value` ("" for a value outside the enum).
template <class E>
requires has_names<E>
constexpr std::string_view name_of(E value) {
    for (const enum_name<E>& n : names_of<E>())
        if (n.value == value && !n.alias) return n.name;
    return {};
}

/// The value named `text`: a name or alias of the table, letter case and '-' for '_' ignored
/// ("top-left", "Q8_0"), or none.
template <class E>
requires has_names<E>
constexpr std::optional<E> parse_name(std::string_view text) {
    const auto same = [](char a, char b) {
        const auto fold = [](char c) {
            return c == '-' ? '_' : (c >= 'A' && c <= 'Z') ? static_cast<char>(c + 32) : c;
        };
        return fold(a) == fold(b);
    };
    for (const enum_name<E>& n : names_of<E>()) {
        if (n.name.size() != text.size()) continue;
        bool match = true;
        for (std::size_t i = 0; i < text.size() && match; ++i) match = same(n.name[i], text[i]);
        if (match) return n.value;
    }
    return std::nullopt;
}

/// The names of an enum's values, aliases left out, joined by `separator` ("f32, f16, q8_0, q4_0").
template <class E>
requires has_names<E> std::string names_joined(std::string_view separator) {
    std::string out;
    for (const enum_name<E>& n : names_of<E>()) {
        if (n.alias) continue;
        if (!out.empty()) out += separator;
        out += n.name;
    }
    return out;
}

// ---- the field list ------------------------------------------------------------------------------

/// What validate() checks of a field (sdpa_options.def).
enum class option_rule {
    any,              ///< every value (a bool)
    finite,           ///< a finite float
    off_or_positive,  ///< 0 (off), or finite and above 0
    window_side,      ///< -1 (unbounded) or at least 0
    position,         ///< within +-2^62
    known,            ///< one of the enum's values
    probability,      ///< at least 0 and below 1 (dropout_p)
};

/// How `qkv sdpa` takes a field.
enum class sdpa_flag {
    none,    ///< not offered
    value,   ///< its value (a switch for a bool)
    output,  ///< a bool set by a file flag naming where its result goes
    pair,    ///< LEFT,RIGHT: this field and the next
    paired,  ///< set by the field before
};

/// How `qkv bench` takes a field.
enum class bench_flag {
    none,    ///< not offered
    one,     ///< one value (a switch for a bool)
    sweep,   ///< several values, each a row of the sweep: a comma-separated list (no|yes for a bool; a
             ///< pair's flag repeated)
    paired,  ///< set by the field before
};

/// One row of sdpa_options.def.
struct option_field {
    std::string_view name;  ///< the member's name: messages, labels, JSON keys
    option_rule rule = option_rule::any;
    std::string_view flag;        ///< "--softcap"; "" for none
    std::string_view value_name;  ///< "C"; "" for a switch
    sdpa_flag sdpa = sdpa_flag::none;
    bench_flag bench = bench_flag::none;
    std::string_view help;
};

/// The options of an sdpa call (qkv/runtime/sdpa.hpp says what each does): the rows of
/// sdpa_options.def, in their order.
struct sdpa_options {
#define QKV_SDPA_OPTION(type, member, initial, rule, flag, value_name, sdpa_form, bench_form, help) \
    type member = initial;
#include "qkv/runtime/sdpa_options.def"
#undef QKV_SDPA_OPTION
};

/// Every field of sdpa_options, in order. (Inline: each library and program has its own copy, so
/// tell rows apart by name, not by address.)
inline constexpr option_field sdpa_option_fields[] = {
#define QKV_SDPA_OPTION(type, member, initial, rule, flag, value_name, sdpa_form, bench_form, help) \
    option_field{#member,                                                                           \
                 option_rule::rule,                                                                 \
                 flag,                                                                              \
                 value_name,                                                                        \
                 sdpa_flag::sdpa_form,                                                              \
                 bench_flag::bench_form,                                                            \
                 std::string_view(help)},
#include "qkv/runtime/sdpa_options.def"
#undef QKV_SDPA_OPTION
};

/// Calls f(field, member) for every field of `o` (an sdpa_options, const or not), in order: f is
/// called with each member's own type, so it is generic (a lambda with an auto parameter).
template <class Options, class F>
requires std::is_same_v<std::remove_cvref_t<Options>, sdpa_options>
constexpr void visit_options(Options&& o, F&& f) {
    std::size_t i = 0;
#define QKV_SDPA_OPTION(type, member, initial, rule, flag, value_name, sdpa_form, bench_form, help) \
    f(sdpa_option_fields[i++], o.member);
#include "qkv/runtime/sdpa_options.def"
#undef QKV_SDPA_OPTION
}

/// Calls f(field, a.member, b.member) for every field of two option sets.
template <class F>
constexpr void visit_options(const sdpa_options& a, const sdpa_options& b, F&& f) {
    std::size_t i = 0;
#define QKV_SDPA_OPTION(type, member, initial, rule, flag, value_name, sdpa_form, bench_form, help) \
    f(sdpa_option_fields[i++], a.member, b.member);
#include "qkv/runtime/sdpa_options.def"
#undef QKV_SDPA_OPTION
}

/// The fields of `o` whose value differs from the default's.
[[nodiscard]] QKV_RUNTIME_API std::vector<const option_field*> changed_fields(const sdpa_options& o);

/// Whether two option sets are equal, field by field.
[[nodiscard]] QKV_RUNTIME_API bool same_options(const sdpa_options& a, const sdpa_options& b);

// ---- the fields as bytes (the MPI wire; the fingerprint) and as text ----------------------------

/// The options as bytes: every field in order, little-endian (a bool one byte, an enum four, an
/// optional a byte that says whether it is set and then its value slot, always there). The size
/// is the same for every value: options_bytes().
[[nodiscard]] QKV_RUNTIME_API std::vector<std::byte> to_bytes(const sdpa_options& o);
[[nodiscard]] QKV_RUNTIME_API std::size_t options_bytes();
/// The options to_bytes wrote. Throws qkv::invalid_argument for bytes of another size.
[[nodiscard]] QKV_RUNTIME_API sdpa_options options_from_bytes(std::span<const std::byte> bytes);

/// A field's value as text ("30", "bottom_right", "q8_0", "-1"; "" for an unset optional, "true" /
/// "false" for a bool).
[[nodiscard]] QKV_RUNTIME_API std::string field_text(const sdpa_options& o, const option_field& field);

/// Sets field `field` of `o` from `text`, as a command line gives it: a float strictly (finite
/// as a float32; off_or_positive fields above 0), an integer in range, an enum by parse_name, a
/// bool from no|yes. A pair field takes "LEFT,RIGHT" (and sets the next field too). Throws
/// qkv::invalid_argument with the reason alone (the caller names the flag and the text): "expected
/// a number", "must be above 0 (leave --softcap out to turn it off)", "expected one of f32, f16,
/// q8_0, q4_0", ...
QKV_RUNTIME_API void set_field(sdpa_options& o, const option_field& field, std::string_view text);

/// Sets a bool field (a switch, or an output given).
QKV_RUNTIME_API void set_switch(sdpa_options& o, const option_field& field, bool on);

/// Whether the field holds a bool (a switch on a command line).
[[nodiscard]] QKV_RUNTIME_API bool holds_bool(const option_field& field);

/// The row named `name`, or null.
[[nodiscard]] QKV_RUNTIME_API const option_field* find_field(std::string_view name);

}  // namespace qkv
