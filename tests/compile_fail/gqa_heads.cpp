// Must not compile: 3 K/V heads cannot serve 4 query heads (grouped-query attention needs Hkv | Hq).
#include <qkv/sdpa.hpp>
constexpr qkv::matrix<float, 3, 8> q{};  // 4 query heads of E = 2
constexpr qkv::matrix<float, 5, 6> k{};  // 3 K/V heads of E = 2
constexpr qkv::matrix<float, 5, 6> v{};
constexpr auto r = qkv::scaled_dot_product_attention<4, 3>(q, k, v);
