// Must not compile: options with sinks for 4 query heads given to the form with 12 query heads
// (sdpa_options_for<Q, K, H> must have H = HQ, or 1 for one sink shared by every head).
#include <qkv/sdpa.hpp>
constexpr qkv::matrix<float, 3, 24> q{};  // 12 query heads of E = 2
constexpr qkv::matrix<float, 5, 8> k{};   // 4 K/V heads of E = 2
constexpr qkv::matrix<float, 5, 8> v{};
constexpr qkv::sdpa_options_for<decltype(q), decltype(k), 4> four_sinks{};
constexpr auto r = qkv::scaled_dot_product_attention<12, 4>(q, k, v, four_sinks);
