// The one table of what each entry point takes (qkv/runtime/capabilities.hpp): its refusals are
// well formed, require_supported refuses from it and from nothing else, and the README lists it
// as it is (the grid below, between its markers). The Vulkan entry points' behaviour against the
// table is tests/capabilities_vulkan_test.cpp's; the MPI ones', tests/mpi/mpi_test.cpp's.
#include <qkv/runtime/capabilities.hpp>
#include <qkv/runtime/cpu.hpp>

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "support/catch.hpp"

namespace {

/// The README's grid: an entry point per row, a feature per column; ✓ taken, "no (n)" refused for
/// reason n (listed below the grid), · where the entry point's problems cannot ask for it.
std::string capability_grid() {
    std::ostringstream os;
    os << "| entry point |";
    for (const qkv::feature f : qkv::features()) os << " " << f << " |";
    os << "\n|---|";
    for (std::size_t i = 0; i < qkv::features().size(); ++i) os << "---|";
    os << "\n";
    std::vector<std::string_view> reasons;
    for (const qkv::entry_point e : qkv::entry_points()) {
        os << "| " << qkv::name_of(e) << " |";
        for (const qkv::feature f : qkv::features()) {
            if (!qkv::applies(e, f)) {
                os << " · |";
            } else if (const qkv::refusal* r = qkv::refused(e, f)) {
                auto at = std::find(reasons.begin(), reasons.end(), r->why);
                if (at == reasons.end()) at = reasons.insert(reasons.end(), r->why);
                os << " no (" << (at - reasons.begin() + 1) << ") |";
            } else {
                os << " ✓ |";
            }
        }
        os << "\n";
    }
    os << "\n";
    for (std::size_t i = 0; i < reasons.size(); ++i) os << "(" << i + 1 << ") " << reasons[i] << ".\n";
    return os.str();
}

std::string readme_block() {
    std::ifstream f(QKV_SOURCE_DIR "/README.md");
    REQUIRE(f);
    std::stringstream ss;
    ss << f.rdbuf();
    const std::string s = ss.str();
    const std::string begin = "<!-- capabilities: begin (tests/capabilities_test.cpp writes this grid) -->\n";
    const std::string end = "<!-- capabilities: end -->";
    const std::size_t a = s.find(begin), b = s.find(end);
    REQUIRE(a != std::string::npos);
    REQUIRE(b != std::string::npos);
    return s.substr(a + begin.size(), b - a - begin.size());
}

}  // namespace

TEST_CASE("capabilities: every refusal names an entry point, a feature it applies to, and why", "[capabilities]") {
    std::map<std::pair<qkv::entry_point, qkv::feature>, int> seen;
    for (const qkv::refusal& r : qkv::refusals()) {
        INFO(qkv::name_of(r.entry) << " / " << r.what);
        CHECK(qkv::is_feature(r.what));  // an option's name that is a field of the option list, or an input
        CHECK(r.why.size() > 20);
        CHECK(qkv::applies(r.entry, r.what));
        CHECK(++seen[{r.entry, r.what}] == 1);
        CHECK(qkv::refused(r.entry, r.what) == &r);
        // require_supported refuses it, naming the entry point, the feature and the reason.
        const std::vector<qkv::feature> asked{r.what};
        CHECK_THROWS_WITH(qkv::require_supported(r.entry, asked),
                          Catch::Matchers::Contains(std::string(qkv::name_of(r.entry))) &&
                              Catch::Matchers::Contains(std::string(r.what)) &&
                              Catch::Matchers::Contains(std::string(r.why)));
    }
    // What the table does not refuse, require_supported takes.
    for (const qkv::entry_point e : qkv::entry_points())
        for (const qkv::feature f : qkv::features()) {
            if (qkv::refused(e, f)) continue;
            const std::vector<qkv::feature> asked{f};
            CHECK_NOTHROW(qkv::require_supported(e, asked));
        }
    // Names are unique: messages and the README tell them apart.
    std::vector<std::string_view> names;
    for (const qkv::entry_point e : qkv::entry_points()) names.push_back(qkv::name_of(e));
    for (const qkv::feature f : qkv::features()) names.push_back(f);
    // Every field of the option list is a feature, by its name.
    for (const qkv::option_field& o : qkv::sdpa_option_fields) CHECK(qkv::is_feature(o.name));
    std::sort(names.begin(), names.end());
    CHECK(std::adjacent_find(names.begin(), names.end()) == names.end());
}

TEST_CASE("capabilities: a problem's features, as the table reads them", "[capabilities]") {
    float q[8] = {1, 2, 3, 4, 5, 6, 7, 8}, k[4] = {1, 0, 0, 1}, v[4] = {2, 1, 0, 3}, sinks[2] = {0.5f, -1.f};
    const qkv::sdpa_problem plain{
        .shape = {.batch = 1, .q_heads = 2, .kv_heads = 2, .q_len = 1, .kv_len = 1, .d_qk = 4, .d_v = 4},
        .q = q,
        .k = k,
        .v = v};
    CHECK(qkv::features_of(plain).empty());
    qkv::sdpa_problem all = plain;
    all.shape.kv_heads = 1;
    all.options = {.causal = true,
                   .return_weights = true,
                   .precision = qkv::precision::fp16,
                   .window_left = 3,
                   .softcap = 5,
                   .alibi_max_bias = 8,
                   .return_lse = true,
                   .position_offset = 2};
    all.sinks = sinks;
    const std::vector<qkv::feature> f = qkv::features_of(all);
    // The options by their fields' names, the inputs by theirs.
    for (const qkv::feature want : std::initializer_list<qkv::feature>{
             "causal", "return_weights", "precision", "window_left", "softcap", "alibi_max_bias", "return_lse",
             "position_offset", qkv::inputs::grouped_query, qkv::inputs::sinks, qkv::inputs::kv_f16})
        CHECK(std::count(f.begin(), f.end(), want) == 1);
    CHECK(f.size() == 11);
    const std::vector<float> slopes{0.5f, 0.25f};
    qkv::sdpa_problem given = plain;
    given.alibi_slopes = slopes;
    CHECK(qkv::features_of(given) == std::vector<qkv::feature>{qkv::inputs::alibi_slopes});
    qkv::sdpa_problem q8 = plain;
    q8.options.kv_type = qkv::element_type::q8_0;
    CHECK(qkv::features_of(q8) == std::vector<qkv::feature>{"kv_type", qkv::inputs::kv_quantized});
    // A value that is a feature of its own comes with its option's feature.
    qkv::sdpa_problem coop = plain;
    coop.options.kernel = qkv::kernel_family::coopmat;
    CHECK(qkv::features_of(coop) == std::vector<qkv::feature>{"kernel", qkv::values::coopmat});
    coop.options.kernel = qkv::kernel_family::block_tiles;
    CHECK(qkv::features_of(coop) == std::vector<qkv::feature>{"kernel"});
    // The CPU reference takes everything: it refuses nothing.
    for (const qkv::feature g : qkv::features()) {
        CHECK_FALSE(qkv::refused(qkv::entry_point::cpu_sdpa, g));
        CHECK_FALSE(qkv::refused(qkv::entry_point::cpu_sdpa_backward, g));
    }
}

TEST_CASE("capabilities: the README lists the table as it is", "[capabilities]") {
    const std::string want = capability_grid(), have = readme_block();
    if (want != have) {
        std::ofstream("capabilities_grid.md") << want;  // to paste between the README's markers
        FAIL(
            "README.md's capability grid differs from the table; what it should read is in "
            "capabilities_grid.md of the test's working directory:\n"
            << want);
    }
}
