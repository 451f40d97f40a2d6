// Must not compile: 5 keys but 4 values.
#include <qkv/sdpa.hpp>
constexpr qkv::matrix<float, 3, 4> q{};
constexpr qkv::matrix<float, 5, 4> k{};
constexpr qkv::matrix<float, 4, 2> v{};
constexpr auto r = qkv::scaled_dot_product_attention(q, k, v);
