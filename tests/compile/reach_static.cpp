// Compile-time reach, part of the default build (GCC, Clang, MinGW; MSVC with qkv::qkv's raised
// /constexpr:steps): under the compilers' DEFAULT constexpr limits (no -fconstexpr-* flag),
//  * one evaluation of qkv::self_attention at N = 64, d = 64, and
//  * qkv::staged::self_attention at the same size,
// each against a float64 reference computed independently (NumPy, tests/compile/
// gen_attention_reference.py) on pseudo-random inputs, and the two forms bit-identical.
// The large staged size (N = 256) is tests/compile/reach_staged_256.cpp, a CTest of its own.
#include <qkv/qkv.hpp>

#include "attention_reference.hpp"
#include "random_inputs.hpp"

namespace {

constexpr std::size_t N = 64, D = 64;
constexpr auto x = qkv_test::random_x<N, D>();
constexpr auto wq = qkv_test::random_w<D>(0);
constexpr auto wk = qkv_test::random_w<D>(1);
constexpr auto wv = qkv_test::random_w<D>(2);

// One constant evaluation of the whole attention (a constexpr variable: GCC evaluates a
// static_assert's condition twice, a variable's initialiser once).
constexpr auto plain = qkv::self_attention(x, wq, wk, wv);
constexpr double plain_error = qkv_test::max_error(plain.output, qkv_test::attention_reference_64_64);
static_assert(plain_error <= qkv_test::output_tolerance);
static_assert(qkv_test::max_magnitude(qkv_test::attention_reference_64_64) > 1.0);  // not a trivial reference

// The staged form: the same bits.
constexpr auto staged_r = qkv::staged::self_attention<x, wq, wk, wv>;
static_assert(staged_r == plain);

}  // namespace
