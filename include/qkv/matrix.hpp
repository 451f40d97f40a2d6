// qkv::matrix — a fixed-size, literal, regular matrix value type for constant expressions.
//
//   constexpr qkv::matrix x{{{1.f, 0.f, 1.f, 0.f},
//                            {0.f, 2.f, 0.f, 2.f}}};            // CTAD: matrix<float, 2, 4>
//   constexpr auto w = qkv::matrix_of<float>({{1, 0}, {0, 1}});  // mixed literals, element type named
//   constexpr auto y = x * qkv::transpose(x);                    // matrix product, 2x2
//
// Shape mismatches are rejected by the signatures' constraints (see the concepts below), so a
// wrong product reads "the required expression ... inner_dimensions_match<...>" rather than a
// template backtrace.
#pragma once

#include <cstddef>
#include <type_traits>
#include <utility>

#include "qkv/math.hpp"

namespace qkv {

/// Row-major R x C matrix of T. An aggregate: `matrix<float, 2, 3> m{{{1, 2, 3}, {4, 5, 6}}}`.
/// Zero rows or columns are not allowed (attention over an empty sequence has no meaning here).
template <class T, std::size_t R, std::size_t C>
requires(R > 0 && C > 0 && std::is_arithmetic_v<T>) struct matrix {
    using value_type = T;
    static constexpr std::size_t rows = R;
    static constexpr std::size_t cols = C;

    T elems[R][C];

    constexpr T& operator()(std::size_t r, std::size_t c) { return elems[r][c]; }
    constexpr const T& operator()(std::size_t r, std::size_t c) const { return elems[r][c]; }
    constexpr T (&operator[](std::size_t r))[C] { return elems[r]; }
    constexpr const T (&operator[](std::size_t r) const)[C] { return elems[r]; }

    friend constexpr bool operator==(const matrix&, const matrix&) = default;
};

/// Deduce element type and shape from uniform nested braces: `matrix m{{{1.f, 2.f}, {3.f, 4.f}}}`.
template <class T, std::size_t R, std::size_t C>
matrix(const T (&)[R][C]) -> matrix<T, R, C>;

/// A 1 x N matrix: biases and single rows.
template <class T, std::size_t N>
using row_vector = matrix<T, 1, N>;

/// Build a matrix with a named element type from nested braces of any arithmetic literals:
/// `qkv::matrix_of<float>({{1, 0, 1, 0}, {0, 2, 0, 2}})`.
template <class T, std::size_t R, std::size_t C>
constexpr matrix<T, R, C> matrix_of(const T (&values)[R][C]) {
    matrix<T, R, C> m{};
    for (std::size_t r = 0; r < R; ++r)
        for (std::size_t c = 0; c < C; ++c) m.elems[r][c] = values[r][c];
    return m;
}

/// Build a 1 x N row vector: `qkv::row_of<float>({1, 2, 3})`.
template <class T, std::size_t N>
constexpr row_vector<T, N> row_of(const T (&values)[N]) {
    row_vector<T, N> v{};
    for (std::size_t c = 0; c < N; ++c) v.elems[0][c] = values[c];
    return v;
}

// ---------------------------------------------------------------------------------------------
// Concepts: the shape rules, named so a compiler's "constraints not satisfied" says which rule.

template <class M>
struct is_matrix : std::false_type {};
template <class T, std::size_t R, std::size_t C>
struct is_matrix<matrix<T, R, C>> : std::true_type {};

/// Any qkv::matrix (cv/ref-qualified allowed).
template <class M>
concept any_matrix = is_matrix<std::remove_cvref_t<M>>::value;

/// A's columns equal B's rows, and both hold the same element type: A · B is defined.
template <class A, class B>
concept inner_dimensions_match =
    any_matrix<A> && any_matrix<B> && std::remove_cvref_t<A>::cols ==
    std::remove_cvref_t<B>::rows&&
        std::is_same_v<typename std::remove_cvref_t<A>::value_type, typename std::remove_cvref_t<B>::value_type>;

/// A and B have the same shape and element type: element-wise operations are defined.
template <class A, class B>
concept same_shape =
    any_matrix<A> && any_matrix<B> &&
    std::remove_cvref_t<A>::rows == std::remove_cvref_t<B>::rows&& std::remove_cvref_t<A>::cols ==
    std::remove_cvref_t<B>::cols&&
        std::is_same_v<typename std::remove_cvref_t<A>::value_type, typename std::remove_cvref_t<B>::value_type>;

// ---------------------------------------------------------------------------------------------
// Shape operations

template <class T, std::size_t R, std::size_t C>
constexpr matrix<T, C, R> transpose(const matrix<T, R, C>& m) {
    matrix<T, C, R> t{};
    for (std::size_t r = 0; r < R; ++r)
        for (std::size_t c = 0; c < C; ++c) t.elems[c][r] = m.elems[r][c];
    return t;
}

/// Columns [first, first + Count) of m (first is checked in constant evaluation: out of range
/// does not compile).
template <std::size_t Count, class T, std::size_t R, std::size_t C>
requires(Count > 0 && Count <= C) constexpr matrix<T, R, Count> columns(const matrix<T, R, C>& m, std::size_t first) {
    matrix<T, R, Count> out{};
    for (std::size_t r = 0; r < R; ++r)
        for (std::size_t c = 0; c < Count; ++c) out.elems[r][c] = m.elems[r][first + c];
    return out;
}

/// Write `part` into columns [first, first + C2) of m.
template <class T, std::size_t R, std::size_t C, std::size_t C2>
requires(C2 <= C) constexpr void set_columns(matrix<T, R, C>& m, std::size_t first, const matrix<T, R, C2>& part) {
    for (std::size_t r = 0; r < R; ++r)
        for (std::size_t c = 0; c < C2; ++c) m.elems[r][first + c] = part.elems[r][c];
}

/// A matrix with every element equal to `value`.
template <class T, std::size_t R, std::size_t C>
constexpr matrix<T, R, C> filled(T value) {
    matrix<T, R, C> m{};
    for (std::size_t r = 0; r < R; ++r)
        for (std::size_t c = 0; c < C; ++c) m.elems[r][c] = value;
    return m;
}

// ---------------------------------------------------------------------------------------------
// Products

namespace detail {

// Dot products as fold expressions. A constant evaluation is capped per evaluation (GCC counts
// evaluated operations, Clang full-expressions), and a loop costs a loop's bookkeeping per term,
// where a fold over an index_sequence is one expression: the same sums reach much larger shapes.
// Each fold is a left fold, ((T{} + p0) + p1) + ..., the order of the plain loop
// `acc += p_k`, so the results are the same bits. Folds are cut into chunks of `fold_chunk`
// terms (a chunk's result seeds the next), which keeps the expression trees shallow.
inline constexpr std::size_t fold_chunk = 64;

constexpr std::size_t chunk_length(std::size_t n, std::size_t chunk) {
    return n - chunk * fold_chunk < fold_chunk ? n - chunk * fold_chunk : fold_chunk;
}

// acc + a[B + k] * b[B + k] for k in K..., in order.
template <std::size_t B, class T, std::size_t D, std::size_t... K>
constexpr T dot_chunk(T acc, const T (&a)[D], const T (&b)[D], std::index_sequence<K...>) {
    return (acc + ... + (a[B + K] * b[B + K]));
}

template <class T, std::size_t D, std::size_t... Chunk>
constexpr T dot_chunks(const T (&a)[D], const T (&b)[D], std::index_sequence<Chunk...>) {
    T acc{};
    ((acc = dot_chunk<Chunk * fold_chunk>(acc, a, b, std::make_index_sequence<chunk_length(D, Chunk)>{})), ...);
    return acc;
}

// acc + a[B + k] * b[B + k][j] for k in K..., in order (a row times column j).
template <std::size_t B, class T, std::size_t D, std::size_t C, std::size_t... K>
constexpr T dot_col_chunk(T acc, const T (&a)[D], const T (&b)[D][C], std::size_t j, std::index_sequence<K...>) {
    return (acc + ... + (a[B + K] * b[B + K][j]));
}

template <class T, std::size_t D, std::size_t C, std::size_t... Chunk>
constexpr T dot_col_chunks(const T (&a)[D], const T (&b)[D][C], std::size_t j, std::index_sequence<Chunk...>) {
    T acc{};
    ((acc = dot_col_chunk<Chunk * fold_chunk>(acc, a, b, j, std::make_index_sequence<chunk_length(D, Chunk)>{})), ...);
    return acc;
}

/// Σ_k a[k]·b[k], accumulated in T in index order from T{}.
template <class T, std::size_t D>
constexpr T dot(const T (&a)[D], const T (&b)[D]) {
    return dot_chunks(a, b, std::make_index_sequence<(D + fold_chunk - 1) / fold_chunk>{});
}

/// Σ_k a[k]·b[k][j] (row a times column j of b), accumulated in T in index order from T{}.
template <class T, std::size_t D, std::size_t C>
constexpr T dot_col(const T (&a)[D], const T (&b)[D][C], std::size_t j) {
    return dot_col_chunks(a, b, j, std::make_index_sequence<(D + fold_chunk - 1) / fold_chunk>{});
}

/// Row i of A · B into `out` (C entries).
template <class T, std::size_t D, std::size_t C>
constexpr void matmul_row(const T (&a)[D], const T (&b)[D][C], T (&out)[C]) {
    for (std::size_t j = 0; j < C; ++j) out[j] = dot_col(a, b, j);
}

}  // namespace detail

/// Matrix product A · B; accumulates in T in index order (the same order as the CPU reference).
template <class A, class B>
requires inner_dimensions_match<A, B>
constexpr auto matmul(const A& a, const B& b) {
    using T = typename A::value_type;
    matrix<T, A::rows, B::cols> out{};
    for (std::size_t i = 0; i < A::rows; ++i) detail::matmul_row(a.elems[i], b.elems, out.elems[i]);
    return out;
}

/// `a * b` is the matrix product (as in mathematics and Eigen); element-wise is `hadamard`.
template <class A, class B>
requires inner_dimensions_match<A, B>
constexpr auto operator*(const A& a, const B& b) { return matmul(a, b); }

/// Element-wise product.
template <class A, class B>
requires same_shape<A, B>
constexpr A hadamard(const A& a, const B& b) {
    A out{};
    for (std::size_t r = 0; r < A::rows; ++r)
        for (std::size_t c = 0; c < A::cols; ++c) out.elems[r][c] = a.elems[r][c] * b.elems[r][c];
    return out;
}

// ---------------------------------------------------------------------------------------------
// Element-wise arithmetic

template <class A, class B>
requires same_shape<A, B>
constexpr A operator+(const A& a, const B& b) {
    A out{};
    for (std::size_t r = 0; r < A::rows; ++r)
        for (std::size_t c = 0; c < A::cols; ++c) out.elems[r][c] = a.elems[r][c] + b.elems[r][c];
    return out;
}

template <class A, class B>
requires same_shape<A, B>
constexpr A operator-(const A& a, const B& b) {
    A out{};
    for (std::size_t r = 0; r < A::rows; ++r)
        for (std::size_t c = 0; c < A::cols; ++c) out.elems[r][c] = a.elems[r][c] - b.elems[r][c];
    return out;
}

template <class T, std::size_t R, std::size_t C>
constexpr matrix<T, R, C> operator-(const matrix<T, R, C>& a) {
    matrix<T, R, C> out{};
    for (std::size_t r = 0; r < R; ++r)
        for (std::size_t c = 0; c < C; ++c) out.elems[r][c] = -a.elems[r][c];
    return out;
}

template <class T, std::size_t R, std::size_t C>
constexpr matrix<T, R, C> operator*(const matrix<T, R, C>& a, T s) {
    matrix<T, R, C> out{};
    for (std::size_t r = 0; r < R; ++r)
        for (std::size_t c = 0; c < C; ++c) out.elems[r][c] = a.elems[r][c] * s;
    return out;
}

template <class T, std::size_t R, std::size_t C>
constexpr matrix<T, R, C> operator*(T s, const matrix<T, R, C>& a) {
    return a * s;
}

template <class T, std::size_t R, std::size_t C>
constexpr matrix<T, R, C> operator/(const matrix<T, R, C>& a, T s) {
    matrix<T, R, C> out{};
    for (std::size_t r = 0; r < R; ++r)
        for (std::size_t c = 0; c < C; ++c) out.elems[r][c] = a.elems[r][c] / s;
    return out;
}

/// Add a 1 x C row vector to every row (a bias).
template <class T, std::size_t R, std::size_t C>
constexpr matrix<T, R, C> add_row(const matrix<T, R, C>& a, const row_vector<T, C>& row) {
    matrix<T, R, C> out{};
    for (std::size_t r = 0; r < R; ++r)
        for (std::size_t c = 0; c < C; ++c) out.elems[r][c] = a.elems[r][c] + row.elems[0][c];
    return out;
}

/// Apply f to every element.
template <class F, class T, std::size_t R, std::size_t C>
constexpr auto map(const matrix<T, R, C>& a, F f) {
    using U = std::remove_cvref_t<decltype(f(a.elems[0][0]))>;
    matrix<U, R, C> out{};
    for (std::size_t r = 0; r < R; ++r)
        for (std::size_t c = 0; c < C; ++c) out.elems[r][c] = f(a.elems[r][c]);
    return out;
}

/// Convert the element type.
template <class U, class T, std::size_t R, std::size_t C>
constexpr matrix<U, R, C> cast(const matrix<T, R, C>& a) {
    return map(a, [](T v) { return static_cast<U>(v); });
}

// ---------------------------------------------------------------------------------------------
// Comparison

/// True when every |a - b| <= tol (an absolute tolerance). Any NaN makes it false.
template <class A, class B>
requires same_shape<A, B> && std::is_floating_point_v<typename A::value_type>
constexpr bool approx_equal(const A& a, const B& b, typename A::value_type tol) {
    for (std::size_t r = 0; r < A::rows; ++r)
        for (std::size_t c = 0; c < A::cols; ++c) {
            const auto d = a.elems[r][c] - b.elems[r][c];
            if (!(qkv::abs(d) <= tol)) return false;  // written so NaN fails
        }
    return true;
}

/// Largest |a - b| over all elements (NaN if any element is NaN).
template <class A, class B>
requires same_shape<A, B> && std::is_floating_point_v<typename A::value_type>
constexpr typename A::value_type max_abs_diff(const A& a, const B& b) {
    typename A::value_type worst{};
    for (std::size_t r = 0; r < A::rows; ++r)
        for (std::size_t c = 0; c < A::cols; ++c) {
            const auto d = qkv::abs(a.elems[r][c] - b.elems[r][c]);
            if (qkv::isnan(d)) return d;
            if (d > worst) worst = d;
        }
    return worst;
}

}  // namespace qkv
