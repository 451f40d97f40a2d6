// Compile-time reach at a real head's size: qkv::staged::self_attention at N = 256, d = 64 under
// the compilers' DEFAULT constexpr limits (no -fconstexpr-* flag), against a float64 reference
// computed independently (NumPy, tests/compile/gen_attention_reference.py) on pseudo-random
// inputs. About 11.5 million multiply-adds, which one constant evaluation cannot hold: the staged
// form spreads them over a few dozen evaluations.
//
// Not part of the default build (it takes tens of seconds and GCC holds about 2 GiB while
// compiling it): CTest's constexpr_reach.staged_256 compiles it with -fsyntax-only on the GCC and
// Clang legs; tools/measure_constexpr_limits.sh --reach times it.
#include <qkv/qkv.hpp>

#include "attention_reference.hpp"
#include "random_inputs.hpp"

namespace {

constexpr std::size_t N = 256, D = 64;
constexpr auto x = qkv_test::random_x<N, D>();
constexpr auto wq = qkv_test::random_w<D>(0);
constexpr auto wk = qkv_test::random_w<D>(1);
constexpr auto wv = qkv_test::random_w<D>(2);

constexpr auto r = qkv::staged::self_attention<x, wq, wk, wv>;
constexpr double error = qkv_test::max_error(r.output, qkv_test::attention_reference_256_64);
static_assert(error <= qkv_test::output_tolerance);
static_assert(qkv_test::max_magnitude(qkv_test::attention_reference_256_64) > 1.0);  // not a trivial reference

// The steps are consistent with each other: every row of weights sums to 1 (within float32
// rounding of 256 terms), and the attention spreads (no row is one-hot: softmax is exercised).
constexpr bool rows_normalised = [] {
    for (std::size_t i = 0; i < N; ++i) {
        double sum = 0, largest = 0;
        for (std::size_t j = 0; j < N; ++j) {
            sum += static_cast<double>(r.weights(i, j));
            if (r.weights(i, j) > largest) largest = static_cast<double>(r.weights(i, j));
        }
        if (!(sum > 1 - 1e-5 && sum < 1 + 1e-5) || largest > 0.9) return false;
    }
    return true;
}();
static_assert(rows_normalised);

}  // namespace
