// The attention of today's models on the Vulkan backend: sliding windows, sinks, softcap,
// ALiBi, log-sum-exp, wide heads and quantized K/V, on every path (both fused kernel families, the
// split-S decode from host K/V and from a kv_cache), validation layer and synchronisation
// validation on, against the float64 CPU backend (qkv::cpu::sdpa) by normalised MSE, failing on
// NaN or Inf where the reference is finite. fp16 and quantized storage are compared with the
// reference computed from the same rounded values (Q through float16, K and V through kv_type), so
// every path must reach float32's nmse (1e-9).
//
// [features]: each rule and the combinations that make sense, odd shapes. [grid]: a sampled grid in
// the spirit of ggml's test-backend-ops FLASH_ATTN_EXT cases (its own CTest entry).
#include <qkv/vulkan/runtime.hpp>
#include <qkv/vulkan/tensor.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "support/backend_checks.hpp"
#include "support/catch.hpp"
#include "support/families.hpp"
#include "support/gpu.hpp"
#include "support/reference.hpp"
#include "support/sdpa_problems.hpp"

using qkv::element_type;
using qkv_test::require_clean;

namespace {

constexpr float neg_inf = -std::numeric_limits<float>::infinity();

/// Which path runs the call: a fused family, or the decode kernels (the automatic family's, or
/// the cooperative-matrix family's) from host K/V or a kv_cache.
enum class path { fused_cpu, fused_gpu, fused_coop, decode_host, decode_cache, decode_coop_host, decode_coop_cache };

const char* name_of(path p) {
    switch (p) {
        case path::fused_cpu:
            return "fused cpu";
        case path::fused_gpu:
            return "fused gpu";
        case path::fused_coop:
            return "fused coopmat";
        case path::decode_host:
            return "decode (host K/V)";
        case path::decode_cache:
            return "decode (kv_cache)";
        case path::decode_coop_host:
            return "decode coopmat (host K/V)";
        case path::decode_coop_cache:
            return "decode coopmat (kv_cache)";
    }
    return "?";
}

bool coop(path p) { return p == path::fused_coop || p == path::decode_coop_host || p == path::decode_coop_cache; }
bool cache(path p) { return p == path::decode_cache || p == path::decode_coop_cache; }

/// The kernel family a path forces (automatic for the decode kernels' own choice).
qkv::kernel_family family_of(path p) {
    return p == path::fused_cpu   ? qkv::kernel_family::row_tiles
           : p == path::fused_gpu ? qkv::kernel_family::block_tiles
           : coop(p)              ? qkv::kernel_family::coopmat
                                  : qkv::kernel_family::automatic;
}

/// Whether `p` runs in this test run (support/families.hpp: the families the device has, and
/// QKV_TEST_FAMILIES's choice; the decode kernels' own choice counts with cpu and gpu).
bool runs(path p) {
    const qkv::kernel_family f = family_of(p);
    if (f != qkv::kernel_family::automatic) return qkv_test::family_runs(f);
    return qkv_test::family_runs(qkv::kernel_family::row_tiles) ||
           qkv_test::family_runs(qkv::kernel_family::block_tiles);
}

/// The paths of this run among `wanted`.
std::vector<path> paths_of(std::initializer_list<path> wanted) {
    std::vector<path> out;
    for (const path p : wanted)
        if (runs(p)) out.push_back(p);
    return out;
}

using masks = qkv_test::mask_kind;
using qkv_test::owned_sdpa;

struct spec {
    std::size_t batch = 1, q_heads = 1, kv_heads = 1, q_len = 1, kv_len = 1, d_qk = 32, d_v = 32;
    masks mask = masks::none;
    std::vector<std::size_t> mask_shape{};  ///< empty: (L, S)
    bool empty_row = false;                 ///< the bool mask masks every key of row 0
    bool causal = false;
    qkv::causal_alignment alignment = qkv::causal_alignment::top_left;
    std::int64_t window_left = -1, window_right = -1;
    float softcap = 0, alibi = 0;
    bool sinks = false, lse = false, weights = false;
    bool given_slopes = false;  ///< ALiBi slopes given per query head (alibi_slopes) instead of `alibi`
    std::optional<element_type> kv_type{};
    qkv::precision precision = qkv::precision::fp32;
    float scale = 0;                                ///< 0: the default
    std::optional<std::int64_t> position_offset{};  ///< unset: the alignment's
};

std::string describe(const spec& s, path p) {
    std::ostringstream o;
    o << name_of(p) << ": B=" << s.batch << " Hq=" << s.q_heads << " Hkv=" << s.kv_heads << " L=" << s.q_len
      << " S=" << s.kv_len << " E=" << s.d_qk << " Ev=" << s.d_v;
    if (s.mask != masks::none) o << " mask" << static_cast<int>(s.mask) << (s.empty_row ? " (empty row)" : "");
    if (s.causal)
        o << " causal " << (s.alignment == qkv::causal_alignment::top_left ? "top-left" : "bottom-right");
    else if (s.alignment == qkv::causal_alignment::bottom_right)
        o << " bottom-right";
    if (s.window_left != -1 || s.window_right != -1) o << " window " << s.window_left << "," << s.window_right;
    if (s.softcap > 0) o << " softcap " << s.softcap;
    if (s.alibi > 0) o << " alibi " << s.alibi;
    if (s.given_slopes) o << " alibi_slopes";
    if (s.sinks) o << " sinks";
    if (s.lse) o << " lse";
    if (s.weights) o << " weights";
    if (s.kv_type) o << " kv " << qkv::to_string(*s.kv_type);
    if (s.precision == qkv::precision::fp16) o << " fp16";
    if (s.position_offset) o << " position_offset " << *s.position_offset;
    return o.str();
}

owned_sdpa make(const spec& s, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    owned_sdpa o = qkv_test::random_sdpa(
        {.shape = qkv_test::shape_of(s), .mask = s.mask, .mask_shape = s.mask_shape, .empty_row = s.empty_row}, rng);
    qkv::sdpa_problem& p = o.problem;
    std::normal_distribution<float> normal(0.0f, 1.0f);
    if (s.sinks) {  // a spread of logits: below, near and above the rows' scores, and one head without
        o.sinks.resize(s.q_heads);
        for (std::size_t h = 0; h < s.q_heads; ++h) o.sinks[h] = 3.0f * normal(rng);
        o.sinks[0] = 6.0f;
        if (s.q_heads > 1) o.sinks[1] = neg_inf;
        p.sinks = o.sinks;
    }
    if (s.given_slopes) {  // FlashAttention's alibi_slopes: any slope >= 0 per head, one of them 0
        std::uniform_real_distribution<float> slope(0.0f, 1.0f);
        o.alibi_slopes.resize(s.q_heads);
        for (float& m : o.alibi_slopes) m = slope(rng);
        o.alibi_slopes[0] = 0.0f;
        p.alibi_slopes = o.alibi_slopes;
    }
    p.options.causal = s.causal;
    p.options.alignment = s.alignment;
    p.options.window_left = s.window_left;
    p.options.window_right = s.window_right;
    p.options.softcap = s.softcap;
    p.options.alibi_max_bias = s.alibi;
    p.options.return_lse = s.lse;
    p.options.return_weights = s.weights;
    p.options.kv_type = s.kv_type;
    p.options.precision = s.precision;
    if (s.scale != 0) p.options.scale = s.scale;
    p.options.position_offset = s.position_offset;
    return o;
}

/// Rows of `want` that are zero (no key) must be exactly zero; finite wants must be finite.
void check_close(const std::vector<float>& got, const std::vector<double>& want, std::size_t width, const char* what,
                 double tolerance) {
    REQUIRE(got.size() == want.size());
    const double e = qkv_test::nmse(got, want);
    INFO(what << " nmse " << e);
    CHECK(e <= tolerance);
    std::size_t wrong_zero = 0;
    for (std::size_t r = 0; r < want.size() / width; ++r) {
        bool zero = true;
        for (std::size_t c = 0; c < width; ++c) zero = zero && want[r * width + c] == 0.0;
        if (!zero) continue;
        for (std::size_t c = 0; c < width; ++c) wrong_zero += got[r * width + c] != 0.0f;
    }
    CHECK(wrong_zero == 0);
}

/// Whether `route` can take the spec: the cooperative-matrix family stores Q, K and V as float16
/// (it runs the spec in fp16, so an explicit K/V type other than f16 is not its case), and takes
/// heads up to 256 wide.
bool takes(path route, const spec& s) {
    return !coop(route) || ((!s.kv_type || *s.kv_type == element_type::f16) && s.d_qk <= 256 && s.d_v <= 256);
}

/// Runs `o` on `route` (a context with hooks may be given) and checks it against the reference:
/// at nmse 1e-9 against the float64 result of the stored values, and the cooperative-matrix family
/// (float16 weights in P·V) at the fp16 bound.
qkv::sdpa_output run(qkv::vulkan::context& ctx, owned_sdpa& o, path route, spec s) {
    qkv::sdpa_problem& p = o.problem;
    if (coop(route)) s.precision = p.options.precision = qkv::precision::fp16;
    INFO(describe(s, route));
    p.options.kernel = family_of(route);
    const double tolerance = qkv_test::case_tolerance(p.options.kernel, 1e-9);
    const qkv::sdpa_output_f64 want = qkv_test::device_reference(p);
    qkv::sdpa_output got;
    if (cache(route)) {
        qkv::vulkan::kv_cache cache(ctx, {.batch = s.batch,
                                          .kv_heads = s.kv_heads,
                                          .capacity = s.kv_len + 5,
                                          .d_qk = s.d_qk,
                                          .d_v = s.d_v,
                                          .type = qkv::stored_kv_type(p.options)});
        // Two appends: the rows of every (batch, kv head) split at S / 3.
        const std::size_t groups = s.batch * s.kv_heads, first = s.kv_len / 3, rest = s.kv_len - first;
        for (const auto& [from, rows] : {std::pair{std::size_t{0}, first}, std::pair{first, rest}}) {
            std::vector<float> k, v;
            for (std::size_t z = 0; z < groups; ++z) {
                k.insert(k.end(), o.k.begin() + static_cast<std::ptrdiff_t>((z * s.kv_len + from) * s.d_qk),
                         o.k.begin() + static_cast<std::ptrdiff_t>((z * s.kv_len + from + rows) * s.d_qk));
                v.insert(v.end(), o.v.begin() + static_cast<std::ptrdiff_t>((z * s.kv_len + from) * s.d_v),
                         o.v.begin() + static_cast<std::ptrdiff_t>((z * s.kv_len + from + rows) * s.d_v));
            }
            cache.append(k, v, rows);
        }
        qkv::sdpa_problem q = p;
        q.k = {}, q.v = {};
        q.shape.kv_len = 0;
        got = ctx.sdpa(q, cache);
    } else {
        got = ctx.sdpa(p);
    }
    if (p.options.kernel != qkv::kernel_family::automatic) CHECK(got.kernel == p.options.kernel);
    check_close(got.output, want.output, s.d_v, "output", tolerance);
    if (s.weights) check_close(got.weights, want.weights, s.kv_len, "weights", tolerance);
    if (s.lse)
        qkv_test::check_lse(got.lse, want.lse, tolerance);
    else
        CHECK(got.lse.empty());
    require_clean(ctx);
    return got;
}

/// A decode shape (q_len <= 16, G·q_len <= 64, kv_len >= 1024) goes to the decode kernels.
bool decode_shape(const spec& s) {
    return s.q_len <= 16 && s.q_heads / s.kv_heads * s.q_len <= 64 && s.kv_len >= 1024 && !s.weights;
}

/// A decode shape (3 query rows of 8 heads against 1,500 keys of 2) with every rule at once: an
/// additive mask, causal bottom-right, a window, softcap, ALiBi, sinks and lse, K/V stored as `kv_type`.
spec decode_every_rule(element_type kv_type) {
    return {.q_heads = 8,
            .kv_heads = 2,
            .q_len = 3,
            .kv_len = 1500,
            .d_qk = 64,
            .d_v = 32,
            .mask = masks::additive,
            .mask_shape = {1500},
            .causal = true,
            .alignment = qkv::causal_alignment::bottom_right,
            .window_left = 700,
            .window_right = 0,
            .softcap = 10.0f,
            .alibi = 8.0f,
            .sinks = true,
            .lse = true,
            .kv_type = kv_type};
}

void run_paths(const spec& s, const std::vector<path>& paths, std::uint64_t seed) {
    for (const path route : paths) {
        if (!takes(route, s)) continue;
        owned_sdpa o = make(s, seed);
        run(qkv_test::gpu(), o, route, s);
    }
}

/// The fused families of this run.
std::vector<path> fused_paths() { return paths_of({path::fused_cpu, path::fused_gpu, path::fused_coop}); }
/// The decode paths of this run: from host K/V and from a cache, with each decode family.
std::vector<path> decode_paths() {
    return paths_of({path::decode_host, path::decode_cache, path::decode_coop_host, path::decode_coop_cache});
}

}  // namespace

TEST_CASE("sdpa features: sliding windows, both alignments, L > S, with and without causal",
          "[vulkan][sdpa][features][families]") {
    using qkv::causal_alignment;
    const spec cases[] = {
        // L < S, bottom-right, causal + a left window (llama.cpp's n_swa = 8)
        {.q_heads = 2,
         .kv_heads = 1,
         .q_len = 17,
         .kv_len = 113,
         .causal = true,
         .alignment = causal_alignment::bottom_right,
         .window_left = 7,
         .window_right = 0},
        // top-left, a symmetric window without causal
        {.batch = 2, .q_len = 37, .kv_len = 113, .d_qk = 40, .d_v = 24, .window_left = 5, .window_right = 5},
        // L > S, bottom-right: early rows see nothing (zeros); a right-only window
        {.q_heads = 3,
         .kv_heads = 1,
         .q_len = 75,
         .kv_len = 17,
         .alignment = causal_alignment::bottom_right,
         .window_left = -1,
         .window_right = 2},
        // L > S, top-left, causal + window 0,0 (each row its own key, where one exists)
        {.q_len = 75, .kv_len = 17, .causal = true, .window_left = 0, .window_right = 0},
        // long keys, windows that skip most tiles, with a bool mask and weights
        {.q_len = 40,
         .kv_len = 700,
         .d_qk = 64,
         .d_v = 64,
         .mask = masks::boolean,
         .causal = true,
         .alignment = causal_alignment::bottom_right,
         .window_left = 63,
         .window_right = 0,
         .weights = true},
    };
    std::uint64_t seed = 100;
    for (const spec& s : cases) run_paths(s, fused_paths(), ++seed);
}

TEST_CASE("sdpa features: softcap with masks, ALiBi with GQA", "[vulkan][sdpa][features][families]") {
    using qkv::causal_alignment;
    const spec cases[] = {
        {.q_heads = 4,
         .kv_heads = 2,
         .q_len = 17,
         .kv_len = 113,
         .mask = masks::both,
         .mask_shape = {1, 4, 17, 113},
         .causal = true,
         .softcap = 2.5f,
         .scale = 0.9f},
        {.q_heads = 12,
         .kv_heads = 4,
         .q_len = 3,
         .kv_len = 113,
         .d_qk = 40,
         .d_v = 40,
         .causal = true,
         .alignment = causal_alignment::bottom_right,
         .alibi = 8.0f},
        {.q_heads = 20,
         .kv_heads = 1,
         .q_len = 5,
         .kv_len = 75,
         .alignment = causal_alignment::bottom_right,
         .softcap = 10.0f,
         .alibi = 3.0f},
    };
    std::uint64_t seed = 200;
    for (const spec& s : cases) run_paths(s, fused_paths(), ++seed);
}

TEST_CASE("sdpa features: ALiBi slopes given per query head, on every path", "[vulkan][sdpa][features][families]") {
    using qkv::causal_alignment;
    // Fused (both families), then a decode shape from host K/V and from a kv_cache, then over tensors.
    const spec fused{.q_heads = 12,
                     .kv_heads = 4,
                     .q_len = 17,
                     .kv_len = 113,
                     .d_qk = 40,
                     .d_v = 40,
                     .causal = true,
                     .alignment = causal_alignment::bottom_right,
                     .softcap = 10.0f,
                     .lse = true,
                     .given_slopes = true};
    run_paths(fused, fused_paths(), 260);
    const spec decode{.q_heads = 4,
                      .kv_heads = 2,
                      .q_len = 2,
                      .kv_len = 1500,
                      .causal = true,
                      .alignment = causal_alignment::bottom_right,
                      .sinks = true,
                      .given_slopes = true};
    REQUIRE(decode_shape(decode));
    run_paths(decode, decode_paths(), 261);
    qkv::vulkan::context& ctx = qkv_test::gpu();
    owned_sdpa o = make(fused, 262);
    const qkv::sdpa_output_f64 want = qkv_test::device_reference(o.problem);
    qkv::sdpa_problem desc = o.problem;
    desc.q = {}, desc.k = {}, desc.v = {};
    desc.options.return_lse = false;
    qkv::vulkan::sdpa_call call(ctx, desc);
    o.alibi_slopes.assign(o.alibi_slopes.size(), 100.0f);  // the call keeps its own copy
    qkv::vulkan::tensor q(ctx, {1, 12, 17, 40}), k(ctx, {1, 4, 113, 40}), v(ctx, {1, 4, 113, 40}),
        out(ctx, {1, 12, 17, 40});
    q.upload(o.q), k.upload(o.k), v.upload(o.v);
    call.run({.q = &q, .k = &k, .v = &v, .out = &out});
    check_close(out.download(), want.output, 40, "output over tensors", 1e-9);
    require_clean(ctx);
}

TEST_CASE("sdpa features: softcap with a large C keeps float32's precision on every path",
          "[vulkan][sdpa][features][numerics][families]") {
    // C·tanh(s / C) with tanh's absolute error (about 1e-7) multiplied by C gave nmse 2.6e-9 at
    // C = 1e4, 2.3e-5 at 1e6 and an lse off by about 3e22 at 1e30. Also a subnormal C (which a
    // device may flush to zero) and a small one that saturates most scores.
    std::uint64_t seed = 250;
    for (const float c : {1e4f, 1e6f, 1e30f, std::numeric_limits<float>::min() / 8, 0.25f}) {
        run_paths({.q_heads = 4,
                   .kv_heads = 2,
                   .q_len = 17,
                   .kv_len = 113,
                   .causal = true,
                   .softcap = c,
                   .sinks = true,
                   .lse = true,
                   .scale = 2.0f},
                  fused_paths(), ++seed);
        run_paths({.q_heads = 4, .kv_heads = 2, .q_len = 3, .kv_len = 1030, .softcap = c, .lse = true, .scale = 2.0f},
                  decode_paths(), ++seed);
    }
}

TEST_CASE("sdpa features: ALiBi far from the diagonal keeps float32's precision on every path",
          "[vulkan][sdpa][features][numerics][families]") {
    // Every key 1e5 to 2^62 positions from every query (after them and before them): the bias,
    // rounded in float32 before it met the scores, gave nmse 2.4e-6 at 1e5 and 3e-4 at 1e6.
    constexpr std::int64_t two62 = std::int64_t{1} << 62;
    std::uint64_t seed = 260;
    for (const std::int64_t off : {std::int64_t{100'000}, std::int64_t{1'000'000}, std::int64_t{1'000'000'000},
                                   two62 - 1000, two62, std::int64_t{-1'000'000}, -two62}) {
        run_paths({.q_heads = 4,
                   .kv_heads = 2,
                   .q_len = 17,
                   .kv_len = 113,
                   .alibi = 8.0f,
                   .sinks = true,
                   .lse = true,
                   .position_offset = off},
                  fused_paths(), ++seed);
        run_paths({.q_heads = 4,
                   .kv_heads = 2,
                   .q_len = 3,
                   .kv_len = 1030,
                   .alibi = 8.0f,
                   .sinks = true,
                   .lse = true,
                   .position_offset = off},
                  decode_paths(), ++seed);
    }
    // Slopes given per query head (one of them 0) take the same relative bias.
    const spec given{.q_heads = 4,
                     .kv_heads = 2,
                     .q_len = 3,
                     .kv_len = 1030,
                     .sinks = true,
                     .lse = true,
                     .given_slopes = true,
                     .position_offset = 1'000'000'000};
    REQUIRE(decode_shape(given));
    run_paths(given, decode_paths(), ++seed);
    run_paths({.q_heads = 4,
               .kv_heads = 2,
               .q_len = 17,
               .kv_len = 113,
               .lse = true,
               .given_slopes = true,
               .position_offset = -two62},
              fused_paths(), ++seed);
}

TEST_CASE("sdpa features: positions and window sides at the 32-bit and 2^62 edges on every path",
          "[vulkan][sdpa][features][numerics][families]") {
    // |position_offset| <= 2^62 on every path: the device refused 2^31 and beyond (naming "the
    // causal offset kv_len - q_len"), and window or ALiBi distances of 2^30 and beyond even where
    // the answer is all zeros. Windows whose edge, seen from 2^31 or 2^62 away, cuts into the keys
    // row by row; rows that see nothing (zeros, lse -inf).
    constexpr std::int64_t two30 = std::int64_t{1} << 30, two31 = std::int64_t{1} << 31, two62 = std::int64_t{1} << 62;
    struct edge {
        std::int64_t off, left, right;
        bool causal;
        float alibi;
    };
    const edge edges[] = {
        {two31 - 1, -1, -1, true, 0.0f},             // every key visible
        {two31, 40, 0, true, 0.0f},                  // a window far behind the keys: nothing
        {two31 + 1, two31 + 1 - 50, 0, true, 8.0f},  // the left edge at key i + 50
        {-two31, -1, -1, true, 0.0f},                // causal, every key after the rows: nothing
        {-two31 - 1, -1, two31 + 60, false, 8.0f},   // the right edge at key i + 59
        {two62, two62 - 60, -1, false, 8.0f},        // the left edge at key i + 60
        {-two62, two30, two62 + 30, false, 0.0f},    // the right edge at key i + 30
        {5, two30, two30, true, 8.0f},               // sides of 2^30 near the keys
        {-3, two62, two62, false, 8.0f},             // and of 2^62
    };
    std::uint64_t seed = 270;
    for (const edge& e : edges) {
        for (const bool decode : {false, true}) {
            const spec s{.q_heads = 4,
                         .kv_heads = 2,
                         .q_len = decode ? 3u : 17u,
                         .kv_len = decode ? 1030u : 113u,
                         .causal = e.causal,
                         .window_left = e.left,
                         .window_right = e.right,
                         .alibi = e.alibi,
                         .sinks = true,
                         .lse = true,
                         .position_offset = e.off};
            if (decode) REQUIRE(decode_shape(s));
            run_paths(s, decode ? decode_paths() : fused_paths(), ++seed);
        }
    }
}

TEST_CASE("sdpa features: sinks with fully masked rows, lse with every feature, weights",
          "[vulkan][sdpa][features][families]") {
    using qkv::causal_alignment;
    const spec cases[] = {
        {.q_heads = 4,
         .kv_heads = 2,
         .q_len = 17,
         .kv_len = 113,
         .mask = masks::boolean,
         .empty_row = true,
         .sinks = true,
         .lse = true,
         .weights = true},
        {.batch = 2,
         .q_heads = 4,
         .kv_heads = 1,
         .q_len = 37,
         .kv_len = 300,
         .d_qk = 64,
         .d_v = 32,
         .mask = masks::both,
         .mask_shape = {2, 1, 37, 300},
         .empty_row = true,
         .causal = true,
         .alignment = causal_alignment::bottom_right,
         .window_left = 40,
         .window_right = 3,
         .softcap = 10.0f,
         .alibi = 8.0f,
         .sinks = true,
         .lse = true,
         .weights = true},
        {.q_heads = 2,
         .kv_heads = 2,
         .q_len = 3,
         .kv_len = 113,
         .sinks = true,
         .lse = true,
         .precision = qkv::precision::fp16},
    };
    std::uint64_t seed = 300;
    for (const spec& s : cases) run_paths(s, fused_paths(), ++seed);
}

TEST_CASE("sdpa features: key chunks carry the window, sinks and lse (short dispatches forced)",
          "[vulkan][sdpa][features][families]") {
    qkv::vulkan::context ctx = qkv_test::make_context({.max_fused_keys_per_dispatch = 64});
    const spec s{.q_heads = 2,
                 .kv_heads = 1,
                 .q_len = 33,
                 .kv_len = 500,
                 .causal = true,
                 .alignment = qkv::causal_alignment::bottom_right,
                 .window_left = 100,
                 .window_right = 0,
                 .softcap = 5.0f,
                 .sinks = true,
                 .lse = true,
                 .weights = true};
    for (const path route : fused_paths()) {
        owned_sdpa o = make(s, 400);
        run(ctx, o, route, s);
    }
}

TEST_CASE("sdpa features: decode from host K/V and from a kv_cache, every K/V type",
          "[vulkan][sdpa][features][families]") {
    using qkv::causal_alignment;
    std::uint64_t seed = 500;
    for (const element_type t : {element_type::f32, element_type::f16, element_type::q8_0, element_type::q4_0}) {
        const spec s = decode_every_rule(t);
        REQUIRE(decode_shape(s));
        run_paths(s, decode_paths(), ++seed);
    }
    // fp16 queries against f32 keys and a plain call (no features) on a q8_0 cache.
    run_paths({.q_heads = 4,
               .kv_heads = 4,
               .q_len = 1,
               .kv_len = 1100,
               .sinks = true,
               .lse = true,
               .kv_type = element_type::f32,
               .precision = qkv::precision::fp16},
              decode_paths(), ++seed);
    run_paths({.q_len = 5, .kv_len = 1030, .d_qk = 96, .d_v = 64, .kv_type = element_type::q8_0},
              paths_of({path::decode_cache, path::decode_coop_cache}), ++seed);
    // A window no row reaches: every row attends nothing (zeros, lse -inf), sinks or not.
    run_paths({.q_len = 2,
               .kv_len = 1024,
               .alignment = causal_alignment::top_left,
               .window_left = -1,
               .window_right = -1,
               .sinks = true,
               .lse = true},
              paths_of({path::decode_host, path::decode_coop_host}), ++seed);
}

TEST_CASE("sdpa features: quantized and mixed K/V types on the fused route", "[vulkan][sdpa][features][families]") {
    std::uint64_t seed = 600;
    for (const element_type t : {element_type::q8_0, element_type::q4_0, element_type::f16})
        run_paths({.q_heads = 4,
                   .kv_heads = 2,
                   .q_len = 17,
                   .kv_len = 113,
                   .d_qk = 64,
                   .d_v = 32,
                   .causal = true,
                   .lse = true,
                   .kv_type = t},
                  fused_paths(), ++seed);
    // fp16 queries with float32 K/V
    run_paths({.q_len = 17, .kv_len = 113, .kv_type = element_type::f32, .precision = qkv::precision::fp16},
              fused_paths(), ++seed);
}

TEST_CASE("sdpa features: wide heads, E = 576 and Ev = 512", "[vulkan][sdpa][features][wide][families]") {
    const spec s{
        .q_heads = 2, .kv_heads = 1, .q_len = 9, .kv_len = 40, .d_qk = 576, .d_v = 512, .causal = true, .lse = true};
    run_paths(s, fused_paths(), 700);
    if (runs(path::fused_coop)) {  // beyond the cooperative-matrix family's 256: refused, naming the limit
        owned_sdpa o = make(s, 700);
        o.problem.options.kernel = qkv::kernel_family::coopmat;
        o.problem.options.precision = qkv::precision::fp16;
        try {
            (void)qkv_test::gpu().sdpa(o.problem);
            FAIL("a head of 576 was taken by the cooperative-matrix family");
        } catch (const qkv::vulkan::limit_exceeded& e) {
            CHECK(std::string(e.what()).find("head widths up to 256") != std::string::npos);
        }
    }
    const spec d{.q_heads = 4,
                 .kv_heads = 1,
                 .q_len = 1,
                 .kv_len = 1024,
                 .d_qk = 576,
                 .d_v = 512,
                 .kv_type = element_type::q8_0};
    run_paths(d, paths_of({path::decode_cache, path::decode_coop_cache}), 701);
}

TEST_CASE("sdpa features: parts over disjoint key halves merge into the whole call",
          "[vulkan][sdpa][features][families]") {
    // Each path computes the two halves without sinks, with lse; qkv::merge_attention applies the
    // sinks once and must give the whole call (sinks included).
    using qkv::causal_alignment;
    for (const path route :
         paths_of({path::fused_cpu, path::fused_gpu, path::fused_coop, path::decode_host, path::decode_coop_host})) {
        const bool decode = route == path::decode_host || route == path::decode_coop_host;
        spec s{.q_heads = 4,
               .kv_heads = 2,
               .q_len = 3,
               .kv_len = decode ? 2048u : 226u,
               .causal = true,
               .alignment = causal_alignment::bottom_right,
               .softcap = 10.0f,
               .sinks = true,
               .lse = true};
        INFO(name_of(route));
        if (coop(route)) s.precision = qkv::precision::fp16;
        owned_sdpa whole = make(s, 800);
        whole.problem.options.kernel = family_of(route);
        const qkv::sdpa_output all = qkv_test::gpu().sdpa(whole.problem);
        // The halves: keys [0, S/2) and [S/2, S), each with the masks the whole call's rows had:
        // causal bottom-right there becomes an additive mask over the half's keys.
        const std::size_t S = s.kv_len, half = S / 2, L = s.q_len;
        std::vector<qkv::sdpa_output> parts;
        std::vector<std::vector<float>> keep;
        for (const auto& [from, to] : {std::pair{std::size_t{0}, half}, std::pair{half, S}}) {
            const std::size_t n = to - from;
            std::vector<float> k, v, add(L * n);
            for (std::size_t z = 0; z < s.kv_heads; ++z)
                for (std::size_t j = from; j < to; ++j) {
                    k.insert(k.end(), whole.k.begin() + static_cast<std::ptrdiff_t>((z * S + j) * s.d_qk),
                             whole.k.begin() + static_cast<std::ptrdiff_t>((z * S + j + 1) * s.d_qk));
                    v.insert(v.end(), whole.v.begin() + static_cast<std::ptrdiff_t>((z * S + j) * s.d_v),
                             whole.v.begin() + static_cast<std::ptrdiff_t>((z * S + j + 1) * s.d_v));
                }
            for (std::size_t i = 0; i < L; ++i)
                for (std::size_t j = 0; j < n; ++j) add[i * n + j] = from + j <= i + S - L ? 0.0f : neg_inf;
            qkv::sdpa_problem p = whole.problem;
            p.shape.kv_len = n;
            p.k = k, p.v = v;
            p.additive_mask = add;
            p.options.causal = false;
            p.sinks = {};
            parts.push_back(qkv_test::gpu().sdpa(p));
            require_clean(qkv_test::gpu());
        }
        const qkv::attention_part both[2] = {{parts[0].output, parts[0].lse}, {parts[1].output, parts[1].lse}};
        const qkv::merged_attention m =
            qkv::merge_attention(both, {.batch = 1, .q_heads = s.q_heads, .q_len = L, .d_v = s.d_v}, whole.sinks);
        const std::vector<double> want_out(all.output.begin(), all.output.end());
        const std::vector<double> want_lse(all.lse.begin(), all.lse.end());
        // (the cooperative-matrix family rounds each half's weights to float16 against its own maximum)
        CHECK(qkv_test::nmse(m.out, want_out) <= qkv_test::case_tolerance(family_of(route), 1e-12));
        CHECK(qkv_test::nmse(m.lse, want_lse) <= qkv_test::case_tolerance(family_of(route), 1e-12));
    }
}

namespace {

/// Where the stored K/V comes from, for check_reads_back: a kv_cache filled by host appends (2
/// rows, then the rest: rows of q4_0 blocks, 18 bytes, start at both halves of a 32-bit word) or
/// by one append of K/V tensors of the cache's type (decoded against it); or K/V tensors of that
/// type as an sdpa_call's inputs (the fused kernels over the values as float32).
enum class kv_source { host_appends, tensor_append, tensors };

/// The K/V storage of one check_reads_back: B = 1, Hkv heads (Hq = Hkv), S keys in a cache of
/// `capacity` rows.
struct reads_back_shape {
    std::size_t kv_heads = 2, keys = 5, capacity = 8, d_qk = 64, d_v = 32;
};

/// One call reads every stored element back: query row (j, c) has the one-hot query e_c (scale 1)
/// and a mask that keeps key j alone, so its weight is exactly 1: out = v_j as stored, lse =
/// k_j[c] as stored (m = q·k_j exactly, l = e^0 = 1).
void check_reads_back(qkv::vulkan::context& ctx, const reads_back_shape& shape, kv_source source) {
    for (const element_type t : {element_type::f16, element_type::q8_0, element_type::q4_0}) {
        if (qkv::is_quantized(t) && (shape.d_qk % 32 != 0 || shape.d_v % 32 != 0)) continue;  // blocks of 32
        const std::size_t B = 1, Hkv = shape.kv_heads, S = shape.keys, E = shape.d_qk, Ev = shape.d_v, L = S * E;
        INFO(qkv::to_string(t) << ", Hkv " << Hkv << ", S " << S << " (capacity " << shape.capacity << "), E " << E
                               << ", Ev " << Ev << ", source " << static_cast<int>(source));
        std::mt19937_64 rng(900 + S);
        std::normal_distribution<float> normal(0.0f, 3.0f);
        std::vector<float> k(B * Hkv * S * E), v(B * Hkv * S * Ev);
        for (float& x : k) x = normal(rng);
        for (float& x : v) x = normal(rng);
        std::vector<float> q(B * Hkv * L * E, 0.0f);
        std::vector<std::uint8_t> mask(Hkv * L * S, 0);
        for (std::size_t h = 0; h < Hkv; ++h)
            for (std::size_t j = 0; j < S; ++j)
                for (std::size_t c = 0; c < E; ++c) {
                    const std::size_t row = j * E + c;
                    q[(h * L + row) * E + c] = 1.0f;
                    mask[(h * L + row) * S + j] = 1;
                }
        qkv::sdpa_problem p{
            .shape = {.batch = B, .q_heads = Hkv, .kv_heads = Hkv, .q_len = L, .kv_len = S, .d_qk = E, .d_v = Ev},
            .q = q,
            .mask = mask,
            .mask_shape = {1, Hkv, L, S},
            .options = {.scale = 1.0f, .return_lse = true}};
        qkv::sdpa_output got;
        if (source == kv_source::tensors) {
            qkv::sdpa_problem desc = p;
            desc.q = {};
            desc.options.kv_type = t;
            qkv::vulkan::sdpa_call call(ctx, desc);
            qkv::vulkan::tensor qt(ctx, {B, Hkv, L, E}), kt(ctx, {B, Hkv, S, E}, t), vt(ctx, {B, Hkv, S, Ev}, t);
            qkv::vulkan::tensor out(ctx, {B, Hkv, L, Ev}), lse(ctx, {B, Hkv, L});
            qt.upload(q), kt.upload(k), vt.upload(v);
            call.run({.q = &qt, .k = &kt, .v = &vt, .out = &out, .lse = &lse});
            got.output = out.download(), got.lse = lse.download();
        } else {
            qkv::vulkan::kv_cache cache(
                ctx, {.batch = B, .kv_heads = Hkv, .capacity = shape.capacity, .d_qk = E, .d_v = Ev, .type = t});
            if (source == kv_source::tensor_append) {
                qkv::vulkan::tensor kt(ctx, {B, Hkv, S, E}, t), vt(ctx, {B, Hkv, S, Ev}, t);
                kt.upload(k), vt.upload(v);
                cache.append(kt, vt, S);
            } else {
                for (const auto& [from, rows] :
                     {std::pair{std::size_t{0}, std::min<std::size_t>(2, S)},
                      std::pair{std::min<std::size_t>(2, S), S - std::min<std::size_t>(2, S)}}) {
                    if (rows == 0) continue;
                    std::vector<float> kk, vv;
                    for (std::size_t z = 0; z < B * Hkv; ++z) {
                        kk.insert(kk.end(), k.begin() + static_cast<std::ptrdiff_t>((z * S + from) * E),
                                  k.begin() + static_cast<std::ptrdiff_t>((z * S + from + rows) * E));
                        vv.insert(vv.end(), v.begin() + static_cast<std::ptrdiff_t>((z * S + from) * Ev),
                                  v.begin() + static_cast<std::ptrdiff_t>((z * S + from + rows) * Ev));
                    }
                    cache.append(kk, vv, rows);
                }
            }
            p.shape.kv_len = 0;  // the cache's size
            got = ctx.sdpa(p, cache);
        }
        require_clean(ctx);
        const std::vector<float> k_stored = qkv::round_trip(t, k), v_stored = qkv::round_trip(t, v);
        // Bit for bit, but for the sign of a zero: a q4_0 quant of 8 with a negative scale stores
        // -0, which the sums (lse = m + log 1, out = 0 + 1·v) turn into +0.
        const auto same = [](float got_value, float want) {
            return want == 0.0f ? got_value == 0.0f : std::memcmp(&got_value, &want, sizeof want) == 0;
        };
        std::size_t k_wrong = 0, v_wrong = 0;
        for (std::size_t h = 0; h < Hkv; ++h)
            for (std::size_t j = 0; j < S; ++j)
                for (std::size_t c = 0; c < E; ++c) {
                    const std::size_t row = h * L + j * E + c;
                    k_wrong += !same(got.lse[row], k_stored[(h * S + j) * E + c]);
                    for (std::size_t e = 0; e < Ev; ++e)
                        v_wrong += !same(got.output[row * Ev + e], v_stored[(h * S + j) * Ev + e]);
                }
        CHECK(k_wrong == 0);
        CHECK(v_wrong == 0);
    }
}

/// Caches and tensors whose storage ends mid 32-bit word: an odd number of rows in all of 34-byte
/// (q8_0, 32 values), 18-byte (q4_0) or 102- and 54-byte (96 values) rows, so that the last row's
/// last quants share a word with what follows the storage, and f16 of an odd number of values
/// (widths 17 and 5: f16 alone); and an even count, rows of 64 values.
constexpr reads_back_shape reads_back_shapes[] = {
    {.kv_heads = 2, .keys = 5, .capacity = 8, .d_qk = 64, .d_v = 32},
    {.kv_heads = 1, .keys = 1, .capacity = 1, .d_qk = 32, .d_v = 96},
    {.kv_heads = 3, .keys = 3, .capacity = 3, .d_qk = 96, .d_v = 32},
    {.kv_heads = 1, .keys = 17, .capacity = 17, .d_qk = 32, .d_v = 32},
    {.kv_heads = 1, .keys = 113, .capacity = 113, .d_qk = 32, .d_v = 32},
    {.kv_heads = 1, .keys = 3, .capacity = 3, .d_qk = 17, .d_v = 5},
};

}  // namespace

TEST_CASE("kv_cache: appended then dequantized matches qkv::round_trip bit for bit, odd row counts",
          "[vulkan][kv_cache][features]") {
    for (const reads_back_shape& s : reads_back_shapes)
        for (const kv_source source : {kv_source::host_appends, kv_source::tensor_append})
            check_reads_back(qkv_test::gpu(), s, source);
}

TEST_CASE("sdpa over f16 / q8_0 / q4_0 K/V tensors reads every stored value, odd row counts",
          "[vulkan][tensor][features]") {
    for (const reads_back_shape& s : reads_back_shapes) check_reads_back(qkv_test::gpu(), s, kv_source::tensors);
}

TEST_CASE("sdpa features: refusals name the option", "[vulkan][sdpa][features]") {
    qkv::vulkan::context& ctx = qkv_test::gpu();
    owned_sdpa o = make({.q_len = 3, .kv_len = 40, .d_qk = 40, .d_v = 40}, 1);
    o.problem.options.kv_type = element_type::q8_0;  // E = 40 is not a multiple of 32
    CHECK_THROWS_AS(ctx.sdpa(o.problem), qkv::invalid_argument);
    o.problem.options.kv_type.reset();
    o.problem.options.window_left = -2;
    CHECK_THROWS_AS(ctx.sdpa(o.problem), qkv::invalid_argument);
    o.problem.options.window_left = -1;
    owned_sdpa wide = make({.q_len = 3, .kv_len = 40, .d_qk = 608, .d_v = 64}, 2);
    CHECK_THROWS_AS(ctx.sdpa(wide.problem), qkv::vulkan::limit_exceeded);
    // A cache of another type than options.kv_type.
    qkv::vulkan::kv_cache cache(ctx, {.capacity = 4, .d_qk = 40, .d_v = 40});
    std::vector<float> k(3 * 40, 0.5f), v(3 * 40, 0.25f);
    cache.append(k, v, 3);
    qkv::sdpa_problem q = o.problem;
    q.k = {}, q.v = {}, q.shape.kv_len = 0;
    q.options.kv_type = element_type::f16;
    CHECK_THROWS_AS(ctx.sdpa(q, cache), qkv::invalid_argument);
    CHECK_THROWS_AS(qkv::vulkan::kv_cache(ctx, {.capacity = 4, .d_qk = 40, .d_v = 64, .type = element_type::q4_0}),
                    qkv::invalid_argument);
    // A quantized cache refuses a value quantize refuses, naming its element in the caller's span
    // (here in the second (batch, kv head)), and appends nothing.
    qkv::vulkan::kv_cache q8(
        ctx, {.batch = 1, .kv_heads = 2, .capacity = 4, .d_qk = 32, .d_v = 32, .type = element_type::q8_0});
    std::vector<float> k8(2 * 2 * 32, 0.5f), v8(2 * 2 * 32, 0.25f);
    v8[70] = std::numeric_limits<float>::quiet_NaN();
    CHECK_THROWS_WITH(q8.append(k8, v8, 2), Catch::Contains("kv_cache::append: v") && Catch::Contains("element 70 "));
    CHECK(q8.size() == 0);
    v8[70] = 0.25f;
    q8.append(k8, v8, 2);
    CHECK(q8.size() == 2);
    // Dropout is a training option: the decode kernels against a cache refuse it, never ignore it
    // (the fused routes compute it: tests/sdpa_backward_vulkan_test.cpp).
    q.options.kv_type.reset();
    q.options.dropout_p = 0.5f;
    CHECK_THROWS_WITH(ctx.sdpa(q, cache), Catch::Contains("dropout_p is not available"));
    CHECK_THROWS_AS(ctx.sdpa(q, cache), qkv::invalid_argument);
    require_clean(ctx);
}

TEST_CASE("sdpa features: planned calls over device tensors take the rules", "[vulkan][sdpa][features][tensor]") {
    // sdpa_call (qkv/vulkan/sdpa_call.hpp): the window, softcap, ALiBi and sinks over tensors,
    // both routes; the lse, another kv_type and a quantized cache are taken too (their results:
    // tests/capabilities_vulkan_test.cpp).
    using qkv::causal_alignment;
    qkv::vulkan::context& ctx = qkv_test::gpu();
    for (const std::size_t S : {113u, 1500u}) {  // fused, decode
        const spec s{.q_heads = 4,
                     .kv_heads = 2,
                     .q_len = S > 1000 ? 2u : 17u,
                     .kv_len = S,
                     .causal = true,
                     .alignment = causal_alignment::bottom_right,
                     .window_left = 40,
                     .window_right = 0,
                     .softcap = 10.0f,
                     .alibi = 8.0f,
                     .sinks = true};
        INFO(describe(s, path::fused_cpu));
        owned_sdpa o = make(s, 950 + S);
        const qkv::sdpa_output_f64 want = qkv_test::device_reference(o.problem);
        qkv::sdpa_problem desc = o.problem;
        desc.q = {}, desc.k = {}, desc.v = {};
        qkv::vulkan::sdpa_call call(ctx, desc);
        qkv::vulkan::tensor q(ctx, {1, s.q_heads, s.q_len, s.d_qk}), k(ctx, {1, s.kv_heads, S, s.d_qk}),
            v(ctx, {1, s.kv_heads, S, s.d_v}), out(ctx, {1, s.q_heads, s.q_len, s.d_v});
        q.upload(o.q), k.upload(o.k), v.upload(o.v);
        call.run({.q = &q, .k = &k, .v = &v, .out = &out});
        const std::vector<float> got = out.download();
        check_close(got, want.output, s.d_v, "output", 1e-9);
        require_clean(ctx);
        qkv::sdpa_problem lse = desc;
        lse.options.return_lse = true;
        CHECK_NOTHROW(qkv::vulkan::sdpa_call(ctx, lse));
        qkv::sdpa_problem q8 = desc;
        q8.options.kv_type = element_type::q8_0;
        CHECK_NOTHROW(qkv::vulkan::sdpa_call(ctx, q8));
    }
    {
        // Against a cache whose size the call takes when it runs (kv_len 0 in the description):
        // the window's params are made once, for any later size.
        const spec s{.q_heads = 4,
                     .kv_heads = 2,
                     .q_len = 2,
                     .kv_len = 1500,
                     .causal = true,
                     .alignment = causal_alignment::bottom_right,
                     .window_left = 700,
                     .window_right = 0,
                     .sinks = true};
        owned_sdpa o = make(s, 990);
        const qkv::sdpa_output_f64 want = qkv_test::device_reference(o.problem);
        qkv::vulkan::kv_cache kvc(ctx, {.kv_heads = 2, .capacity = 2000, .d_qk = 32, .d_v = 32});
        qkv::sdpa_problem desc = o.problem;
        desc.q = {}, desc.k = {}, desc.v = {};
        desc.shape.kv_len = 0;
        qkv::vulkan::sdpa_call call(ctx, desc, kvc);
        kvc.append(o.k, o.v, 1500);
        qkv::vulkan::tensor q(ctx, {1, 4, 2, 32}), out(ctx, {1, 4, 2, 32});
        q.upload(o.q);
        call.run({.q = &q, .out = &out});
        check_close(out.download(), want.output, s.d_v, "output against a cache", 1e-9);
        require_clean(ctx);
    }
    {
        // ALiBi and a window seen from past 2^31, against a cache that grows between two runs of
        // one planned call: its params, written once, hold positions reduced without kv_len.
        const std::int64_t off = (std::int64_t{1} << 31) + 7;
        const spec s{.q_heads = 4,
                     .kv_heads = 2,
                     .q_len = 2,
                     .kv_len = 1500,
                     .window_left = off - 1000,  // keys from i + 1000 on
                     .alibi = 8.0f,
                     .sinks = true,
                     .position_offset = off};
        owned_sdpa o = make(s, 991);
        qkv::vulkan::kv_cache kvc(ctx, {.kv_heads = 2, .capacity = 2000, .d_qk = 32, .d_v = 32});
        qkv::sdpa_problem desc = o.problem;
        desc.q = {}, desc.k = {}, desc.v = {};
        desc.shape.kv_len = 0;
        qkv::vulkan::sdpa_call call(ctx, desc, kvc);
        qkv::vulkan::tensor q(ctx, {1, 4, 2, 32}), out(ctx, {1, 4, 2, 32});
        q.upload(o.q);
        std::size_t have = 0;
        for (const std::size_t rows : {std::size_t{1200}, std::size_t{1500}}) {
            // Rows [have, rows) of both K/V heads, then the call over the first `rows` keys.
            const auto slice = [&](const std::vector<float>& t, std::size_t from, std::size_t to) {
                std::vector<float> r;
                for (std::size_t z = 0; z < 2; ++z)
                    r.insert(r.end(), t.begin() + static_cast<std::ptrdiff_t>((z * 1500 + from) * 32),
                             t.begin() + static_cast<std::ptrdiff_t>((z * 1500 + to) * 32));
                return r;
            };
            kvc.append(slice(o.k, have, rows), slice(o.v, have, rows), rows - have);
            have = rows;
            const std::vector<float> k = slice(o.k, 0, rows), v = slice(o.v, 0, rows);
            qkv::sdpa_problem part = o.problem;
            part.shape.kv_len = rows;
            part.k = k, part.v = v;
            const qkv::sdpa_output_f64 want = qkv_test::device_reference(part);
            call.run({.q = &q, .out = &out});
            INFO("position_offset " << off << ", " << rows << " keys in the cache");
            check_close(out.download(), want.output, s.d_v, "output against a growing cache", 1e-9);
            require_clean(ctx);
        }
    }
    qkv::vulkan::kv_cache cache(ctx, {.capacity = 8, .d_qk = 32, .d_v = 32, .type = element_type::q4_0});
    qkv::sdpa_problem desc{.shape = {.q_len = 1, .d_qk = 32, .d_v = 32}};
    CHECK_NOTHROW(qkv::vulkan::sdpa_call(ctx, desc, cache));
    CHECK_THROWS_AS((void)cache.keys(), qkv::vulkan::unavailable);
    require_clean(ctx);
}

TEST_CASE("sdpa features: the decode kernel's wide form, every rule and K/V type, and heads to 4,096",
          "[vulkan][sdpa][features][decode_wide]") {
    // Heads wider than 32 texels loop over E and Ev rather than unroll them (src/kernels/decode_plan.cpp);
    // a context whose hook puts every head on that form runs the rules at small widths, and real
    // wide heads run as they are.
    using qkv::causal_alignment;
    qkv::vulkan::context ctx = qkv_test::make_context({.decode_unrolled_texels = 1});
    std::uint64_t seed = 1500;
    const auto both = {path::decode_host, path::decode_cache};
    for (const element_type t : {element_type::f32, element_type::f16, element_type::q8_0, element_type::q4_0}) {
        const spec s = decode_every_rule(t);
        for (const path route : both) {
            owned_sdpa o = make(s, ++seed);
            run(ctx, o, route, s);
        }
    }
    // Rows past one lane each (16 rows: 2 a lane; 64: 4 a lane, 2 row blocks), a bool mask with an
    // empty row, widths of 12 and 20 texels (4 and 2 a loop iteration), fp16 queries.
    const spec more[] = {
        {.q_heads = 16, .kv_heads = 1, .q_len = 1, .kv_len = 1100, .d_qk = 48, .d_v = 80, .sinks = true, .lse = true},
        {.batch = 2,
         .q_heads = 16,
         .kv_heads = 2,
         .q_len = 8,
         .kv_len = 1030,
         .d_qk = 32,
         .d_v = 32,
         .mask = masks::boolean,
         .mask_shape = {2, 16, 8, 1030},
         .empty_row = true,
         .lse = true},
        {.q_heads = 4,
         .kv_heads = 4,
         .q_len = 1,
         .kv_len = 1100,
         .d_qk = 96,
         .d_v = 64,
         .precision = qkv::precision::fp16},
    };
    for (const spec& s : more)
        for (const path route : both) {
            owned_sdpa o = make(s, ++seed);
            run(ctx, o, route, s);
        }
    // Values holding NaN and Inf: masked ones add nothing, an allowed +inf reaches the output.
    {
        const spec s{.q_heads = 2, .kv_heads = 1, .q_len = 1, .kv_len = 1024, .d_qk = 64, .d_v = 64, .lse = true};
        for (const path route : both) {
            owned_sdpa o = make(s, ++seed);
            o.additive.assign(s.kv_len, 0.0f);
            o.additive[5] = o.additive[700] = neg_inf;
            o.problem.additive_mask = o.additive;
            o.problem.mask_shape = {s.kv_len};
            o.v[5 * s.d_v + 3] = std::numeric_limits<float>::quiet_NaN();
            o.v[700 * s.d_v + 9] = std::numeric_limits<float>::infinity();
            o.v[900 * s.d_v + 17] = std::numeric_limits<float>::infinity();
            o.problem.v = o.v;
            INFO(name_of(route));
            const qkv::sdpa_output_f64 want = qkv_test::device_reference(o.problem);
            qkv::sdpa_problem p = o.problem;
            qkv::sdpa_output got;
            if (route == path::decode_cache) {
                qkv::vulkan::kv_cache cache(ctx, {.capacity = s.kv_len, .d_qk = s.d_qk, .d_v = s.d_v});
                cache.append(o.k, o.v, s.kv_len);
                p.k = {}, p.v = {}, p.shape.kv_len = 0;
                got = ctx.sdpa(p, cache);
            } else {
                got = ctx.sdpa(p);
            }
            require_clean(ctx);
            REQUIRE(got.output.size() == want.output.size());
            std::size_t wrong = 0;
            for (std::size_t i = 0; i < want.output.size(); ++i) {
                const double w = want.output[i], g = got.output[i];
                wrong += std::isinf(w) ? g != w : !(std::abs(g - w) <= 1e-5 * (1 + std::abs(w)));
            }
            CHECK(wrong == 0);
        }
    }
    // Every stored element read back bit for bit through the wide form's block reads.
    for (const reads_back_shape& s : reads_back_shapes) check_reads_back(ctx, s, kv_source::host_appends);
    // The gpu decode kernel loops over E past 32 texels too (its Q is in shared memory): asked for
    // by name, with a bool mask, ALiBi and sinks, over q8_0 blocks and float32 texels.
    for (const element_type t : {element_type::f32, element_type::q8_0}) {
        const spec s{.q_heads = 4,
                     .kv_heads = 2,
                     .q_len = 2,
                     .kv_len = 1030,
                     .d_qk = 256,
                     .d_v = 160,
                     .mask = masks::boolean,
                     .alibi = 8.0f,
                     .sinks = true,
                     .lse = true,
                     .kv_type = t};
        owned_sdpa o = make(s, ++seed);
        o.problem.options.kernel = qkv::kernel_family::block_tiles;
        INFO(describe(s, path::decode_host) << " (gpu kernel)");
        const qkv::sdpa_output_f64 want = qkv_test::device_reference(o.problem);
        const qkv::sdpa_output got = qkv_test::gpu().sdpa(o.problem);
        CHECK(got.kernel == qkv::kernel_family::block_tiles);
        check_close(got.output, want.output, s.d_v, "output", 1e-9);
        qkv_test::check_lse(got.lse, want.lse, 1e-9);
        require_clean(qkv_test::gpu());
    }
    // Real wide heads: E = 1,024 over q8_0 blocks, E = Ev = 4,096 over float32 texels.
    {
        const spec s{.q_heads = 2,
                     .kv_heads = 1,
                     .q_len = 1,
                     .kv_len = 1024,
                     .d_qk = 1024,
                     .d_v = 1024,
                     .causal = true,
                     .alignment = causal_alignment::bottom_right,
                     .lse = true,
                     .kv_type = element_type::q8_0};
        owned_sdpa o = make(s, ++seed);
        run(qkv_test::gpu(), o, path::decode_cache, s);
    }
    {
        const spec s{.q_heads = 2, .kv_heads = 1, .q_len = 1, .kv_len = 1024, .d_qk = 4096, .d_v = 4096, .lse = true};
        owned_sdpa o = make(s, ++seed);
        run(qkv_test::gpu(), o, path::decode_host, s);
    }
}

TEST_CASE("sdpa features: the decode kernel's wide form with the score rules far from the keys, one call each",
          "[vulkan][sdpa][decode_wide_smoke]") {
    // Its own CTest entry, labelled driver2: the wide form and the reduced positions on every driver
    // leg, a few pipelines (Mesa 25 builds each 10-40x slower cold). E = 160 (40 texels: wide),
    // float32 K/V from the host and a q8_0 cache, softcap, ALiBi and a window seen from 2^31 + 5.
    const std::int64_t off = (std::int64_t{1} << 31) + 5;
    const spec s{.q_heads = 4,
                 .kv_heads = 2,
                 .q_len = 2,
                 .kv_len = 1100,
                 .d_qk = 160,
                 .d_v = 96,
                 .window_left = off - 300,
                 .softcap = 1e6f,
                 .alibi = 8.0f,
                 .sinks = true,
                 .lse = true,
                 .position_offset = off};
    std::uint64_t seed = 1600;
    for (const element_type t : {element_type::f32, element_type::q8_0}) {
        spec st = s;
        st.kv_type = t;
        REQUIRE(decode_shape(st));
        owned_sdpa o = make(st, ++seed);
        run(qkv_test::gpu(), o, t == element_type::f32 ? path::decode_host : path::decode_cache, st);
    }
}

// ---- the grid -----------------------------------------------------------------------------------
//
// ggml's test-backend-ops FLASH_ATTN_EXT cases: head sizes 40, 64, 72, 80, 96, 128, 192/128, 256,
// 320/256, 576/512; GQA ratios 1, 4, 12, 20; kv 113, 512, 1024; query rows 1, 3, 32, 75; mask,
// sinks, ALiBi 8, softcap 10; K/V types. The full product is thousands of calls (and on lavapipe
// each new head size, feature set and mask kind is a pipeline that LLVM compiles for seconds), so a
// seeded sample: every head size once on the fused route and once where it decodes, the other
// dimensions and features drawn.
TEST_CASE("sdpa grid: sampled FLASH_ATTN_EXT cases against the float64 reference", "[vulkan][sdpa][grid][families]") {
    struct head {
        std::size_t e, ev;
    };
    const head heads[] = {{40, 40},   {64, 64},   {72, 72},   {80, 80},   {96, 96},
                          {128, 128}, {192, 128}, {256, 256}, {320, 256}, {576, 512}};
    const std::size_t ratios[] = {1, 4, 12, 20}, kvs[] = {113, 512, 1024}, rows[] = {1, 3, 32, 75};
    std::mt19937_64 rng(20261125);
    const auto pick = [&](std::size_t n) { return std::uniform_int_distribution<std::size_t>(0, n - 1)(rng); };
    std::size_t i = 0;
    for (const head& h : heads) {
        for (const bool decode : {false, true}) {
            spec s;
            s.d_qk = h.e, s.d_v = h.ev;
            s.kv_heads = 1;
            s.q_heads = ratios[pick(4)];
            s.kv_len = decode ? 1024 : kvs[pick(3)];
            s.q_len = decode ? (s.q_heads <= 4 ? std::size_t{3} : std::size_t{1}) : rows[pick(4)];
            if (!decode && s.q_len * s.q_heads * s.kv_len * (h.e + h.ev) > 40'000'000) s.q_len = 3;  // lavapipe's time
            s.mask = pick(2) ? masks::boolean : masks::none;
            s.causal = pick(2) != 0;
            s.alignment = qkv::causal_alignment::bottom_right;
            s.sinks = pick(2) != 0;
            s.alibi = pick(3) == 0 ? 8.0f : 0.0f;
            s.softcap = pick(3) == 0 ? 10.0f : 0.0f;
            s.lse = true;
            const element_type types[] = {element_type::f32, element_type::f16, element_type::q8_0, element_type::q4_0};
            s.kv_type = types[pick(h.e % 32 == 0 && h.ev % 32 == 0 ? 4 : 2)];
            std::vector<path> routes = decode ? decode_paths() : fused_paths();
            std::erase_if(routes, [&](path r) { return coop(r) && (h.e > 256 || h.ev > 256); });
            if (routes.empty()) continue;  // (QKV_TEST_FAMILIES=coopmat: the widest heads are not its)
            const path route = routes[pick(routes.size())];
            if (coop(route)) s.kv_type = std::nullopt;  // the family stores K and V as float16
            if (decode) REQUIRE(decode_shape(s));
            owned_sdpa o = make(s, 1000 + ++i);
            run(qkv_test::gpu(), o, route, s);
        }
    }
}
