// libFuzzer target for qkv::npy: parse arbitrary bytes; whatever parses must convert
// consistently and survive serialize -> parse bit for bit.
//
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
//       -Itools tests/fuzz/npy_fuzz.cpp tools/npy/npy_*.cpp -o /tmp/npy_fuzz
//   mkdir -p /tmp/npy_corpus && cp tests/fuzz/corpus/npy/* /tmp/npy_corpus/
//   /tmp/npy_fuzz -max_total_time=120 /tmp/npy_corpus
#include "npy/npy.hpp"

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <span>
#include <vector>

namespace {

namespace npy = qkv::npy;

[[noreturn]] void die(const char* what) {
    std::fprintf(stderr, "npy_fuzz: invariant violated: %s\n", what);
    std::abort();
}

void check(bool ok, const char* what) {
    if (!ok) die(what);
}

template <class F>
bool throws_npy_error(F&& f) {
    try {
        f();
    } catch (const npy::error&) {
        return true;
    }
    return false;
}

bool same_bytes(const void* a, const void* b, std::size_t n) { return n == 0 || std::memcmp(a, b, n) == 0; }

// Reference for float64 -> float32 on values inside the float range.
bool narrowed_correctly(double d, float f) {
    if (std::isnan(d)) return std::isnan(f);
    if (std::fabs(d) <= static_cast<double>(std::numeric_limits<float>::max())) {
        return std::bit_cast<std::uint32_t>(f) == std::bit_cast<std::uint32_t>(static_cast<float>(d));
    }
    // Beyond FLT_MAX: FLT_MAX or infinity with the sign of d.
    return std::signbit(f) == std::signbit(d) && (std::isinf(f) || std::fabs(f) == std::numeric_limits<float>::max());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const auto input = std::as_bytes(std::span(data, size));
    npy::array a;
    try {
        a = npy::parse(input, "fuzz.npy");
    } catch (const npy::error& e) {
        check(std::strncmp(e.what(), "fuzz.npy: ", 10) == 0, "error message does not start with the name");
        return 0;
    }

    const std::size_t n = a.size();
    check(a.data.size() == n * npy::itemsize(a.type), "data size does not match shape");
    check(a.data.size() <= size, "parsed data larger than the input");

    std::vector<float> values;
    switch (a.type) {
        case npy::dtype::f32: {
            values = a.to_float();
            check(values.size() == n, "to_float size");
            check(same_bytes(values.data(), a.data.data(), a.data.size()), "to_float changed float32 bits");
            const std::vector<double> wide = a.to_double();
            check(wide.size() == n, "to_double size");
            for (std::size_t i = 0; i < n; ++i) {
                check(std::bit_cast<std::uint64_t>(wide[i]) ==
                          std::bit_cast<std::uint64_t>(static_cast<double>(values[i])),
                      "to_double of float32");
            }
            check(throws_npy_error([&] { (void)a.to_bool(); }), "to_bool accepted float32");
            break;
        }
        case npy::dtype::f64: {
            const std::vector<double> wide = a.to_double();
            check(wide.size() == n, "to_double size");
            check(same_bytes(wide.data(), a.data.data(), a.data.size()), "to_double changed float64 bits");
            values = a.to_float();
            check(values.size() == n, "to_float size");
            for (std::size_t i = 0; i < n; ++i)
                check(narrowed_correctly(wide[i], values[i]), "float64 -> float32 rounding");
            check(throws_npy_error([&] { (void)a.to_bool(); }), "to_bool accepted float64");
            break;
        }
        case npy::dtype::i4: {
            check(throws_npy_error([&] { (void)a.to_float(); }), "to_float accepted int32");
            check(throws_npy_error([&] { (void)a.to_double(); }), "to_double accepted int32");
            const std::vector<std::int32_t> ints = a.to_int32();
            check(ints.size() == n, "to_int32 size");
            check(same_bytes(ints.data(), a.data.data(), a.data.size()), "to_int32 changed bytes");
            for (const std::int32_t i : ints) values.push_back(static_cast<float>(i));
            break;
        }
        case npy::dtype::b1: {
            check(throws_npy_error([&] { (void)a.to_float(); }), "to_float accepted bool");
            check(throws_npy_error([&] { (void)a.to_double(); }), "to_double accepted bool");
            bool all_01 = true;
            for (const std::byte b : a.data) all_01 = all_01 && std::to_integer<unsigned>(b) <= 1;
            std::vector<std::uint8_t> flags;
            const bool refused = throws_npy_error([&] { flags = a.to_bool(); });
            check(refused != all_01, "to_bool validation");
            if (refused) return 0;
            check(same_bytes(flags.data(), a.data.data(), n), "to_bool changed bytes");
            for (const std::uint8_t f : flags) values.push_back(f != 0 ? 1.0f : 0.0f);
            break;
        }
        default:
            die("unknown dtype");
    }

    std::vector<std::byte> out;
    try {
        out = npy::serialize(a.shape, values);
    } catch (const npy::error&) {
        // Only an empty array whose other dimensions are too large as float32 may be refused.
        check(n == 0 && a.type == npy::dtype::b1, "serialize refused a parsed array");
        return 0;
    }
    check(out.size() >= 10 && (out[6] == std::byte{1} || out[6] == std::byte{2}), "serialize version");
    check((out.size() - values.size() * sizeof(float)) % 64 == 0, "serialized data not 64-byte aligned");

    npy::array b;
    try {
        b = npy::parse(out, "roundtrip");
    } catch (const npy::error& e) {
        std::fprintf(stderr, "%s\n", e.what());
        die("serialized output does not parse");
    }
    check(b.shape == a.shape, "round trip changed the shape");
    check(b.type == npy::dtype::f32, "round trip dtype");
    check(b.data.size() == values.size() * sizeof(float), "round trip size");
    check(same_bytes(b.data.data(), values.data(), b.data.size()), "round trip changed the values");
    check(npy::serialize(b.shape, b.to_float()) == out, "serialize is not deterministic");
    return 0;
}
