// The flags of sdpa_options, shared by `qkv sdpa` and `qkv bench`, made from the option list
// (qkv/runtime/sdpa_options.def) and never written per option: each row with a flag is one flag,
// its values parsed by the row's type and rule (qkv::set_field), a bad value a usage_error naming
// the flag (exit 2). Also the options' text for the bench's labels and their JSON: every field by
// its name. No Vulkan here.
#pragma once

#include <nlohmann/json.hpp>

#include <array>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "cli_fwd.hpp"
#include "qkv/runtime/options.hpp"

namespace qkv::cli {

/// What the command line gave for each field of sdpa_option_fields (by index).
struct option_inputs {
    static constexpr std::size_t count = std::size(qkv::sdpa_option_fields);
    std::array<std::vector<std::string>, count> values;  ///< a switch: empty, counted by its flag
    std::array<CLI::Option*, count> flags{};             ///< null: no flag in this command

    /// Whether field i's flag was given.
    [[nodiscard]] bool given(std::size_t i) const;
    /// The index of the field named `name` (the fields of an output form, for the command to
    /// write them: "return_weights", "return_lse").
    [[nodiscard]] static std::size_t index_of(std::string_view name);
};

/// Which command the flags are for: `qkv sdpa` (one value each; output fields are file flags) or
/// `qkv bench` (sweeps).
enum class option_command { sdpa, bench };

/// Adds a flag for every field the command takes (sdpa_flag / bench_flag), into `group` where
/// given. `in` must outlive `cmd`.
void add_option_flags(CLI::App& cmd, option_inputs& in, option_command command, const std::string& group = {});

/// `qkv sdpa`: the options the flags give (output fields set where their file is named). Throws
/// usage_error naming the flag and its text for a bad value.
[[nodiscard]] qkv::sdpa_options options_from_flags(const option_inputs& in);

/// `qkv bench`: every combination of the values given (a sweep field's list, one value each for
/// the others), over `base` (the fields not given keep its values), in the order of the fields,
/// the last fastest. `defaults`: for a sweep field not given, the values to sweep instead (texts,
/// as on the command line), by field name. Throws usage_error naming the flag.
[[nodiscard]] std::vector<qkv::sdpa_options> option_sweep(
    const option_inputs& in, const qkv::sdpa_options& base,
    const std::vector<std::pair<std::string, std::vector<std::string>>>& defaults = {});

/// The options as JSON, one key per field (its name): numbers, bools, enum names, null for an
/// unset optional.
[[nodiscard]] nlohmann::ordered_json options_json(const qkv::sdpa_options& o);

/// The fields that differ from `base`, compact: "window_left 4095 window_right 0 softcap 10
/// kv_type q8_0" (bools by name alone: "return_lse"), or "" when none do. `skip`: fields left out
/// (shown elsewhere).
[[nodiscard]] std::string options_label(const qkv::sdpa_options& o, const qkv::sdpa_options& base = {},
                                        const std::vector<std::string_view>& skip = {});

}  // namespace qkv::cli
