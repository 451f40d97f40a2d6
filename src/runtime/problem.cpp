// qkv::validate, qkv::default_scale, qkv::resolve_implementation: the checks every backend runs
// before it touches a problem's data.
#include "qkv/runtime/problem.hpp"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <string_view>

#include "qkv/runtime/cpu.hpp"
#include "qkv/runtime/error.hpp"
#include "runtime/shape_checks.hpp"

namespace qkv {
namespace {

using namespace shape_checks;

/// A mask is optional: empty, seq x seq (shared by every batch element) or batch x seq x seq.
template <class T>
void expect_mask_size(std::string_view what, std::span<const T> mask, const attention_shape& s) {
    if (mask.empty()) return;
    const std::size_t square = checked_product({{"seq", s.seq}, {"seq", s.seq}});
    const std::size_t batched = checked_product({{"batch", s.batch}, {"seq", s.seq}, {"seq", s.seq}});
    if (mask.size() == square || mask.size() == batched) return;
    std::string message = std::string(what) + " has " + std::to_string(mask.size()) +
                          " elements, expected seq x seq = " + std::to_string(square);
    if (batched != square) message += " or batch x seq x seq = " + std::to_string(batched);
    fail(message);
}

}  // namespace

namespace {

/// The checks of validate(), for float32 and float64 problems alike; of validate_description()
/// where `description` (the data spans empty, their sizes implied by the shape).
template <class Problem>
void check_problem(const Problem& problem, bool description = false) {
    const attention_shape& s = problem.shape;
    const run_options& opt = problem.options;

    // Dimensions.
    expect_positive("batch", s.batch);
    expect_positive("seq", s.seq);
    expect_positive("d_in", s.d_in);
    expect_positive("d_k", s.d_k);
    expect_positive("d_v", s.d_v);
    expect_positive("heads", s.heads);
    if (s.d_k % s.heads != 0 || s.d_v % s.heads != 0)
        fail("heads (" + std::to_string(s.heads) + ") must divide d_k (" + std::to_string(s.d_k) + ") and d_v (" +
             std::to_string(s.d_v) + ")");

    // Every buffer a backend sizes from the shape must have a representable size. The spans'
    // own products are checked where their sizes are compared below.
    if (description && (!problem.x.empty() || !problem.wq.empty() || !problem.wk.empty() || !problem.wv.empty() ||
                        !problem.bq.empty() || !problem.bk.empty() || !problem.bv.empty() || !problem.wo.empty() ||
                        !problem.bo.empty()))
        fail("a description's x, weight and bias spans must be empty (its data lives on the device)");
    // A description's spans are checked as if given (empty biases are allowed anyway).
    const auto expect_data = [&](std::string_view what, const auto& span, std::initializer_list<factor> factors) {
        if (description)
            (void)checked_product(factors);
        else
            expect_size(what, span, factors);
    };
    expect_data("x", problem.x, {{"batch", s.batch}, {"seq", s.seq}, {"d_in", s.d_in}});
    (void)checked_product({{"batch", s.batch}, {"seq", s.seq}, {"d_k", s.d_k}});
    (void)checked_product({{"batch", s.batch}, {"seq", s.seq}, {"d_v", s.d_v}});
    if (s.d_out) (void)checked_product({{"batch", s.batch}, {"seq", s.seq}, {"d_out", s.d_out}});
    if (opt.return_weights)
        (void)checked_product({{"batch", s.batch}, {"heads", s.heads}, {"seq", s.seq}, {"seq", s.seq}});

    // Projections.
    expect_data("wq", problem.wq, {{"d_in", s.d_in}, {"d_k", s.d_k}});
    expect_data("wk", problem.wk, {{"d_in", s.d_in}, {"d_k", s.d_k}});
    expect_data("wv", problem.wv, {{"d_in", s.d_in}, {"d_v", s.d_v}});
    expect_bias("bq", problem.bq, {"d_k", s.d_k});
    expect_bias("bk", problem.bk, {"d_k", s.d_k});
    expect_bias("bv", problem.bv, {"d_v", s.d_v});

    // Optional output projection.
    if (s.d_out == 0) {
        if (!problem.wo.empty()) fail("wo given but shape.d_out is 0");
        if (!problem.bo.empty()) fail("bo given but shape.d_out is 0");
    } else {
        if (problem.wo.empty() && !description) fail("shape.d_out is " + std::to_string(s.d_out) + " but wo is empty");
        expect_data("wo", problem.wo, {{"d_v", s.d_v}, {"d_out", s.d_out}});
        expect_bias("bo", problem.bo, {"d_out", s.d_out});
    }

    // Masks.
    expect_mask_size("mask", problem.mask, s);
    expect_mask_size("additive_mask", problem.additive_mask, s);
    for (std::size_t i = 0; i < problem.mask.size(); ++i)
        if (problem.mask[i] > 1)
            fail("mask values must be 0 or 1 (element " + std::to_string(i) + " is " +
                 std::to_string(static_cast<unsigned>(problem.mask[i])) + ")");

    // Options.
    if (opt.scale && !std::isfinite(*opt.scale)) fail("scale must be finite");
    if (opt.precision != precision::fp32 && opt.precision != precision::fp16)
        fail("unknown precision (" + std::to_string(static_cast<int>(opt.precision)) + ")");
    if (opt.implementation != implementation::automatic && opt.implementation != implementation::staged &&
        opt.implementation != implementation::fused)
        fail("unknown implementation (" + std::to_string(static_cast<int>(opt.implementation)) + ")");
    if (opt.kernel != kernel_family::automatic && opt.kernel != kernel_family::row_tiles &&
        opt.kernel != kernel_family::block_tiles && opt.kernel != kernel_family::coopmat)
        fail("unknown kernel family (" + std::to_string(static_cast<int>(opt.kernel)) + ")");
    if (opt.return_weights && opt.implementation == implementation::fused)
        fail("return_weights needs the staged implementation; the fused one never materialises the weights");
}

}  // namespace

void validate(const attention_problem& problem) { check_problem(problem); }

void validate_description(const attention_problem& problem) { check_problem(problem, true); }

void cpu::validate(const cpu::attention_problem_f64& problem) { check_problem(problem); }

float default_scale(const attention_shape& shape) {
    if (shape.heads == 0 || shape.d_k < shape.heads)
        throw invalid_argument("default_scale needs heads >= 1 and d_k >= heads (heads is " +
                               std::to_string(shape.heads) + ", d_k is " + std::to_string(shape.d_k) + ")");
    const std::size_t head_width = shape.d_k / shape.heads;
    return static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_width)));
}

implementation resolve_implementation(const run_options& options) {
    if (options.implementation != implementation::automatic) return options.implementation;
    return options.return_weights ? implementation::staged : implementation::fused;
}

}  // namespace qkv
