// Must not compile: the staged form with queries of width 3 and keys of width 2 (d_q != d_k).
#include <qkv/staged.hpp>
constexpr qkv::matrix<float, 3, 4> x{};
constexpr qkv::matrix<float, 4, 3> wq{};
constexpr qkv::matrix<float, 4, 2> wk{};
constexpr qkv::matrix<float, 4, 3> wv{};
constexpr auto r = qkv::staged::self_attention<x, wq, wk, wv>;
