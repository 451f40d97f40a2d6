// Concept-based negative tests: shape errors are rejected by the signatures (the call is not
// viable), and the same checks accept the well-formed calls, so none of these can pass vacuously.
// tests/compile_fail/ holds the matching must-not-compile programs, run by CTest.
#include <qkv/qkv.hpp>

namespace {

template <std::size_t R, std::size_t C>
using m = qkv::matrix<float, R, C>;

template <class A, class B>
concept can_matmul = requires(const A& a, const B& b) {
    qkv::matmul(a, b);
};
template <class A, class B>
concept can_multiply = requires(const A& a, const B& b) {
    a* b;
};
template <class A, class B>
concept can_add = requires(const A& a, const B& b) {
    a + b;
};
template <class X, class WQ, class WK, class WV>
concept can_attend = requires(const X& x, const WQ& wq, const WK& wk, const WV& wv) {
    qkv::self_attention(x, wq, wk, wv);
};
template <std::size_t H, class X, class WQ, class WK, class WV>
concept can_multi_head = requires(const X& x, const WQ& wq, const WK& wk, const WV& wv) {
    qkv::multi_head_attention<H>(x, wq, wk, wv);
};

// matmul / operator*: inner dimensions must agree, element types must agree.
static_assert(can_matmul<m<2, 3>, m<3, 4>>);
static_assert(!can_matmul<m<2, 3>, m<2, 4>>);
static_assert(!can_matmul<m<2, 3>, qkv::matrix<double, 3, 4>>);
static_assert(can_multiply<m<2, 3>, m<3, 4>>);
static_assert(!can_multiply<m<2, 3>, m<4, 3>>);
static_assert(can_multiply<m<2, 3>, float>);

// Element-wise operations need equal shapes.
static_assert(can_add<m<2, 3>, m<2, 3>>);
static_assert(!can_add<m<2, 3>, m<3, 2>>);

// self_attention: x's width must match the projections' rows, and d_q must equal d_k.
static_assert(can_attend<m<3, 4>, m<4, 3>, m<4, 3>, m<4, 2>>);   // d_v may differ
static_assert(!can_attend<m<3, 4>, m<4, 3>, m<4, 2>, m<4, 3>>);  // d_q != d_k
static_assert(!can_attend<m<3, 5>, m<4, 3>, m<4, 3>, m<4, 3>>);  // d_in mismatch
static_assert(!can_attend<m<3, 4>, m<4, 3>, m<4, 3>, m<5, 3>>);  // wv rows mismatch
static_assert(!can_attend<qkv::matrix<int, 3, 4>, qkv::matrix<int, 4, 3>, qkv::matrix<int, 4, 3>,
                          qkv::matrix<int, 4, 3>>);  // integer attention is not offered

// multi_head_attention: H must divide d_k and d_v.
static_assert(can_multi_head<2, m<3, 4>, m<4, 4>, m<4, 4>, m<4, 6>>);
static_assert(!can_multi_head<2, m<3, 4>, m<4, 3>, m<4, 3>, m<4, 4>>);  // 2 does not divide d_k = 3
static_assert(!can_multi_head<4, m<3, 4>, m<4, 4>, m<4, 4>, m<4, 6>>);  // 4 does not divide d_v = 6
static_assert(!can_multi_head<0, m<3, 4>, m<4, 4>, m<4, 4>, m<4, 4>>);  // no heads

// The shape concepts themselves.
static_assert(qkv::inner_dimensions_match<m<1, 7>, m<7, 1>>);
static_assert(!qkv::inner_dimensions_match<m<1, 7>, m<1, 7>>);
static_assert(qkv::heads_divide<3, 6, 9> && !qkv::heads_divide<3, 6, 8>);

}  // namespace
