// A real head's gradients at compile time: qkv::staged::sdpa_backward at L = S = 48, E = Ev = 16
// (causal, softcap 5, dropout 0.1) against float64 references from torch.autograd
// (tests/compile/gen_sdpa_backward_reference.py), on the staged forward's result; and the same bits
// as the one-evaluation qkv::sdpa_backward.
#include <qkv/qkv.hpp>

#include <cstddef>

#include "sdpa_backward_reference.hpp"

namespace {

namespace ref = qkv_test::sdpa_backward;

/// max |got - want| / max |want|.
template <class T, std::size_t R, std::size_t C>
constexpr double relative_error(const qkv::matrix<T, R, C>& got, const qkv::matrix<double, R, C>& want) {
    return qkv::max_abs_diff(qkv::cast<double>(got), want) / qkv::max_abs_diff(want, want * 0.0);
}
/// As sdpa_backward_static.cpp's: ten times the float32 error the script reports.
constexpr double tolerance = 2e-6;
static_assert(ref::float32_error * 10 <= tolerance);

constexpr qkv::sdpa_options_for<decltype(ref::q48), decltype(ref::k48)> options{
    .causal = qkv::causal_mode::top_left, .softcap = 5.f, .dropout = {.p = 0.1f, .seed = 31337}};
constexpr auto forward = qkv::staged::scaled_dot_product_attention<ref::q48, ref::k48, ref::v48, options>;
constexpr auto g = qkv::staged::sdpa_backward<ref::q48, ref::k48, ref::v48, forward, ref::d_out48, options>;
static_assert(relative_error(g.dq, ref::staged48_dq) <= tolerance);
static_assert(relative_error(g.dk, ref::staged48_dk) <= tolerance);
static_assert(relative_error(g.dv, ref::staged48_dv) <= tolerance);
static_assert(g == qkv::sdpa_backward(ref::q48, ref::k48, ref::v48, forward, ref::d_out48, options));

}  // namespace
