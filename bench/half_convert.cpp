// float32 <-> float16 conversion throughput on the host, three ways in one run:
//
//   scalar       qkv::to_half_bits(float) / qkv::from_half_bits(std::uint16_t) value by value:
//                what every bulk conversion of the library did before the span functions
//   branch-free  the vectorized loops of src/runtime/half_bits.hpp (the span functions' path on
//                a CPU without F16C)
//   bulk         qkv::to_half_bits / qkv::from_half_bits over spans: F16C where the CPU has it
//
// Values: N (default 2^24) normally distributed floats times 8 (every one a finite float16 once
// rounded), the same for every form; each form runs R rounds (default 7), the median reported in
// millions of values per second, with its ratio to the scalar form. The results of the forms are
// compared bit for bit (a mismatch fails the run).
//
// Then a float16 store of values times a scale (0.5; a call's value scale), checked for overflow
// first as put_halves does, two ways: through a scaled float32 copy of the whole input (as the
// library did), and with the scale applied within the check and the conversion, block by block
// (qkv::half_overflow_index and qkv::to_half_bits with a scale), in Mvalues/s.
//
//   build/gcc/bin/qkv_half_bench [N] [R]
//
// Numbers: bench/RESULTS.md, "float16 conversion on the host".
#include <qkv/runtime/element_type.hpp>
#include <qkv/runtime/half.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif
#include <random>
#include <span>
#include <vector>

#include "runtime/half_bits.hpp"

namespace {

double median_seconds(int rounds, const std::function<void()>& run) {
    std::vector<double> t;
    run();  // warm: pages touched, caches
    for (int r = 0; r < rounds; ++r) {
        const auto start = std::chrono::steady_clock::now();
        run();
        t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
    const std::size_t n = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : std::size_t{1} << 24;
    const int rounds = argc > 2 ? std::atoi(argv[2]) : 7;
    if (n == 0 || rounds < 1) {
        std::fprintf(stderr, "usage: qkv_half_bench [N > 0] [rounds > 0]\n");
        return 2;
    }
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 8.0f);
    std::vector<float> in(n), back_scalar(n), back_portable(n), back_bulk(n);
    for (float& x : in) x = normal(rng);
    std::vector<std::uint16_t> h_scalar(n), h_portable(n), h_bulk(n);

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();  // as src/runtime/element_type.cpp decides
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    const bool f16c =
        __builtin_cpu_supports("avx") && __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
#else
    const bool f16c = false;
#endif
    std::printf("%zu values, median of %d rounds; CPU has F16C: %s\n", n, rounds, f16c ? "yes" : "no");
    std::printf(
        "direction | scalar Mvalues/s | branch-free Mvalues/s | bulk Mvalues/s | branch-free / scalar | "
        "bulk / scalar\n");

    const double to_scalar = median_seconds(rounds, [&] {
        for (std::size_t i = 0; i < n; ++i) h_scalar[i] = qkv::to_half_bits(in[i]);
    });
    const double to_portable =
        median_seconds(rounds, [&] { qkv::half_detail::to_halves(in.data(), h_portable.data(), n); });
    const double to_bulk = median_seconds(rounds, [&] { qkv::to_half_bits(in, h_bulk); });
    const double from_scalar = median_seconds(rounds, [&] {
        for (std::size_t i = 0; i < n; ++i) back_scalar[i] = qkv::from_half_bits(h_scalar[i]);
    });
    const double from_portable =
        median_seconds(rounds, [&] { qkv::half_detail::from_halves(h_scalar.data(), back_portable.data(), n); });
    const double from_bulk = median_seconds(rounds, [&] { qkv::from_half_bits(h_scalar, back_bulk); });

    const auto row = [&](const char* what, double s, double p, double b) {
        const double m = static_cast<double>(n) / 1e6;
        std::printf("%s | %.0f | %.0f | %.0f | %.1f | %.1f\n", what, m / s, m / p, m / b, s / p, s / b);
    };
    row("float32 -> float16", to_scalar, to_portable, to_bulk);
    row("float16 -> float32", from_scalar, from_portable, from_bulk);

    constexpr float scale = 0.5f;
    std::vector<std::uint16_t> h_copy(n), h_blocks(n);
    std::size_t bad_copy = 0, bad_blocks = 0;
    const double scaled_copy = median_seconds(rounds, [&] {
        std::vector<float> scaled(n);
        for (std::size_t i = 0; i < n; ++i) scaled[i] = in[i] * scale;
        bad_copy = qkv::half_overflow_index(scaled);
        qkv::to_half_bits(scaled, h_copy);
    });
    const double scaled_blocks = median_seconds(rounds, [&] {
        bad_blocks = qkv::half_overflow_index(in, scale);
        qkv::to_half_bits(in, scale, h_blocks);
    });
    std::printf("checked store x %.1f | scaled copy %.0f Mvalues/s | in blocks %.0f Mvalues/s | blocks / copy %.2f\n",
                static_cast<double>(scale), static_cast<double>(n) / 1e6 / scaled_copy,
                static_cast<double>(n) / 1e6 / scaled_blocks, scaled_copy / scaled_blocks);
    if (h_copy != h_blocks || bad_copy != bad_blocks) {
        std::fprintf(stderr, "the scaled forms' results differ\n");
        return 1;
    }
    if (h_scalar != h_portable || h_scalar != h_bulk ||
        std::memcmp(back_scalar.data(), back_portable.data(), n * 4) != 0 ||
        std::memcmp(back_scalar.data(), back_bulk.data(), n * 4) != 0) {
        std::fprintf(stderr, "the forms' results differ\n");
        return 1;
    }
    return 0;
}
