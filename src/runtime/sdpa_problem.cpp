// qkv::validate for SDPA problems, the default scale and mask broadcasting: the checks every
// backend runs before it touches an SDPA problem's data.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "qkv/runtime/error.hpp"
#include "qkv/runtime/sdpa.hpp"
#include "runtime/shape_checks.hpp"

namespace qkv {
namespace {

using namespace shape_checks;

std::string dims_of(const std::vector<std::size_t>& dims) {
    std::string s = "(";
    for (std::size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
    return s + (dims.size() == 1 ? ",)" : ")");
}

std::string target_of(const sdpa_shape& s) {
    return "(batch, q_heads, q_len, kv_len) = " + dims_of({s.batch, s.q_heads, s.q_len, s.kv_len});
}

/// The mask's dimensions: mask_shape, or L x S when it is empty.
std::vector<std::size_t> mask_dims(const std::vector<std::size_t>& mask_shape, const sdpa_shape& s) {
    return mask_shape.empty() ? std::vector<std::size_t>{s.q_len, s.kv_len} : mask_shape;
}

/// Where a problem's K and V are: in its k and v spans (validate), or held elsewhere, e.g. a
/// device K/V cache (validate_queries: the spans must be empty).
enum class kv_source { spans, elsewhere, description };

std::string number(double value) {
    char text[32];
    std::snprintf(text, sizeof text, "%.9g", value);
    return text;
}

/// Every option within its row's rule (sdpa_options.def), the message naming the option: any
/// finite scale, negative and zero included, as PyTorch's scale=; a window side of -1 or more; a
/// softcap or ALiBi max bias of 0 (off) or finite and above 0; an offset within +-2^62; an enum
/// one of its values.
void check_options(const sdpa_options& opt) {
    visit_options(opt, [](const option_field& field, const auto& given) {
        const auto check = [&](const auto& value) {
            using V = std::remove_cvref_t<decltype(value)>;
            const std::string name(field.name);
            if constexpr (std::is_enum_v<V>) {
                if (field.rule == option_rule::known && name_of(value).empty()) {
                    std::string names;  // what it takes (an i32 kv_type, say, holds no floats)
                    for (const auto& n : names_of<V>())
                        if (!n.alias) names += (names.empty() ? "" : ", ") + std::string(n.name);
                    fail("unknown " + name + " (" + std::to_string(static_cast<int>(value)) + "): it takes " + names);
                }
            } else if constexpr (std::is_floating_point_v<V>) {
                if (field.rule == option_rule::finite && !std::isfinite(value))
                    fail(name + " must be finite (it is " + number(value) + ")");
                if (field.rule == option_rule::off_or_positive && !(std::isfinite(value) && value >= 0))
                    fail(name + " must be finite and at least 0 (0 = off; it is " + number(value) + ")");
                if (field.rule == option_rule::probability && !(value >= 0 && value < 1))
                    fail(name + " must be at least 0 and below 1 (0 = off; it is " + number(value) + ")");
            } else if constexpr (std::is_integral_v<V> && std::is_signed_v<V>) {
                if (field.rule == option_rule::window_side && value < -1)
                    fail(name + " must be -1 (unbounded) or at least 0 (it is " + std::to_string(value) + ")");
                if (field.rule == option_rule::position &&
                    (value > (std::int64_t{1} << 62) || value < -(std::int64_t{1} << 62)))
                    fail(name + " must be within +-2^62 (it is " + std::to_string(value) + ")");
            }
        };
        if constexpr (requires { given.has_value(); }) {
            if (given) check(*given);
        } else {
            check(given);
        }
    });
}

/// The checks of validate() and validate_queries(), for float32 and float64 problems alike.
template <class T>
void check_sdpa(const basic_sdpa_problem<T>& problem, kv_source kv) {
    const sdpa_shape& s = problem.shape;
    const sdpa_options& opt = problem.options;

    visit_shape(s, [](const char* name, std::size_t d) { expect_positive(name, d); });
    if (s.q_heads % s.kv_heads != 0)
        fail("kv_heads (" + std::to_string(s.kv_heads) + ") must divide q_heads (" + std::to_string(s.q_heads) +
             "): q is " + dims_of({s.batch, s.q_heads, s.q_len, s.d_qk}) + ", k is " +
             dims_of({s.batch, s.kv_heads, s.kv_len, s.d_qk}));

    if (kv == kv_source::description) {
        if (!problem.q.empty())
            fail("q must be empty: the description of a call over device tensors holds no data (q has " +
                 std::to_string(problem.q.size()) + " elements)");
        (void)checked_product({{"batch", s.batch}, {"q_heads", s.q_heads}, {"q_len", s.q_len}, {"d_qk", s.d_qk}});
    } else {
        expect_size("q", problem.q, {{"batch", s.batch}, {"q_heads", s.q_heads}, {"q_len", s.q_len}, {"d_qk", s.d_qk}});
    }
    if (kv == kv_source::spans) {
        expect_size("k", problem.k,
                    {{"batch", s.batch}, {"kv_heads", s.kv_heads}, {"kv_len", s.kv_len}, {"d_qk", s.d_qk}});
        expect_size("v", problem.v,
                    {{"batch", s.batch}, {"kv_heads", s.kv_heads}, {"kv_len", s.kv_len}, {"d_v", s.d_v}});
    } else {
        if (!problem.k.empty() || !problem.v.empty())
            fail("k and v must be empty: K and V are held elsewhere (k has " + std::to_string(problem.k.size()) +
                 " elements, v " + std::to_string(problem.v.size()) + ")");
        // The K/V store's sizes, as a backend holding them would compute them.
        (void)checked_product({{"batch", s.batch}, {"kv_heads", s.kv_heads}, {"kv_len", s.kv_len}, {"d_qk", s.d_qk}});
        (void)checked_product({{"batch", s.batch}, {"kv_heads", s.kv_heads}, {"kv_len", s.kv_len}, {"d_v", s.d_v}});
    }
    (void)checked_product({{"batch", s.batch}, {"q_heads", s.q_heads}, {"q_len", s.q_len}, {"d_v", s.d_v}});
    if (opt.return_weights)
        (void)checked_product({{"batch", s.batch}, {"q_heads", s.q_heads}, {"q_len", s.q_len}, {"kv_len", s.kv_len}});

    const bool has_mask = !problem.mask.empty() || !problem.additive_mask.empty();
    if (!has_mask && !problem.mask_shape.empty())
        fail("mask_shape " + dims_of(problem.mask_shape) + " given without a mask");
    if (has_mask) {
        const std::vector<std::size_t> dims = mask_dims(problem.mask_shape, s);
        (void)broadcast_strides(dims, s);  // throws if it does not broadcast
        std::size_t want = 1;
        for (std::size_t d : dims) want *= d;  // no overflow: each d is 1 or a checked dimension
        auto expect = [&](const char* what, std::size_t have) {
            if (have != 0 && have != want)
                fail(std::string(what) + " has " + std::to_string(have) + " elements, expected its shape " +
                     dims_of(dims) + " = " + std::to_string(want));
        };
        expect("mask", problem.mask.size());
        expect("additive_mask", problem.additive_mask.size());
    }
    for (std::size_t i = 0; i < problem.mask.size(); ++i)
        if (problem.mask[i] > 1)
            fail("mask values must be 0 or 1 (element " + std::to_string(i) + " is " +
                 std::to_string(static_cast<unsigned>(problem.mask[i])) + ")");

    // Sinks: none, or one finite (or -inf: no sink) logit per query head.
    if (!problem.sinks.empty()) {
        if (problem.sinks.size() != s.q_heads)
            fail("sinks has " + std::to_string(problem.sinks.size()) +
                 " elements, expected one per query head, q_heads = " + std::to_string(s.q_heads) + " (or none)");
        for (std::size_t h = 0; h < problem.sinks.size(); ++h) {
            const double sink = static_cast<double>(problem.sinks[h]);
            if (std::isnan(sink) || sink == std::numeric_limits<double>::infinity())
                fail("sinks[" + std::to_string(h) + "] is " + number(sink) +
                     ": a sink must be finite, or -inf for no sink on that head");
        }
    }

    // ALiBi slopes given per query head: none, or one finite slope >= 0 per head, without max_bias.
    if (!problem.alibi_slopes.empty()) {
        if (problem.alibi_slopes.size() != s.q_heads)
            fail("alibi_slopes has " + std::to_string(problem.alibi_slopes.size()) +
                 " elements, expected one per query head, q_heads = " + std::to_string(s.q_heads) + " (or none)");
        for (std::size_t h = 0; h < problem.alibi_slopes.size(); ++h) {
            const double slope = static_cast<double>(problem.alibi_slopes[h]);
            if (!(std::isfinite(slope) && slope >= 0))
                fail("alibi_slopes[" + std::to_string(h) + "] is " + number(slope) +
                     ": a slope must be finite and at least 0");
        }
        if (opt.alibi_max_bias != 0)
            fail(
                "alibi_slopes and alibi_max_bias are both given: ALiBi takes the slopes given or derives them "
                "from max_bias, not both");
    }

    check_options(opt);
    if (opt.return_lse) (void)checked_product({{"batch", s.batch}, {"q_heads", s.q_heads}, {"q_len", s.q_len}});
    if (opt.kv_type) {
        const element_type t = *opt.kv_type;
        if (is_quantized(t) && (s.d_qk % block_size(t) != 0 || s.d_v % block_size(t) != 0))
            fail("kv_type " + std::string(to_string(t)) + " stores blocks of " + std::to_string(block_size(t)) +
                 " values along each row: d_qk (" + std::to_string(s.d_qk) + ") and d_v (" + std::to_string(s.d_v) +
                 ") must be multiples of " + std::to_string(block_size(t)));
    }
}

}  // namespace

void validate(const sdpa_problem& problem) { check_sdpa(problem, kv_source::spans); }
void validate(const sdpa_problem_f64& problem) { check_sdpa(problem, kv_source::spans); }
void validate_queries(const sdpa_problem& problem) { check_sdpa(problem, kv_source::elsewhere); }
void validate_queries(const sdpa_problem_f64& problem) { check_sdpa(problem, kv_source::elsewhere); }
void validate_description(const sdpa_problem& problem) { check_sdpa(problem, kv_source::description); }

double alibi_slope(float max_bias, std::size_t q_heads, std::size_t head) {
    if (!(std::isfinite(max_bias) && max_bias >= 0))
        throw invalid_argument("alibi_slope: max_bias must be finite and at least 0 (it is " + number(max_bias) + ")");
    if (q_heads == 0 || head >= q_heads)
        throw invalid_argument("alibi_slope: head " + std::to_string(head) + " of " + std::to_string(q_heads) +
                               " query heads");
    if (max_bias == 0) return 0.0;
    std::size_t n = 1;  // 2^floor(log2 q_heads)
    while (n <= q_heads / 2) n *= 2;
    const double b = static_cast<double>(max_bias), heads = static_cast<double>(n);
    if (head < n) return std::pow(std::exp2(-b / heads), static_cast<double>(head + 1));
    return std::pow(std::exp2(-b / (2 * heads)), static_cast<double>(2 * (head - n) + 1));
}

float default_scale(const sdpa_shape& shape) {
    if (shape.d_qk == 0) throw invalid_argument("default_scale needs d_qk >= 1");
    return static_cast<float>(1.0 / std::sqrt(static_cast<double>(shape.d_qk)));
}

mask_strides broadcast_strides(const std::vector<std::size_t>& mask_shape, const sdpa_shape& s) {
    const std::size_t target[4] = {s.batch, s.q_heads, s.q_len, s.kv_len};
    static const char* const names[4] = {"batch", "q_heads", "q_len", "kv_len"};
    const std::vector<std::size_t> dims = mask_dims(mask_shape, s);
    if (dims.size() > 4)
        fail("mask shape " + dims_of(dims) + " has " + std::to_string(dims.size()) +
             " dimensions; at most 4 broadcast to " + target_of(s));
    std::size_t strides[4] = {0, 0, 0, 0};
    std::size_t stride = 1;
    for (std::size_t i = 0; i < dims.size(); ++i) {
        const std::size_t from_end = dims.size() - 1 - i;  // dims[from_end] meets target[3 - i]
        const std::size_t d = dims[from_end];
        const std::size_t t = target[3 - i];
        if (d != 1 && d != t)
            fail("mask shape " + dims_of(dims) + " does not broadcast to " + target_of(s) + ": dimension " +
                 std::to_string(from_end) + " is " + std::to_string(d) + ", expected 1 or " + names[3 - i] + " = " +
                 std::to_string(t));
        strides[3 - i] = d == 1 ? 0 : stride;
        stride = checked_product({{"mask elements", stride}, {names[3 - i], d}});
    }
    return {strides[0], strides[1], strides[2], strides[3]};
}

}  // namespace qkv
