#include "feature_args.hpp"

#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "errors.hpp"

namespace qkv::cli {
namespace {

std::string shown(const std::string& text) { return text.empty() ? std::string("\"\"") : text; }

bool parse_side(const std::string& text, std::int64_t& side) {
    const char* end = text.data() + text.size();
    const auto [at, ec] = std::from_chars(text.data(), end, side);
    return !text.empty() && ec == std::errc() && at == end;
}

}  // namespace

std::pair<std::int64_t, std::int64_t> parse_window(const std::string& text) {
    const std::string bad = "--window " + shown(text) + ": ";
    const std::size_t comma = text.find(',');
    if (comma == std::string::npos || text.find(',', comma + 1) != std::string::npos)
        throw usage_error(bad + "expected LEFT,RIGHT (two integers; -1 leaves a side unbounded)");
    std::int64_t left = 0, right = 0;
    if (!parse_side(text.substr(0, comma), left) || !parse_side(text.substr(comma + 1), right))
        throw usage_error(bad + "expected LEFT,RIGHT (two integers; -1 leaves a side unbounded)");
    for (const std::int64_t side : {left, right})
        if (side < -1) throw usage_error(bad + "each side must be -1 (unbounded) or at least 0");
    return {left, right};
}

float parse_positive(const std::string& flag, const std::string& text) {
    const std::string bad = flag + " " + shown(text) + ": ";
    if (text.empty() || std::isspace(static_cast<unsigned char>(text.front())))
        throw usage_error(bad + "expected a number");
    const char* begin = text.c_str();
    char* end = nullptr;
    errno = 0;
    const double value = std::strtod(begin, &end);
    if (end == begin || *end != '\0') throw usage_error(bad + "expected a number");
    if (!std::isfinite(value) || std::fabs(value) > static_cast<double>(std::numeric_limits<float>::max()))
        throw usage_error(bad + "must be finite as a float32");
    const float v = static_cast<float>(value);
    if (!(v > 0.0f)) throw usage_error(bad + "must be above 0 (leave " + flag + " out to turn it off)");
    return v;
}

qkv::element_type parse_kv_type(const std::string& text) {
    if (const auto t = qkv::parse_element_type(text)) return *t;
    throw usage_error("--kv-type " + shown(text) + ": expected one of f32, f16, q8_0, q4_0");
}

}  // namespace qkv::cli
