// The one field list of sdpa_options (qkv/runtime/sdpa_options.def): every field, by the list,
// reaches the bytes (the MPI wire and the fingerprint), the text, the comparison and validate()'s
// messages. Nothing here names a field: a field added to the list is tested without an edit
// (docs/architecture.md, "How to add an option").
#include <qkv/runtime/error.hpp>
#include <qkv/runtime/options.hpp>
#include <qkv/runtime/sdpa.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "support/catch.hpp"
#include "support/options.hpp"

namespace {

std::size_t rows_of_the_def() {
    std::ifstream def(QKV_SOURCE_DIR "/include/qkv/runtime/sdpa_options.def");
    REQUIRE(def);
    std::size_t n = 0;
    for (std::string line; std::getline(def, line);)
        if (line.rfind("QKV_SDPA_OPTION(", 0) == 0) ++n;
    return n;
}

}  // namespace

TEST_CASE("options: the list is the struct, one row per member, names unique", "[options]") {
    const std::size_t n = std::size(qkv::sdpa_option_fields);
    CHECK(n == rows_of_the_def());
    std::size_t visited = 0;
    qkv::visit_options(qkv::sdpa_options{}, [&](const qkv::option_field& f, const auto&) {
        CHECK(f.name == qkv::sdpa_option_fields[visited].name);
        ++visited;
    });
    CHECK(visited == n);
    for (std::size_t i = 0; i < n; ++i) {
        const qkv::option_field& f = qkv::sdpa_option_fields[i];
        INFO(f.name);
        CHECK(!f.name.empty());
        CHECK(!f.help.empty());
        REQUIRE(qkv::find_field(f.name) != nullptr);
        CHECK(qkv::find_field(f.name)->name == f.name);
        for (std::size_t j = i + 1; j < n; ++j) CHECK(f.name != qkv::sdpa_option_fields[j].name);
        // A flag has a value name unless it is a switch; a pair's second field has no flag of its own.
        if (!f.flag.empty() && !qkv::holds_bool(f)) CHECK(!f.value_name.empty());
        if (f.sdpa == qkv::sdpa_flag::pair) {
            REQUIRE(i + 1 < n);
            CHECK(qkv::sdpa_option_fields[i + 1].sdpa == qkv::sdpa_flag::paired);
        }
    }
}

TEST_CASE("options: every field reaches the bytes, both ways, and the comparison", "[options]") {
    const qkv::sdpa_options defaults;
    const std::vector<std::byte> base = qkv::to_bytes(defaults);
    CHECK(base.size() == qkv::options_bytes());
    CHECK(qkv::same_options(qkv::options_from_bytes(base), defaults));
    CHECK(qkv::changed_fields(defaults).empty());
    for (const qkv::option_field& f : qkv::sdpa_option_fields) {
        INFO(f.name);
        const qkv::sdpa_options changed = qkv_test::with_other(defaults, f);
        const std::vector<std::byte> bytes = qkv::to_bytes(changed);
        CHECK(bytes.size() == base.size());  // one size for every value: a wire of fixed length
        CHECK(bytes != base);                // the field is in the bytes (so in the fingerprint)
        CHECK(qkv::same_options(qkv::options_from_bytes(bytes), changed));  // and comes back
        CHECK_FALSE(qkv::same_options(changed, defaults));
        const std::vector<const qkv::option_field*> diff = qkv::changed_fields(changed);
        REQUIRE(diff.size() == 1);
        CHECK(diff[0]->name == f.name);
        CHECK(qkv::field_text(changed, f) != qkv::field_text(defaults, f));
    }
    CHECK_THROWS_AS(qkv::options_from_bytes(std::vector<std::byte>(base.size() + 1)), qkv::invalid_argument);
}

TEST_CASE("options: every field's text sets it, as a command line gives it", "[options]") {
    for (const qkv::option_field& f : qkv::sdpa_option_fields) {
        if (f.sdpa == qkv::sdpa_flag::paired) continue;  // set by the field before it
        INFO(f.name);
        qkv::sdpa_options o;
        if (qkv::holds_bool(f))
            qkv::set_switch(o, f, true);
        else
            qkv::set_field(o, f, qkv_test::other_text(f));
        CHECK(qkv::same_options(o, qkv_test::with_other({}, f)));
    }
}

TEST_CASE("options: validate() checks every field by its rule and names it", "[options][validate]") {
    float q[4] = {1, 2, 3, 4}, k[4] = {1, 0, 0, 1}, v[4] = {2, 1, 0, 3};
    const qkv::sdpa_shape shape{.batch = 1, .q_heads = 1, .kv_heads = 1, .q_len = 1, .kv_len = 1, .d_qk = 4, .d_v = 4};
    for (const qkv::option_field& f : qkv::sdpa_option_fields) {
        INFO(f.name);
        qkv::sdpa_problem p{.shape = shape, .q = q, .k = k, .v = v};
        p.options = qkv_test::with_other({}, f);
        CHECK_NOTHROW(qkv::validate(p));  // the other value is a valid one
        if (f.rule == qkv::option_rule::any) continue;
        // A value the rule refuses, by the field's type: the message names the field.
        bool made = false;
        qkv::visit_options(p.options, [&](const qkv::option_field& g, auto& value) {
            if (g.name != f.name) return;
            const auto bad = [&](auto& x) {
                using V = std::remove_cvref_t<decltype(x)>;
                if constexpr (std::is_enum_v<V>)
                    x = static_cast<V>(97), made = true;
                else if constexpr (std::is_floating_point_v<V>)
                    x = std::numeric_limits<V>::infinity(), made = true;
                else if constexpr (std::is_integral_v<V> && !std::is_same_v<V, bool>)
                    x = std::numeric_limits<V>::min(), made = true;
            };
            if constexpr (requires { value.emplace(); })
                bad(value.emplace());
            else
                bad(value);
        });
        REQUIRE(made);
        CHECK_THROWS_WITH(qkv::validate(p), Catch::Matchers::Contains(std::string(f.name)));
    }
}

// The kernel families' old enumerators still compile, for a release, as the new ones (with a
// deprecation warning, silenced here: -Werror would make it an error).
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
static_assert(qkv::kernel_family::cpu == qkv::kernel_family::row_tiles);
static_assert(qkv::kernel_family::gpu == qkv::kernel_family::block_tiles);
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

TEST_CASE("options: the enums' names, one table each", "[options]") {
    CHECK(qkv::name_of(qkv::causal_alignment::bottom_right) == "bottom_right");
    CHECK(qkv::parse_name<qkv::causal_alignment>("top-left") == qkv::causal_alignment::top_left);
    CHECK(qkv::name_of(qkv::kernel_family::row_tiles) == "row_tiles");
    // The kernel families' old names are accepted (deprecated aliases), never written.
    CHECK(qkv::parse_name<qkv::kernel_family>("cpu") == qkv::kernel_family::row_tiles);
    CHECK(qkv::parse_name<qkv::kernel_family>("GPU") == qkv::kernel_family::block_tiles);
    CHECK(qkv::names_joined<qkv::kernel_family>("|") == "auto|row_tiles|block_tiles|coopmat");
    CHECK(qkv::parse_name<qkv::element_type>("q8_0") == qkv::element_type::q8_0);
    CHECK_FALSE(qkv::parse_name<qkv::precision>("fp64").has_value());
}
