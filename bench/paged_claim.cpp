// The cost of checking a device block table's appends on the device: one continuous-batching step
// of a qkv::vulkan::paged_call that appends one row to each of B sequences (lengths log-uniform in
// [16, S] from the seed, pages of 16 in shuffled order, Hq = 32, Hkv = 8, d = 128, f32 pool,
// causal bottom-right), timed in one run two ways on the same call, pool and tensors:
//
//   span    the block table as a host span: the host checks it (the pool rows of the appends
//           included) when the step is recorded; no device pass
//   tensor  the same table as an i32 device tensor: the step's commands copy it, check its entries,
//           claim the new rows' pool rows (shaders/paged_claim.comp) and map them on the device
//
// Each step writes every sequence's last key again with the values it holds (cache_seqlens S_b - 1,
// one new row), so every round is the same step and the pool stays as it was; the two forms'
// outputs must be equal bit for bit (a mismatch fails the run). Rounds alternate between the forms
// (W warm-up rounds each first); the medians of R rounds in milliseconds of wall time, and the ratio
// tensor / span. Built against a library without the claim pass, the same program gives the cost
// before it (bench/RESULTS.md, "Appends through a device block table").
//
//   build/gcc/bin/qkv_paged_claim_bench [B] [S] [R] [W]   (defaults 64 2048 15 3; the pool must fit one
//   storage buffer, which appends bind)
#include <qkv/runtime/paged.hpp>
#include <qkv/vulkan/runtime.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <numeric>
#include <random>
#include <stdexcept>
#include <vector>

namespace {

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

std::size_t arg(int argc, char** argv, int i, std::size_t fallback) {
    return argc > i ? static_cast<std::size_t>(std::strtoull(argv[i], nullptr, 10)) : fallback;
}

}  // namespace

int main(int argc, char** argv) try {
    const std::size_t B = arg(argc, argv, 1, 64), S = arg(argc, argv, 2, 2048);
    const std::size_t R = std::max<std::size_t>(arg(argc, argv, 3, 15), 1), W = arg(argc, argv, 4, 3);
    const std::size_t Hq = 32, Hkv = 8, d = 128, page = 16;
    if (B == 0 || S < 16) throw std::invalid_argument("B >= 1 and S >= 16");
    std::mt19937_64 rng(2026);
    std::uniform_real_distribution<double> u(std::log(16.0), std::log(static_cast<double>(S)));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<std::size_t> len(B);
    for (std::size_t& l : len) l = static_cast<std::size_t>(std::exp(u(rng)));
    std::size_t pages = 0, columns = 1;
    for (const std::size_t l : len) pages += (l + page - 1) / page, columns = std::max(columns, (l + page - 1) / page);
    std::vector<std::int32_t> order(pages);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<std::int32_t> table(B * columns, -1), before(B);
    std::size_t next = 0;
    for (std::size_t b = 0; b < B; ++b) {
        for (std::size_t i = 0; i < (len[b] + page - 1) / page; ++i) table[b * columns + i] = order[next++];
        before[b] = static_cast<std::int32_t>(len[b] - 1);
    }
    // The pool (1, Hkv, rows, d) on the device; the new rows (B, 1, Hkv, d): each sequence's last key.
    const std::size_t rows = pages * page;
    std::vector<float> k(Hkv * rows * d), v(Hkv * rows * d), q(B * Hq * d);
    for (float& x : k) x = normal(rng);
    for (float& x : v) x = normal(rng);
    for (float& x : q) x = normal(rng);
    std::vector<float> k_new(B * Hkv * d), v_new(B * Hkv * d);
    for (std::size_t b = 0; b < B; ++b) {
        const std::size_t j = len[b] - 1;
        const std::size_t row = static_cast<std::size_t>(table[b * columns + j / page]) * page + j % page;
        for (std::size_t h = 0; h < Hkv; ++h)
            for (std::size_t e = 0; e < d; ++e) {
                k_new[(b * Hkv + h) * d + e] = k[(h * rows + row) * d + e];
                v_new[(b * Hkv + h) * d + e] = v[(h * rows + row) * d + e];
            }
    }
    qkv::vulkan::context ctx;
    qkv::vulkan::kv_cache pool(ctx, {.batch = 1, .kv_heads = Hkv, .capacity = rows, .d_qk = d, .d_v = d});
    pool.append(k, v, rows);
    qkv::paged_problem desc{.q_heads = Hq,
                            .kv_heads = Hkv,
                            .d_qk = d,
                            .d_v = d,
                            .page_size = page,
                            .max_pages = columns,
                            .q_len = 1,
                            .options = {.causal = true, .alignment = qkv::causal_alignment::bottom_right}};
    desc.cascade = false, desc.new_rows = 1;
    qkv::vulkan::paged_call call(ctx, desc, pool);
    qkv::vulkan::tensor tq(ctx, {B, 1, Hq, d}), to(ctx, {B, 1, Hq, d});
    qkv::vulkan::tensor tk(ctx, {B, 1, Hkv, d}), tv(ctx, {B, 1, Hkv, d});
    qkv::vulkan::tensor tt(ctx, {B, columns}, qkv::element_type::i32);
    tq.upload(q), tk.upload(k_new), tv.upload(v_new), tt.upload(table);
    qkv::vulkan::paged_tensors span{.q = &tq, .out = &to, .k_new = &tk, .v_new = &tv};
    span.block_table = table, span.cache_seqlens = before;
    qkv::vulkan::paged_tensors tensor = span;
    tensor.block_table = {}, tensor.block_table_tensor = &tt;
    std::vector<double> span_ms, tensor_ms;
    std::vector<float> span_out, tensor_out;
    for (std::size_t i = 0; i < W + R; ++i)
        for (const bool device : {false, true}) {
            const auto t0 = std::chrono::steady_clock::now();
            call.run(device ? tensor : span);
            const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
            if (i >= W) (device ? tensor_ms : span_ms).push_back(ms);
            if (i == 0) (device ? tensor_out : span_out) = to.download();
        }
    if (span_out != tensor_out) {
        std::fprintf(stderr, "qkv_paged_claim_bench: the two forms' outputs differ\n");
        return 1;
    }
    std::size_t keys = std::accumulate(len.begin(), len.end(), std::size_t{0});
    std::printf("%s: B = %zu sequences, %zu keys (log-uniform in [16, %zu]), %zu pool rows, %zu rounds\n",
                ctx.device().name.c_str(), B, keys, S, rows, R);
    const double a = median(span_ms), b = median(tensor_ms);
    std::printf("span    %9.3f ms (median; min %.3f, max %.3f)\n", a, *std::min_element(span_ms.begin(), span_ms.end()),
                *std::max_element(span_ms.begin(), span_ms.end()));
    std::printf("tensor  %9.3f ms (median; min %.3f, max %.3f)\n", b,
                *std::min_element(tensor_ms.begin(), tensor_ms.end()),
                *std::max_element(tensor_ms.begin(), tensor_ms.end()));
    std::printf("tensor / span  %.3f (the outputs equal bit for bit)\n", b / a);
    return 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "qkv_paged_claim_bench: %s\n", e.what());
    return 1;
}
