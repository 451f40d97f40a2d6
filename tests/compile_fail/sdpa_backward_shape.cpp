// Must not compile: the staged backward pass given a loss gradient of another shape than the
// output's (the concept qkv::staged::backward_inputs_for names the rule).
#include <qkv/staged_backward.hpp>
constexpr qkv::matrix<float, 3, 4> q{};
constexpr qkv::matrix<float, 5, 4> k{};
constexpr qkv::matrix<float, 5, 2> v{};
constexpr qkv::matrix<float, 3, 3> d_out{};
constexpr auto forward = qkv::scaled_dot_product_attention(q, k, v);
constexpr auto g = qkv::staged::sdpa_backward<q, k, v, forward, d_out>;
