// A first program with qkv's compile-time core: causal self-attention over three tokens, checked
// by the compiler (static_assert) and printed at run time. Build: any C++20 compiler, with
// include/ on the include path (or link CMake's qkv::qkv); no Vulkan needed.
#include <qkv/qkv.hpp>

#include <cstdio>

// Three tokens of width 4 and the projections to queries, keys and values (width 3).
constexpr auto x = qkv::matrix_of<float>({{1, 0, 1, 0}, {0, 2, 0, 2}, {1, 1, 1, 1}});
constexpr auto wq = qkv::matrix_of<float>({{1, 0, 1}, {1, 0, 0}, {0, 0, 1}, {0, 1, 1}});
constexpr auto wk = qkv::matrix_of<float>({{0, 0, 1}, {1, 1, 0}, {0, 1, 0}, {1, 1, 0}});
constexpr auto wv = qkv::matrix_of<float>({{0, 2, 0}, {0, 3, 0}, {1, 0, 3}, {1, 1, 0}});

// Each token attends to itself and the tokens before it; the scale is 1/sqrt(3) by default.
constexpr auto r = qkv::self_attention(x, wq, wk, wv, {.causal = true});

// The first token sees only itself: its output is its own value row, exactly.
static_assert(r.output(0, 0) == 1.0f && r.output(0, 1) == 2.0f && r.output(0, 2) == 3.0f);
// Nobody attends to the future: those weights are exactly zero, and every row sums to 1.
static_assert(r.weights(0, 1) == 0.0f && r.weights(0, 2) == 0.0f && r.weights(1, 2) == 0.0f);
constexpr float row_sum = r.weights(1, 0) + r.weights(1, 1);
static_assert(row_sum > 1.0f - 1e-6f && row_sum < 1.0f + 1e-6f);

int main() {
    std::printf("qkv %s: causal self-attention, computed by the compiler\n", qkv::version_string);
    for (std::size_t i = 0; i < decltype(r.output)::rows; ++i) {
        std::printf("token %u:", static_cast<unsigned>(i));
        for (std::size_t j = 0; j < decltype(r.output)::cols; ++j) std::printf(" %8.4f", r.output(i, j));
        std::printf("   weights");
        for (std::size_t j = 0; j < decltype(r.weights)::cols; ++j) std::printf(" %6.4f", r.weights(i, j));
        std::printf("\n");
    }
    return 0;
}
