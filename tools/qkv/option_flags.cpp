#include "option_flags.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <type_traits>

#include "errors.hpp"
#include "qkv/runtime/error.hpp"

namespace qkv::cli {
namespace {

using qkv::bench_flag;
using qkv::option_field;
using qkv::sdpa_flag;
using qkv::sdpa_option_fields;

std::string shown(const std::string& text) { return text.empty() ? std::string("\"\"") : text; }

/// Sets field i from `text`, or throws usage_error "--flag text: reason".
void set(qkv::sdpa_options& o, std::size_t i, const std::string& text) {
    const option_field& f = sdpa_option_fields[i];
    try {
        qkv::set_field(o, f, text);
    } catch (const qkv::invalid_argument& e) {
        throw usage_error(std::string(f.flag) + " " + shown(text) + ": " + e.what());
    }
}

bool is_bool(std::size_t i) { return qkv::holds_bool(sdpa_option_fields[i]); }

}  // namespace

bool option_inputs::given(std::size_t i) const { return flags[i] != nullptr && flags[i]->count() > 0; }

std::size_t option_inputs::index_of(std::string_view name) {
    for (std::size_t i = 0; i < count; ++i)
        if (sdpa_option_fields[i].name == name) return i;
    throw std::logic_error("no option field named " + std::string(name));
}

void add_option_flags(CLI::App& cmd, option_inputs& in, option_command command, const std::string& group) {
    for (std::size_t i = 0; i < option_inputs::count; ++i) {
        const option_field& f = sdpa_option_fields[i];
        if (f.flag.empty()) continue;
        const std::string flag(f.flag), help(f.help);
        CLI::Option* opt = nullptr;
        if (command == option_command::sdpa) {
            if (f.sdpa == sdpa_flag::none || f.sdpa == sdpa_flag::paired) continue;
            if (f.sdpa == sdpa_flag::value && is_bool(i))
                opt = cmd.add_flag(flag, help);
            else
                opt = cmd.add_option(flag, in.values[i], help)
                          ->type_name(std::string(f.value_name))
                          ->expected(1)
                          ->multi_option_policy(CLI::MultiOptionPolicy::Throw);
        } else {
            if (f.bench == bench_flag::none || f.bench == bench_flag::paired) continue;
            if (f.bench == bench_flag::one && is_bool(i)) {
                opt = cmd.add_flag(flag, help);
            } else {
                opt = cmd.add_option(flag, in.values[i], help);
                // A sweep is a comma-separated list, or (a pair, whose value holds a comma) a repeated flag.
                if (f.bench == bench_flag::sweep && f.sdpa != sdpa_flag::pair) opt->delimiter(',');
                const std::string value_name = is_bool(i) ? "no|yes" : std::string(f.value_name);
                opt->type_name(value_name);
                if (f.bench == bench_flag::one) opt->expected(1)->multi_option_policy(CLI::MultiOptionPolicy::Throw);
            }
        }
        if (!group.empty()) opt->group(group);
        in.flags[i] = opt;
    }
}

qkv::sdpa_options options_from_flags(const option_inputs& in) {
    qkv::sdpa_options o;
    for (std::size_t i = 0; i < option_inputs::count; ++i) {
        if (!in.given(i)) continue;
        const option_field& f = sdpa_option_fields[i];
        if (f.sdpa == sdpa_flag::output) {
            qkv::set_switch(o, f, !in.values[i].empty() && !in.values[i].back().empty());
        } else if (is_bool(i)) {
            qkv::set_switch(o, f, true);
        } else {
            set(o, i, in.values[i].back());
        }
    }
    return o;
}

std::vector<qkv::sdpa_options> option_sweep(
    const option_inputs& in, const qkv::sdpa_options& base,
    const std::vector<std::pair<std::string, std::vector<std::string>>>& defaults) {
    std::vector<qkv::sdpa_options> out{base};
    for (std::size_t i = 0; i < option_inputs::count; ++i) {
        const option_field& f = sdpa_option_fields[i];
        std::vector<std::string> texts;
        bool switch_on = false;
        if (in.given(i)) {
            if (f.bench == bench_flag::one && is_bool(i))
                switch_on = true;
            else
                texts = in.values[i];
        } else {
            for (const auto& [name, values] : defaults)
                if (name == f.name) texts = values;
        }
        if (switch_on) {
            for (qkv::sdpa_options& o : out) qkv::set_switch(o, f, true);
            continue;
        }
        if (texts.empty()) continue;
        if (f.bench == bench_flag::one && texts.size() > 1)
            throw usage_error(std::string(f.flag) + " takes one value (it is not swept)");
        std::vector<qkv::sdpa_options> next;
        for (const qkv::sdpa_options& o : out)
            for (const std::string& text : texts) {
                qkv::sdpa_options v = o;
                set(v, i, text);
                next.push_back(v);
            }
        out = std::move(next);
    }
    return out;
}

nlohmann::ordered_json options_json(const qkv::sdpa_options& o) {
    nlohmann::ordered_json j = nlohmann::ordered_json::object();
    qkv::visit_options(o, [&](const option_field& f, const auto& value) {
        const std::string key(f.name);
        const auto one = [](const auto& v) -> nlohmann::ordered_json {
            using V = std::remove_cvref_t<decltype(v)>;
            if constexpr (std::is_enum_v<V>)
                return std::string(qkv::name_of(v));
            else
                return v;
        };
        if constexpr (requires { value.has_value(); })
            j[key] = value ? one(*value) : nlohmann::ordered_json(nullptr);
        else
            j[key] = one(value);
    });
    return j;
}

std::string options_label(const qkv::sdpa_options& o, const qkv::sdpa_options& base,
                          const std::vector<std::string_view>& skip) {
    std::string out;
    qkv::visit_options(o, base, [&](const option_field& f, const auto& value, const auto& was) {
        if (value == was || std::find(skip.begin(), skip.end(), f.name) != skip.end()) return;
        using T = std::remove_cvref_t<decltype(value)>;
        std::string part(f.name);
        if constexpr (std::is_same_v<T, bool>) {
            if (!value) part += " no";  // a switch shows its name alone when on
        } else {
            part += " " + qkv::field_text(o, f);
        }
        out += (out.empty() ? "" : " ") + part;
    });
    return out;
}

}  // namespace qkv::cli
