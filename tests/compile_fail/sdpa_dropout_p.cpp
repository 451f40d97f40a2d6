// Must not compile: a dropout probability of 1 (the library throws qkv::option_error, which at
// compile time makes the initialiser not a constant expression; the diagnostic shows the reason).
#include <qkv/sdpa.hpp>
constexpr qkv::matrix<float, 3, 4> q{};
constexpr qkv::matrix<float, 5, 4> k{};
constexpr qkv::matrix<float, 5, 2> v{};
constexpr auto r = qkv::scaled_dot_product_attention(q, k, v, {.dropout = {.p = 1.f}});
