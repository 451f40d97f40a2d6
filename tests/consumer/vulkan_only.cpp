// A program that links qkv::vulkan and nothing else of qkv's: with the linker's --as-needed (the
// default on some distributions) it records libqkv_vulkan.so alone, so libqkv_runtime.so must be
// found by libqkv_vulkan.so itself (its RUNPATH) when the installed package runs from any prefix.
#include <qkv/vulkan/runtime.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
    // The tutorial's example (README): x = 3 x 4, Wq, Wk, Wv 4 x 3, scale 1.
    const std::vector<float> x{1, 0, 1, 0, 0, 2, 0, 2, 1, 1, 1, 1};
    const std::vector<float> wk{0, 0, 1, 1, 1, 0, 0, 1, 0, 1, 1, 0}, wq{1, 0, 1, 1, 0, 0, 0, 0, 1, 0, 1, 1},
        wv{0, 2, 0, 0, 3, 0, 1, 0, 3, 1, 1, 0};
    qkv::attention_problem p{.shape = {.seq = 3, .d_in = 4, .d_k = 3, .d_v = 3}, .x = x, .wq = wq, .wk = wk, .wv = wv};
    p.options.scale = 1.f;
    try {
        qkv::vulkan::context ctx;
        const qkv::attention_output out = ctx.attention(p);
        std::printf("vulkan_only: output[0] = %.4f on %s\n", out.output[0], ctx.device().name.c_str());
        return std::abs(out.output[0] - 1.9366f) < 1e-3f ? 0 : 1;
    } catch (const qkv::vulkan::unavailable& e) {  // no Vulkan here: the libraries loaded, which is what this checks
        std::printf("vulkan_only: the libraries loaded; no Vulkan to run on (%s)\n", e.what());
        return 0;
    }
}
