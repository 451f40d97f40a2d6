// Must not compile: 2 heads cannot split d_k = 3.
#include <qkv/multi_head.hpp>
constexpr qkv::matrix<float, 3, 4> x{};
constexpr qkv::matrix<float, 4, 3> w{};
constexpr auto r = qkv::multi_head_attention<2>(x, w, w, w);
