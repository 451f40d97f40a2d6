// The one K/V layout and the one check of a call against a cache (qkv/runtime/kv_layout.hpp).
#include "qkv/runtime/kv_layout.hpp"

#include <string>
#include <vector>

#include "qkv/runtime/error.hpp"

namespace qkv {
namespace {

std::string dims(std::initializer_list<std::size_t> d) {
    std::string s = "(";
    bool first = true;
    for (const std::size_t x : d) s += (first ? "" : ", ") + std::to_string(x), first = false;
    return s + ")";
}

}  // namespace

void validate(const kv_layout& l, std::string_view who) {
    const std::string w(who);
    const auto positive = [&](const char* what, std::size_t v) {
        if (v == 0) throw invalid_argument(w + ": " + what + " must be at least 1");
    };
    positive("batch", l.batch);
    positive("kv_heads", l.kv_heads);
    positive("capacity", l.capacity);
    positive("d_qk", l.d_qk);
    positive("d_v", l.d_v);
    if (!is_known(l.type))
        throw invalid_argument(w + ": unknown type (" + std::to_string(static_cast<int>(l.type)) + ")");
    if (!holds_floats(l.type))
        throw invalid_argument(w + ": type " + std::string(to_string(l.type)) +
                               " holds integers: K and V are stored as f32, f16, q8_0 or q4_0");
    if (is_quantized(l.type) && (l.d_qk % block_size(l.type) != 0 || l.d_v % block_size(l.type) != 0))
        throw invalid_argument(w + ": type " + std::string(to_string(l.type)) + " stores blocks of " +
                               std::to_string(block_size(l.type)) + " values along each row: d_qk (" +
                               std::to_string(l.d_qk) + ") and d_v (" + std::to_string(l.d_v) +
                               ") must be multiples of " + std::to_string(block_size(l.type)));
}

void check_cache_fit(const sdpa_shape& s, const sdpa_options& o, const kv_layout& l, std::string_view who) {
    const std::string w(who);
    if (s.batch != l.batch || s.kv_heads != l.kv_heads || s.d_qk != l.d_qk || s.d_v != l.d_v)
        throw invalid_argument(
            w + ": the problem's (batch, kv_heads, d_qk, d_v) = " + dims({s.batch, s.kv_heads, s.d_qk, s.d_v}) +
            " differ from the cache's " + dims({l.batch, l.kv_heads, l.d_qk, l.d_v}));
    if (o.kv_type && *o.kv_type != l.type)
        throw invalid_argument(w + ": options.kv_type is " + std::string(to_string(*o.kv_type)) +
                               " but the cache stores " + std::string(to_string(l.type)) +
                               " (leave kv_type unset to take the cache's)");
}

sdpa_problem check_against_cache(const sdpa_problem& queries, const kv_layout& layout, std::size_t rows,
                                 std::string_view who, bool description) {
    const std::string w(who);
    sdpa_problem p = queries;
    if (!p.k.empty() || !p.v.empty())
        throw invalid_argument(w + ": k and v come from the cache; leave problem.k and problem.v empty");
    if (rows == 0) throw invalid_argument(w + ": the cache is empty; append keys and values first");
    if (p.shape.kv_len == 0) p.shape.kv_len = rows;
    if (p.shape.kv_len != rows)
        throw invalid_argument(w + ": shape.kv_len is " + std::to_string(p.shape.kv_len) + " but the cache holds " +
                               std::to_string(rows) + " rows (0 takes the cache's size)");
    check_cache_fit(p.shape, p.options, layout, who);
    try {
        if (description)
            validate_description(p);  // the runtime's one validator, without data
        else
            validate_queries(p);  // the runtime's one validator, without k and v (the cache's)
    } catch (const invalid_argument& e) {
        throw invalid_argument(w + ": " + e.what());
    }
    return p;
}

}  // namespace qkv
