// qkv::quantize, qkv::dequantize, qkv::round_trip and the float16 conversions
// (qkv/runtime/element_type.hpp): ggml's q8_0 and q4_0 rules on hand-computed blocks, bit for bit
// against the independent NumPy quantizers of tests/data/sdpa/make_feature_fixtures.py, float16's
// rounding against its definition, and every refusal.
#include <qkv/runtime/element_type.hpp>
#include <qkv/runtime/error.hpp>
#include <qkv/runtime/half.hpp>
#include <qkv/runtime/kv_layout.hpp>
#include <qkv/runtime/sdpa.hpp>

#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "npy/npy.hpp"
#include "runtime/half_bits.hpp"
#include "support/catch.hpp"
#include "support/expect.hpp"

namespace {

using qkv::element_type;
namespace fs = std::filesystem;

constexpr float f_inf = std::numeric_limits<float>::infinity();
constexpr float f_nan = std::numeric_limits<float>::quiet_NaN();

std::vector<std::byte> stored(element_type type, std::span<const float> values) {
    std::vector<std::byte> out(qkv::bytes_for(type, values.size()));
    qkv::quantize(type, values, out);
    return out;
}

std::uint16_t d_bits(const std::vector<std::byte>& blocks, std::size_t block, std::size_t block_bytes) {
    const std::byte* at = blocks.data() + block * block_bytes;
    return static_cast<std::uint16_t>(std::to_integer<unsigned>(at[0]) | (std::to_integer<unsigned>(at[1]) << 8));
}

std::int8_t q8(const std::vector<std::byte>& blocks, std::size_t block, std::size_t j) {
    return static_cast<std::int8_t>(std::to_integer<std::uint8_t>(blocks[block * 34 + 2 + j]));
}

/// q4_0's code of element j (0..31) of a block: low nibble of byte j, high nibble of byte j - 16.
unsigned q4(const std::vector<std::byte>& blocks, std::size_t block, std::size_t j) {
    const unsigned byte = std::to_integer<unsigned>(blocks[block * 18 + 2 + (j % 16)]);
    return j < 16 ? byte & 0x0fu : byte >> 4;
}

std::vector<std::byte> read_bytes(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    REQUIRE(in);
    std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<std::byte> bytes(chars.size());
    for (std::size_t i = 0; i < chars.size(); ++i) bytes[i] = static_cast<std::byte>(chars[i]);
    return bytes;
}

}  // namespace

TEST_CASE("element_type: names, block sizes, bytes", "[element_type]") {
    static_assert(qkv::to_string(element_type::q4_0) == "q4_0");
    static_assert(qkv::parse_element_type("q8_0") == element_type::q8_0);
    static_assert(!qkv::parse_element_type("Q8_0"));
    static_assert(qkv::block_size(element_type::f32) == 1 && qkv::block_size(element_type::f16) == 1);
    static_assert(qkv::block_size(element_type::q8_0) == 32 && qkv::block_size(element_type::q4_0) == 32);
    static_assert(qkv::bytes_per_block(element_type::f32) == 4 && qkv::bytes_per_block(element_type::f16) == 2);
    static_assert(qkv::bytes_per_block(element_type::q8_0) == 34 && qkv::bytes_per_block(element_type::q4_0) == 18);
    static_assert(qkv::is_quantized(element_type::q4_0) && !qkv::is_quantized(element_type::f16));
    for (const element_type t : {element_type::f32, element_type::f16, element_type::q8_0, element_type::q4_0})
        CHECK(qkv::parse_element_type(qkv::to_string(t)) == t);
    CHECK(qkv::to_string(static_cast<element_type>(9)) == "unknown");
    CHECK(qkv::bytes_for(element_type::f32, 3) == 12);
    CHECK(qkv::bytes_for(element_type::f16, 3) == 6);
    CHECK(qkv::bytes_for(element_type::q8_0, 64) == 68);
    CHECK(qkv::bytes_for(element_type::q4_0, 96) == 54);
    CHECK(qkv::bytes_for(element_type::q4_0, 0) == 0);
    qkv_test::expect_invalid([] { (void)qkv::bytes_for(element_type::q8_0, 40); }, {"q8_0", "blocks of 32", "40"});
    qkv_test::expect_invalid([] { (void)qkv::bytes_for(element_type::f32, std::numeric_limits<std::size_t>::max()); },
                             {"overflow"});
    qkv_test::expect_invalid([] { (void)qkv::bytes_for(static_cast<element_type>(9), 1); },
                             {"unknown element type (9)"});
}

TEST_CASE("element_type: i32 holds integers, refused wherever floats are stored", "[element_type]") {
    static_assert(qkv::to_string(element_type::i32) == "i32" && qkv::parse_element_type("i32") == element_type::i32);
    static_assert(qkv::is_known(element_type::i32) && !qkv::holds_floats(element_type::i32));
    static_assert(qkv::holds_floats(element_type::f32) && qkv::holds_floats(element_type::q4_0));
    static_assert(!qkv::holds_floats(static_cast<element_type>(9)));
    static_assert(qkv::block_size(element_type::i32) == 1 && qkv::bytes_per_block(element_type::i32) == 4);
    static_assert(!qkv::is_quantized(element_type::i32));
    CHECK(qkv::bytes_for(element_type::i32, 17) == 68);
    const std::vector<float> x{1.5f, -2.0f, 3.25f};
    std::vector<std::byte> out(12);
    std::vector<float> back(3);
    qkv_test::expect_invalid([&] { qkv::quantize(element_type::i32, x, out); }, {"quantize", "i32", "integers"});
    qkv_test::expect_invalid([&] { qkv::dequantize(element_type::i32, out, back); }, {"dequantize", "i32"});
    qkv_test::expect_invalid([&] { (void)qkv::round_trip(element_type::i32, x); }, {"i32", "integers"});
    // K and V stored as i32: refused by the problem's validation and by a cache's layout.
    qkv::sdpa_problem p;
    p.shape = {.batch = 1, .q_heads = 1, .kv_heads = 1, .q_len = 3, .kv_len = 3, .d_qk = 1, .d_v = 1};
    p.q = x, p.k = x, p.v = x;
    p.options.kv_type = element_type::i32;
    qkv_test::expect_invalid([&] { qkv::validate(p); }, {"unknown kv_type (4): it takes f32, f16, q8_0, q4_0"});
    qkv_test::expect_invalid(
        [] {
            qkv::validate(qkv::kv_layout{.capacity = 4, .d_qk = 8, .d_v = 8, .type = element_type::i32}, "kv_cache");
        },
        {"kv_cache", "i32", "integers"});
}

TEST_CASE("float16: rounding to nearest, ties to even, and every pattern back", "[element_type][f16]") {
    CHECK(qkv::to_half_bits(1.0f) == 0x3c00);
    CHECK(qkv::to_half_bits(-2.0f) == 0xc000);
    CHECK(qkv::to_half_bits(0.0f) == 0x0000);
    CHECK(qkv::to_half_bits(-0.0f) == 0x8000);
    CHECK(qkv::to_half_bits(65504.0f) == 0x7bff);
    CHECK(qkv::to_half_bits(65519.996f) == 0x7bff);  // just below the tie with 65536
    CHECK(qkv::to_half_bits(65520.0f) == 0x7c00);    // the tie rounds to even: inf
    CHECK(qkv::to_half_bits(f_inf) == 0x7c00);
    CHECK(qkv::to_half_bits(-f_inf) == 0xfc00);
    CHECK((qkv::to_half_bits(f_nan) & 0x7e00) == 0x7e00);                     // a quiet NaN
    CHECK(qkv::to_half_bits(1.0f + 0x1p-11f) == 0x3c00);                      // tie: to even (mantissa 0)
    CHECK(qkv::to_half_bits(1.0f + 3 * 0x1p-11f) == 0x3c02);                  // tie: to even (mantissa 2)
    CHECK(qkv::to_half_bits(1.0f + 0x1p-11f + 0x1p-20f) == 0x3c01);           // above the tie
    CHECK(qkv::to_half_bits(0x1p-14f) == 0x0400);                             // smallest normal
    CHECK(qkv::to_half_bits(0x1p-24f) == 0x0001);                             // smallest subnormal
    CHECK(qkv::to_half_bits(0x1p-25f) == 0x0000);                             // tie with 0: to even
    CHECK(qkv::to_half_bits(0x1p-25f + 0x1p-40f) == 0x0001);                  // above it
    CHECK(qkv::to_half_bits(1.5f * 0x1p-24f) == 0x0002);                      // tie 1 | 2: to even
    CHECK(qkv::to_half_bits(2.5f * 0x1p-24f) == 0x0002);                      // tie 2 | 3: to even
    CHECK(qkv::to_half_bits(std::numeric_limits<float>::denorm_min()) == 0);  // float32 subnormals
    CHECK(qkv::to_half_bits(0x1.ffcp-15f) == 0x0400);  // halfway past the largest subnormal: to even

    // Every float16 pattern converts to float and back unchanged (NaNs stay NaN).
    for (std::uint32_t h = 0; h <= 0xffff; ++h) {
        const auto bits = static_cast<std::uint16_t>(h);
        const float f = qkv::from_half_bits(bits);
        if ((bits & 0x7c00) == 0x7c00 && (bits & 0x3ff) != 0) {
            CHECK(std::isnan(f));
            continue;
        }
        if (qkv::to_half_bits(f) != bits) FAIL_CHECK("pattern " << h);
    }
    CHECK(qkv::from_half_bits(0x0001) == 0x1p-24f);
    CHECK(qkv::from_half_bits(0x7bff) == 65504.0f);
    CHECK(qkv::from_half_bits(0xfc00) == -f_inf);

    // Random floats in float16's range: the result is a nearest float16, ties to even.
    std::mt19937_64 rng(16);
    std::uniform_int_distribution<std::uint32_t> pattern(0, 0x477fefffu);  // |x| < 65520
    std::size_t bad = 0;
    for (int n = 0; n < 200000; ++n) {
        const std::uint32_t magnitude = pattern(rng);
        const float x = std::bit_cast<float>(magnitude | ((n & 1) ? 0x80000000u : 0u));
        const std::uint16_t h = qkv::to_half_bits(x);
        const double got = qkv::from_half_bits(h);
        const double below = qkv::from_half_bits(static_cast<std::uint16_t>(h - ((h & 0x7fff) ? 1 : 0)));
        const double above = qkv::from_half_bits(static_cast<std::uint16_t>(h + 1));
        const double err = std::abs(got - static_cast<double>(x));
        const double err_below = std::abs(below - static_cast<double>(x));
        const double err_above = (h & 0x7fff) == 0x7bff ? INFINITY : std::abs(above - static_cast<double>(x));
        const bool nearest = err <= err_below && err <= err_above;
        const bool tie_ok =
            (err != err_below || (h & 0x7fff) == 0 || (h & 1) == 0) && (err != err_above || (h & 1) == 0);
        if (!(nearest && tie_ok) && bad++ < 5) FAIL_CHECK("x = " << x << " gave " << h);
    }
    CHECK(bad == 0);
}

namespace {

/// Converts `floats` by the bulk functions (the dispatched one, and the branch-free loop the others
/// fall back on) and counts the results that differ in any bit from the scalar qkv::to_half_bits.
std::size_t bulk_to_half_mismatches(const std::vector<float>& floats) {
    std::vector<std::uint16_t> bulk(floats.size()), portable(floats.size());
    qkv::to_half_bits(floats, bulk);
    qkv::half_detail::to_halves(floats.data(), portable.data(), floats.size());
    std::size_t bad = 0;
    for (std::size_t i = 0; i < floats.size(); ++i) {
        const std::uint16_t want = qkv::to_half_bits(floats[i]);
        if ((bulk[i] != want || portable[i] != want) && bad++ < 5)
            FAIL_CHECK("float bits 0x" << std::hex << std::bit_cast<std::uint32_t>(floats[i]) << ": scalar 0x" << want
                                       << ", bulk 0x" << bulk[i] << ", branch-free 0x" << portable[i]);
    }
    return bad;
}

}  // namespace

TEST_CASE("float16 in bulk: bit for bit the scalar conversions, every half and millions of floats",
          "[element_type][f16]") {
    // Every float16 pattern to float32, in bulk, in every bit (NaN payloads and signs included),
    // and back to float16 equal to the scalar round trip (a signalling NaN comes back quiet).
    std::vector<std::uint16_t> halves(65536);
    for (std::size_t h = 0; h < halves.size(); ++h) halves[h] = static_cast<std::uint16_t>(h);
    std::vector<float> wide(halves.size()), portable(halves.size());
    qkv::from_half_bits(halves, wide);
    qkv::half_detail::from_halves(halves.data(), portable.data(), halves.size());
    std::size_t bad = 0;
    for (std::size_t h = 0; h < halves.size(); ++h) {
        const auto want = std::bit_cast<std::uint32_t>(qkv::from_half_bits(halves[h]));
        if ((std::bit_cast<std::uint32_t>(wide[h]) != want || std::bit_cast<std::uint32_t>(portable[h]) != want) &&
            bad++ < 5)
            FAIL_CHECK("half 0x" << std::hex << h << ": scalar 0x" << want << ", bulk 0x"
                                 << std::bit_cast<std::uint32_t>(wide[h]) << ", branch-free 0x"
                                 << std::bit_cast<std::uint32_t>(portable[h]));
    }
    CHECK(bad == 0);
    CHECK(bulk_to_half_mismatches(wide) == 0);

    // Every boundary and tie: for each float16 value, the floats at it, one ulp either side, at the
    // midpoint to the next float16 (the tie) and one ulp either side of the midpoint, both signs.
    std::vector<float> floats;
    floats.reserve(4'000'000);
    for (std::uint32_t h = 0; h < 0x7c00u; ++h) {
        const double here = qkv::from_half_bits(static_cast<std::uint16_t>(h));
        const double next = h + 1 == 0x7c00u ? 65536.0 : qkv::from_half_bits(static_cast<std::uint16_t>(h + 1));
        for (const double x : {here, (here + next) / 2}) {
            const auto bits = std::bit_cast<std::uint32_t>(static_cast<float>(x));  // exact in float32
            for (const std::uint32_t b : {bits - 1, bits, bits + 1})
                for (const std::uint32_t sign : {0u, 0x80000000u})
                    if (b <= 0x7f800000u) floats.push_back(std::bit_cast<float>(b | sign));
        }
    }
    // The special patterns: ±0, float32 subnormals, the largest float, inf, NaNs (quiet and
    // signalling, payloads in the bits kept and the bits dropped).
    for (const std::uint32_t b :
         {0x00000000u, 0x00000001u, 0x007fffffu, 0x00800000u, 0x7f7fffffu, 0x7f800000u, 0x7f800001u,
          0x7fc00000u, 0x7fffffffu, 0x7fa00000u, 0x7f802000u, 0x7f801fffu, 0x7fbfe000u, 0x477fefffu,
          0x477ff000u, 0x477ff001u, 0x47800000u, 0x33000000u, 0x33000001u, 0x387fffffu, 0x38800000u})
        for (const std::uint32_t sign : {0u, 0x80000000u}) floats.push_back(std::bit_cast<float>(b | sign));
    // A dense sweep of float16's subnormal range, and random patterns over every float32 (NaNs and
    // infinities included), to a few million values in all.
    for (std::uint32_t b = 0x32f00000u; b < 0x38900000u; b += 97) floats.push_back(std::bit_cast<float>(b));
    std::mt19937 rng(2024);
    for (int n = 0; n < 1'500'000; ++n) floats.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(rng())));
    CHECK(floats.size() > 2'000'000);
    CHECK(bulk_to_half_mismatches(floats) == 0);

    // Every length, so that each vector width's tail is taken; and one size for in and out.
    for (std::size_t n = 0; n < 40; ++n) {
        const std::vector<float> part(floats.begin() + 1000, floats.begin() + 1000 + static_cast<std::ptrdiff_t>(n));
        CHECK(bulk_to_half_mismatches(part) == 0);
    }
    std::vector<std::uint16_t> two(2);
    qkv_test::expect_invalid([&] { qkv::to_half_bits(std::span<const float>(floats.data(), 3), two); },
                             {"to_half_bits", "one size"});
    qkv_test::expect_invalid([&] { qkv::from_half_bits(std::span<const std::uint16_t>(two), std::span<float>(wide)); },
                             {"from_half_bits", "one size"});

    // The check before a float16 store: the first finite value that rounds to inf.
    const std::vector<float> fine{65519.99f, -65504.0f, INFINITY, NAN, 1.0f};
    CHECK(qkv::half_overflow_index(fine) == fine.size());
    const std::vector<float> over{1.0f, INFINITY, -65520.0f, 1e30f};
    CHECK(qkv::half_overflow_index(over) == 2);
    std::size_t first = floats.size();
    for (std::size_t i = 0; i < floats.size() && first == floats.size(); ++i)
        if (std::isfinite(floats[i]) && (qkv::to_half_bits(floats[i]) & 0x7c00u) == 0x7c00u) first = i;
    CHECK(qkv::half_overflow_index(floats) == first);
}

TEST_CASE("float16 of scaled values: bit for bit the forms over a scaled copy", "[element_type][f16]") {
    // Random patterns over every float32 (NaN, inf, subnormals included) and values about
    // float16's limit, scaled as the value scale does (a power of two) and by factors that round.
    std::mt19937 rng(77);
    std::vector<float> values;
    for (int n = 0; n < 5000; ++n) values.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(rng())));
    for (const float x : {65504.0f, 65519.99f, 65520.0f, 131040.0f, 131041.0f, 1e-8f, 6e-8f, 3e-8f})
        values.push_back(x), values.push_back(-x);
    for (const float scale : {1.0f, 0.5f, 0x1p-20f, 2.0f, 0x1p100f, 0.1f, 3.0f}) {
        INFO("scale " << scale);
        // Lengths about the 1024-value blocks, so that every block boundary and tail is taken.
        for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{17}, std::size_t{1023},
                                    std::size_t{1024}, std::size_t{1025}, std::size_t{2048}, values.size()}) {
            INFO("n " << n);
            const std::span<const float> in(values.data() + values.size() - n, n);
            std::vector<float> scaled(n);
            for (std::size_t i = 0; i < n; ++i) scaled[i] = in[i] * scale;
            std::vector<std::uint16_t> want(n), got(n, 0x1234u);
            qkv::to_half_bits(scaled, want);
            qkv::to_half_bits(in, scale, got);
            CHECK(got == want);
            CHECK(qkv::half_overflow_index(in, scale) == qkv::half_overflow_index(scaled));
        }
        // The first value that overflows in a later block is found at its index; none, n.
        std::vector<float> fine(3000, 0.25f / scale);
        CHECK(qkv::half_overflow_index(fine, scale) == fine.size());
        fine[2500] = 70000.0f / scale, fine[2900] = 1e6f / scale;
        if (std::isfinite(fine[2500])) CHECK(qkv::half_overflow_index(fine, scale) == 2500);
    }
    std::vector<std::uint16_t> two(2);
    qkv_test::expect_invalid([&] { qkv::to_half_bits(std::span<const float>(values.data(), 3), 0.5f, two); },
                             {"to_half_bits", "one size"});
}

TEST_CASE("q8_0: d = max|x| / 127, q = round(x / d) half away from zero, d as float16", "[element_type][q8_0]") {
    std::array<float, 64> x{};
    // Block 0: all zero. Block 1: max |x| = 127 (negative), so d = 1 and q = round(x) exactly.
    for (std::size_t j = 0; j < 32; ++j) x[32 + j] = static_cast<float>(j) - 16;
    x[32] = -127;
    const float ties[8] = {2.5f, -2.5f, 0.5f, -0.5f, 126.5f, -126.5f, 1.49999988f, -1.5f};
    for (std::size_t j = 0; j < 8; ++j) x[33 + j] = ties[j];
    const std::vector<std::byte> b = stored(element_type::q8_0, x);
    REQUIRE(b.size() == 68);
    CHECK(d_bits(b, 0, 34) == 0x0000);
    for (std::size_t j = 0; j < 32; ++j) CHECK(q8(b, 0, j) == 0);
    CHECK(d_bits(b, 1, 34) == 0x3c00);  // 1.0
    CHECK(q8(b, 1, 0) == -127);
    const int want[8] = {3, -3, 1, -1, 127, -127, 1, -2};
    for (std::size_t j = 0; j < 8; ++j) CHECK(q8(b, 1, 1 + j) == want[j]);
    for (std::size_t j = 9; j < 32; ++j) CHECK(q8(b, 1, j) == static_cast<int>(j) - 16);
    std::array<float, 64> back{};
    qkv::dequantize(element_type::q8_0, b, back);
    for (std::size_t j = 0; j < 32; ++j) CHECK(back[j] == 0.0f);
    for (std::size_t j = 0; j < 32; ++j) CHECK(back[32 + j] == static_cast<float>(q8(b, 1, j)));

    // d not exact in float16: max |x| = 1 gives d = 1/127 in float32, 0x2008 as float16; the
    // quants use float32's 1/d (127), dequantization the float16 d.
    std::array<float, 32> y{};
    y[0] = 1.0f, y[1] = -0.5f, y[2] = 0.25f;
    const std::vector<std::byte> c = stored(element_type::q8_0, y);
    const float d = 1.0f / 127.0f;
    CHECK(d_bits(c, 0, 34) == qkv::to_half_bits(d));
    CHECK(q8(c, 0, 0) == 127);
    CHECK(q8(c, 0, 1) == static_cast<int>(std::round(-0.5f * (1.0f / d))));
    CHECK(q8(c, 0, 2) == static_cast<int>(std::round(0.25f * (1.0f / d))));
    std::array<float, 32> yb{};
    qkv::dequantize(element_type::q8_0, c, yb);
    CHECK(yb[0] == 127.0f * qkv::from_half_bits(d_bits(c, 0, 34)));
}

TEST_CASE("q4_0: d = m / -8 with m the first value of largest magnitude, q = min(15, trunc(x/d + 8.5))",
          "[element_type][q4_0]") {
    std::array<float, 128> x{};
    // Block 0: all zero: d = 0 / -8 = -0 (bits 0x8000, as ggml), every code 8.
    // Block 1: m = -8 first, so d = 1: element j < 16 is j - 8 (code j), element j + 16 is 7 - j
    // (code 15 - j): byte j holds j | (15 - j) << 4.
    for (std::size_t j = 0; j < 16; ++j) {
        x[32 + j] = static_cast<float>(j) - 8;
        x[48 + j] = 7.0f - static_cast<float>(j);
    }
    // Block 2: m = +8 first, so d = -1: a value of -8 is 16 after the shift and clamps to 15 (q4_0's
    // min(15, ...)): it comes back as -7.
    x[64] = 8, x[65] = -8, x[66] = -7.4f, x[67] = 7.6f, x[68] = 0.5f, x[69] = -0.5f, x[70] = -0.6f;
    // Block 3: 3 and -3 tie for the largest magnitude: the first one's sign decides, d = -0.375.
    x[96] = 3, x[101] = -3, x[102] = 1;
    const std::vector<std::byte> b = stored(element_type::q4_0, x);
    REQUIRE(b.size() == 72);
    CHECK(d_bits(b, 0, 18) == 0x8000);
    for (std::size_t j = 0; j < 32; ++j) CHECK(q4(b, 0, j) == 8u);
    CHECK(d_bits(b, 1, 18) == 0x3c00);
    for (std::size_t j = 0; j < 16; ++j)
        CHECK(std::to_integer<unsigned>(b[18 + 2 + j]) == (static_cast<unsigned>(j) | ((15u - j) << 4)));
    CHECK(d_bits(b, 2, 18) == 0xbc00);  // -1
    // x · (1/d) + 8.5 = -x + 8.5, truncated, at most 15.
    const unsigned want[7] = {0, 15, 15, 0, 8, 9, 9};
    for (std::size_t j = 0; j < 7; ++j) CHECK(q4(b, 2, j) == want[j]);
    CHECK(d_bits(b, 3, 18) == 0xb600);  // -0.375
    CHECK(q4(b, 3, 0) == 0u);
    CHECK(q4(b, 3, 5) == 15u);  // -3 / -0.375 + 8.5 = 16.5: clamped
    std::array<float, 128> back{};
    qkv::dequantize(element_type::q4_0, b, back);
    for (std::size_t j = 0; j < 32; ++j) CHECK(back[j] == 0.0f);
    for (std::size_t j = 0; j < 32; ++j) CHECK(back[32 + j] == x[32 + j]);
    CHECK(back[64] == 8.0f);
    CHECK(back[65] == -7.0f);  // clamped
    CHECK(back[96] == 3.0f);
    CHECK(back[101] == -2.625f);  // clamped to code 15: (15 - 8) · -0.375
}

TEST_CASE("f16, q8_0, q4_0 bit for bit against the NumPy quantizers", "[element_type]") {
    const fs::path dir = fs::path(QKV_TEST_DATA_DIR) / "sdpa" / "quantize";
    const std::vector<float> x = qkv::npy::read(dir / "x.npy").to_float();
    const std::vector<float> x16 = qkv::npy::read(dir / "x_f16.npy").to_float();
    REQUIRE(x.size() % 32 == 0);
    for (const element_type t : {element_type::f16, element_type::q8_0, element_type::q4_0}) {
        INFO(qkv::to_string(t));
        const std::vector<float>& values = t == element_type::f16 ? x16 : x;
        const std::vector<std::byte> want = read_bytes(dir / (std::string(qkv::to_string(t)) + ".bin"));
        const std::vector<std::byte> got = stored(t, values);
        REQUIRE(got.size() == want.size());
        std::size_t bad = 0, first = 0;
        for (std::size_t i = 0; i < got.size(); ++i)
            if (got[i] != want[i] && bad++ == 0) first = i;
        INFO(bad << " bytes differ, the first at " << first);
        CHECK(bad == 0);
    }
}

TEST_CASE("round_trip: the values as stored, within each format's rounding", "[element_type]") {
    std::mt19937_64 rng(3);
    std::normal_distribution<float> normal(0.f, 1.f);
    for (const float scale : {1e-3f, 1.f, 300.f}) {
        std::vector<float> x(32 * 17);
        for (float& e : x) e = normal(rng) * scale;
        CHECK(qkv::round_trip(element_type::f32, x) == x);
        const std::vector<float> h = qkv::round_trip(element_type::f16, x);
        for (std::size_t i = 0; i < x.size(); ++i) CHECK(std::abs(h[i] - x[i]) <= std::abs(x[i]) * 0x1p-11f + 0x1p-25f);
        for (const element_type t : {element_type::q8_0, element_type::q4_0}) {
            const std::vector<float> r = qkv::round_trip(t, x);
            std::vector<std::byte> b = stored(t, x);
            const std::size_t block_bytes = qkv::bytes_per_block(t);
            for (std::size_t blk = 0; blk < x.size() / 32; ++blk) {
                const float d = std::abs(qkv::from_half_bits(d_bits(b, blk, block_bytes)));
                for (std::size_t j = 0; j < 32; ++j) {
                    const std::size_t i = blk * 32 + j;
                    // q8_0: half a step, q4_0: a step (the clamp); plus float16's error in d, at
                    // most d · 2^-11 (normal) or 2^-25 (subnormal), times the code.
                    const float d_error = d * 0x1p-11f + 0x1p-25f;
                    const float bound = t == element_type::q8_0 ? 0.5f * d + 128 * d_error : d + 9 * d_error;
                    if (!(std::abs(r[i] - x[i]) <= bound)) FAIL_CHECK(qkv::to_string(t) << " element " << i);
                }
            }
            // Quantizing the dequantized values again changes nothing (they sit on the grid).
            CHECK(qkv::round_trip(t, r) == r);
        }
    }
}

TEST_CASE("quantize refuses what it cannot store, writing nothing", "[element_type]") {
    std::vector<float> x(64, 1.0f);
    std::vector<std::byte> out(qkv::bytes_for(element_type::q8_0, 64), std::byte{0x5a});
    const std::vector<std::byte> before = out;
    x[37] = f_nan;
    qkv_test::expect_invalid([&] { qkv::quantize(element_type::q8_0, x, out); },
                             {"q8_0", "element 37", "nan", "finite"});
    x[37] = -f_inf;
    qkv_test::expect_invalid([&] { qkv::quantize(element_type::q4_0, x, std::span(out).first(36)); },
                             {"q4_0", "element 37"});
    CHECK(out == before);
    // d beyond float16: q8_0 max|x| = 9e6 (d = 70,866), q4_0 |m| = 6e5 (d = 75,000). Just inside:
    // q8_0 8.3e6 (d = 65,354), q4_0 5.2e5 (d = 65,000).
    x.assign(64, 1.0f);
    x[40] = 9e6f;
    qkv_test::expect_invalid([&] { qkv::quantize(element_type::q8_0, x, out); },
                             {"q8_0", "block 1", "elements 32 to 63", "float16"});
    CHECK(out == before);
    x[40] = 8.3e6f;
    CHECK_NOTHROW(qkv::quantize(element_type::q8_0, x, out));
    std::vector<std::byte> out4(qkv::bytes_for(element_type::q4_0, 64));
    x[40] = -6e5f;
    qkv_test::expect_invalid([&] { qkv::quantize(element_type::q4_0, x, out4); }, {"q4_0", "block 1", "m / -8"});
    x[40] = -5.2e5f;
    CHECK_NOTHROW(qkv::quantize(element_type::q4_0, x, out4));
    // f16: a finite value past 65519.99 would round to inf; NaN and inf are stored as such.
    std::vector<float> h = {1.f, 65504.f, 65519.f, -65520.f};
    std::vector<std::byte> out16(8);
    qkv_test::expect_invalid([&] { qkv::quantize(element_type::f16, h, out16); },
                             {"f16", "element 3", "-65520", "65504"});
    h[3] = f_inf;
    CHECK_NOTHROW(qkv::quantize(element_type::f16, h, out16));
    std::vector<float> back(4);
    qkv::dequantize(element_type::f16, out16, back);
    CHECK(back[2] == 65504.f);
    CHECK(back[3] == f_inf);
    // Sizes.
    qkv_test::expect_invalid([&] { qkv::quantize(element_type::q8_0, std::span(x).first(40), out); },
                             {"blocks of 32", "40"});
    qkv_test::expect_invalid([&] { qkv::quantize(element_type::q8_0, x, std::span(out).first(67)); },
                             {"out has 67 bytes, expected 68"});
    std::vector<float> back64(64);
    qkv_test::expect_invalid([&] { qkv::dequantize(element_type::q4_0, std::span(out4).first(35), back64); },
                             {"in has 35 bytes, expected 36"});
    qkv_test::expect_invalid([&] { (void)qkv::round_trip(static_cast<element_type>(7), x); },
                             {"unknown element type (7)"});
    // f32 stores every float, NaN and inf included.
    std::vector<float> odd = {f_nan, -f_inf, 3.4e38f, -0.0f};
    const std::vector<float> rt = qkv::round_trip(element_type::f32, odd);
    CHECK(std::isnan(rt[0]));
    CHECK(rt[1] == -f_inf);
    CHECK(rt[2] == 3.4e38f);
    CHECK(std::signbit(rt[3]));
}

TEST_CASE("q8_0 and q4_0: blocks whose 1/d overflows store zeros", "[element_type]") {
    // Subnormal float32 values: d = max|x| / 127 is about 1e-42 and 1/d overflows float32. ggml's
    // conversion of an infinite x / d to an integer is undefined; qkv stores the code of zero.
    std::vector<float> x(32);
    for (std::size_t j = 0; j < 32; ++j) x[j] = static_cast<float>(j + 1) * 1e-43f;
    for (const element_type t : {element_type::q8_0, element_type::q4_0}) {
        const std::vector<std::byte> b = stored(t, x);
        CHECK((d_bits(b, 0, qkv::bytes_per_block(t)) & 0x7fff) == 0);
        for (std::size_t j = 0; j < 32; ++j) CHECK((t == element_type::q8_0 ? q8(b, 0, j) == 0 : q4(b, 0, j) == 8u));
        for (float v : qkv::round_trip(t, x)) CHECK(v == 0.0f);
    }
}
