// The option list's tests (tests/options_test.cpp, option_flags_test.cpp, mpi_test.cpp) go over
// every field of qkv::sdpa_options by the list, never by name, so that a field added to
// qkv/runtime/sdpa_options.def is tested by them without an edit: each gets a value other than its
// default, valid for its rule, and its text as a command line would give it.
#pragma once

#include <qkv/runtime/options.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>

namespace qkv_test {

/// A value of type T other than `initial`, valid for `field`'s rule.
template <class T>
T other_value(const qkv::option_field& field, const T& initial) {
    if constexpr (std::is_same_v<T, bool>) {
        return !initial;
    } else if constexpr (std::is_enum_v<T>) {
        for (const qkv::enum_name<T>& n : qkv::names_of<T>())
            if (!n.alias && n.value != initial) return n.value;
        return initial;
    } else if constexpr (std::is_same_v<T, float>) {
        return initial == 0.75f ? 0.5f : 0.75f;  // finite, above 0: every float rule takes it
    } else if constexpr (std::is_integral_v<T>) {
        (void)field;
        return initial == 3 ? 2 : 3;  // a window side, an offset
    } else {                          // std::optional
        using V = typename T::value_type;
        return T(other_value<V>(field, initial.value_or(V{})));
    }
}

/// `base` with field `field` set to other_value.
inline qkv::sdpa_options with_other(const qkv::sdpa_options& base, const qkv::option_field& field) {
    qkv::sdpa_options o = base;
    qkv::visit_options(o, [&](const qkv::option_field& f, auto& value) {
        if (f.name == field.name) value = other_value(f, value);
    });
    return o;
}

/// How the command line writes other_value of `field` over a default sdpa_options: its text (a
/// pair field's "LEFT,RIGHT": the other side stays unbounded).
inline std::string other_text(const qkv::option_field& field) {
    const qkv::sdpa_options o = with_other({}, field);
    std::string text = qkv::field_text(o, field);
    if (field.sdpa == qkv::sdpa_flag::pair) text += ",-1";
    return text;
}

}  // namespace qkv_test
