// qkv::validate for SDPA backward problems: the forward problem's checks, then the saved tensors'
// and the loss gradient's.
#include <cmath>
#include <cstddef>
#include <limits>
#include <string>

#include "qkv/runtime/error.hpp"
#include "qkv/runtime/sdpa_backward.hpp"
#include "runtime/shape_checks.hpp"

namespace qkv {
namespace {

using namespace shape_checks;

template <class T>
void check_backward(const basic_sdpa_backward_problem<T>& problem) {
    validate(problem.forward);
    const sdpa_shape& s = problem.forward.shape;
    const std::initializer_list<factor> output{
        {"batch", s.batch}, {"q_heads", s.q_heads}, {"q_len", s.q_len}, {"d_v", s.d_v}};
    // A NaN or infinite d_out is taken, as the forward takes NaN inputs: it poisons the gradients it
    // reaches (a scaled fp16 loss that overflowed must reach them, so that a gradient scaler sees it).
    expect_size("d_out", problem.d_out, output);
    if (!problem.out.empty()) expect_size("out", problem.out, output);
    if (!problem.lse.empty()) {
        expect_size("lse", problem.lse, {{"batch", s.batch}, {"q_heads", s.q_heads}, {"q_len", s.q_len}});
        for (std::size_t i = 0; i < problem.lse.size(); ++i)
            if (static_cast<double>(problem.lse[i]) == std::numeric_limits<double>::infinity())
                fail("lse element " + std::to_string(i) +
                     " is +inf: a log-sum-exp beyond the range of its type, from which no probability can be "
                     "recomputed exactly");
    }
    if (problem.return_d_additive_mask && problem.forward.additive_mask.empty())
        fail("return_d_additive_mask is set, but the problem has no additive_mask");
}

}  // namespace

void validate(const sdpa_backward_problem& problem) { check_backward(problem); }

void validate_description(const sdpa_backward_problem& problem) {
    validate_description(problem.forward);
    for (const auto& [name, span] :
         {std::pair{"out", problem.out}, std::pair{"lse", problem.lse}, std::pair{"d_out", problem.d_out}})
        if (!span.empty())
            fail(std::string(name) + " must be empty: the description of a call over device tensors holds no data (" +
                 name + " has " + std::to_string(span.size()) + " elements)");
    if (problem.return_d_additive_mask && problem.forward.additive_mask.empty())
        fail("return_d_additive_mask is set, but the problem has no additive_mask");
}
void validate(const sdpa_backward_problem_f64& problem) { check_backward(problem); }

}  // namespace qkv
