#include "kernels/flash_coop_plan.hpp"

#include <algorithm>
#include <numeric>
#include <string>

#include "contract/score.h"
#include "qkv/vulkan/error.hpp"

namespace qkv::vulkan::detail {
namespace {

using namespace qkv::contract;

std::uint32_t ceil_div(std::uint64_t a, std::uint64_t b) { return static_cast<std::uint32_t>((a + b - 1) / b); }
std::uint32_t round_up(std::uint32_t v, std::uint32_t to) { return ceil_div(v, to) * to; }
bool power_of_two(std::uint32_t v) { return v != 0 && (v & (v - 1)) == 0; }
std::uint32_t log2_of(std::uint32_t v) {
    std::uint32_t n = 0;
    while (v > 1) v /= 2, ++n;
    return n;
}

// VkDriverId values (VkPhysicalDeviceDriverProperties::driverID) of the gated drivers.
constexpr std::uint32_t driver_amd_proprietary = 1, driver_amd_open_source = 2, driver_intel_windows = 5,
                        driver_intel_mesa = 6, driver_llvmpipe = 13;
constexpr std::uint32_t vendor_intel = 0x8086;

/// The widest head either product takes: wider ones spill the accumulators of O (and take
/// lavapipe minutes to compile); FlashAttention stops at 256 as well.
constexpr std::uint32_t coop_max_head = 256;
/// The fields of coop_push that hold two 16-bit counts.
constexpr std::uint32_t coop_max_count16 = 0xffffu;

bool llvmpipe(const device_desc& d) { return d.info.driver_id == driver_llvmpipe; }

const coop_gate gates[] = {
    {"lavapipe (llvmpipe) with vectors of other than 8 lanes",
     [](const device_desc& d) { return llvmpipe(d) && d.info.subgroup_size != 8; }, coop_gate_effect::refused,
     "Mesa 26.1's lavapipe lowers cooperative matrices for 8-lane vectors only (a matrix row per lane of "
     "an 8 x 8 matrix, lvp_nir_lower_cooperative_matrix.c); with LP_NATIVE_VECTOR_WIDTH=512 (16 lanes) a "
     "cooperative-matrix program crashed"},
    {"a GPU", [](const device_desc& d) { return d.info.type != device_type::cpu; }, coop_gate_effect::unverified,
     "the family's GPU configuration (a subgroup of 16 or more lanes sharing each row of an M x N tile, "
     "several subgroups per workgroup) has not been seen right on any GPU: on an NVIDIA H200 (driver "
     "580.159.04, 16x16x16 matrices, 32 lanes) every cooperative-matrix test gave wrong results, nmse "
     "1.4 to 2.1 against float64 (bench/gpu/check.sh, 2026-11-27); the block_tiles family computes these "
     "calls there"},
    {"lavapipe (llvmpipe)", llvmpipe, coop_gate_effect::manual_only,
     "it emulates the matrices with a subgroup reduction per element on the CPU: right, and far slower "
     "than the cpu family, which stays the automatic choice there"},
    {"AMD's proprietary driver and AMDVLK",
     [](const device_desc& d) {
         return d.info.driver_id == driver_amd_proprietary || d.info.driver_id == driver_amd_open_source;
     },
     coop_gate_effect::manual_only,
     "they offer VK_KHR_cooperative_matrix on GPUs without matrix units too (before RDNA3), where a "
     "cooperative-matrix path was measured slower than the scalar one (llama.cpp's Vulkan backend gates "
     "them alike); RADV offers it only where the hardware has it"},
    {"Intel before Xe2",
     [](const device_desc& d) {
         return (d.info.driver_id == driver_intel_windows || d.info.driver_id == driver_intel_mesa ||
                 d.info.vendor_id == vendor_intel) &&
                d.subgroups.min_size < 16;
     },
     coop_gate_effect::manual_only,
     "its drivers offer the extension on Arc A-series (Xe-HPG) as well, where llama.cpp measured its "
     "cooperative-matrix path slower; Xe2 (minimum subgroup size 16) keeps the automatic choice"},
};

/// The largest f16 · f16 + f32 -> f32 subgroup-scope shape of the device's list that the kernel's
/// softmax step can split among `lanes` lanes (lanes and rows powers of two); m = 0 where none.
cooperative_matrix_shape pick_shape(const device_info& info, std::uint32_t lanes) {
    cooperative_matrix_shape best{};
    for (const cooperative_matrix_shape& s : info.cooperative_matrices) {
        if (s.a != matrix_component::f16 || s.b != matrix_component::f16 || s.c != matrix_component::f32 ||
            s.result != matrix_component::f32 || !s.subgroup_scope || s.saturating)
            continue;
        if (!power_of_two(s.m) || !power_of_two(s.n) || !power_of_two(s.k) || s.m > 64 || s.n > 64 || s.k > 64)
            continue;
        const std::uint32_t lpr = lanes >= s.m ? lanes / s.m : 1;  // lanes sharing a row of scores
        if (s.n % lpr != 0) continue;
        const std::uint64_t work = std::uint64_t{s.m} * s.n * s.k, best_work = std::uint64_t{best.m} * best.n * best.k;
        if (work > best_work || (work == best_work && s.m > best.m)) best = s;
    }
    return best;
}

}  // namespace

std::span<const coop_gate> coop_gates() { return gates; }

std::uint32_t coop_tiles::shared_bytes() const {
    const std::uint32_t rows_all = rows();
    return 2 * bc * (d_pad + COOP_PAD_HALVES) + 2 * bc * (dv_pad + COOP_PAD_HALVES) +
           4 * rows_all * (bc + COOP_PAD_FLOATS) + 2 * rows_all * (bc + COOP_PAD_HALVES) +
           4 * rows_all * (n + COOP_PAD_FLOATS) + 8;
}

coop_verdict choose_coop_tiles(const device_desc& desc, std::uint32_t d, std::uint32_t dv, bool split,
                               const settings& set, coop_tiles& t) {
    const device_info& info = desc.info;
    const subgroup_control& sc = desc.subgroups;
    // The matrices span one subgroup: the pipeline fixes its size, with every subgroup full. The
    // smallest size the device offers is its matrix units' own width (NVIDIA's warp of 32, RDNA3's
    // wave32, Xe2's SIMD16, lavapipe's 8 lanes).
    if (!sc.required_size || !sc.full_subgroups || !power_of_two(sc.min_size))
        return {
            "the cooperative-matrix family needs VK_EXT_subgroup_size_control (required subgroup sizes "
            "with full subgroups) to fix the subgroup its matrices span; " +
                info.name + " does not offer it",
            false};
    if (!info.subgroup_shuffle)
        return {"the cooperative-matrix family reduces rows with subgroupShuffleXor, which " + info.name +
                    " does not offer in compute shaders",
                false};
    t = {};
    t.lanes = sc.min_size;
    t.required_subgroup = t.lanes;
    t.isolate = set.coop_isolate;
    const cooperative_matrix_shape s = pick_shape(info, t.lanes);
    if (s.m == 0)
        return {info.name +
                    " lists no cooperative matrix of float16 A and B with a float32 accumulator at subgroup "
                    "scope that the family's softmax step can split among its " +
                    std::to_string(t.lanes) + " lanes",
                false};
    t.m = s.m, t.n = s.n, t.k = s.k;
    const std::uint32_t step = std::lcm(std::lcm(t.m, t.n), t.k);
    t.d_pad = round_up(std::max(d, 1u), std::lcm(t.k, 8u));
    t.dv_pad = round_up(std::max(dv, 1u), std::lcm(t.n, 8u));
    const std::uint32_t max_wg = desc.max_workgroup_x();
    // A CPU device runs a workgroup on one thread: one subgroup, and short tiles (every unrolled
    // product is a block of straight-line code for LLVM). A GPU: four subgroups share each K/V tile
    // (FlashAttention-2's four warps), 64 keys where shared memory allows. Decode: one subgroup,
    // whose rows are the group's query heads.
    t.subgroups = split || info.type == device_type::cpu ? 1 : 4;
    while (t.subgroups > 1 && (t.wg() > max_wg || (sc.max_subgroups && t.subgroups > sc.max_subgroups)))
        t.subgroups /= 2;
    t.bc = info.type == device_type::cpu ? step : std::max(step, 64u);
    if (set.coop_keys) {
        if (set.coop_keys % step != 0)
            throw qkv::invalid_argument("QKV_COOP_TILES: " + std::to_string(set.coop_keys) +
                                        " keys per tile are not a multiple of " + std::to_string(step) + " on " +
                                        info.name);
        t.bc = set.coop_keys;
        t.subgroups = split ? 1 : set.coop_subgroups;
    }
    const auto fits = [&] { return t.shared_bytes() <= info.max_shared_memory && t.wg() <= max_wg; };
    while (!fits()) {
        if (t.bc > step)
            t.bc = std::max(step, t.bc / 2);
        else if (t.subgroups > 1)
            t.subgroups /= 2;
        else
            break;
    }
    if (!fits())
        return {"the cooperative-matrix family needs " + std::to_string(t.shared_bytes()) +
                    " bytes of shared memory and " + std::to_string(t.wg()) + " invocations for head widths " +
                    std::to_string(d) + " / " + std::to_string(dv) + "; " + info.name + " has " +
                    std::to_string(info.max_shared_memory) + " bytes and " + std::to_string(max_wg),
                true};
    return {};
}

coop_verdict check_coop(const device_desc& desc, const flash_layout& l, bool split, const settings& set,
                        coop_tiles& tiles) {
    const device_info& info = desc.info;
    if (!desc.coopmat_shaders)
        return {
            "this build of qkv has no cooperative-matrix shaders: it was built without a glslang that "
            "compiles GL_KHR_cooperative_matrix (glslang 13 or newer; see cmake/qkv_shaders.cmake)",
            false};
    if (!info.cooperative_matrix)
        return {
            info.name + (info.cooperative_matrices.empty()
                             ? std::string(" does not offer VK_KHR_cooperative_matrix")
                             : std::string(" offers VK_KHR_cooperative_matrix without what the family needs with it "
                                           "(the feature in compute shaders, vulkanMemoryModel, shaderFloat16 and "
                                           "16-bit storage buffers)")),
            false};
    bool manual = false;
    for (const coop_gate& g : coop_gates()) {
        if (!g.applies(desc)) continue;
        if (g.effect == coop_gate_effect::refused || (g.effect == coop_gate_effect::unverified && !set.coop_unverified))
            return {std::string("the cooperative-matrix family is refused on ") + g.name + " (" + info.driver +
                        "): " + g.reason +
                        (g.effect == coop_gate_effect::unverified
                             ? " (QKV_COOP_UNVERIFIED=1 runs it where asked for, to measure a fix)"
                             : ""),
                    false};
        manual = true;
    }
    if (!l.fp16)
        return {
            "the cooperative-matrix family multiplies float16 operands: it takes precision fp16 with float16 "
            "K and V (as FlashAttention takes fp16 and bf16 only); float32 calls keep float32 products on "
            "the other families",
            false};
    if ((l.features & contract::SCORE_DROPOUT) != 0u)
        return {
            "the cooperative-matrix family does not draw attention dropout's mask (dropout_p > 0); kernel "
            "automatic, row_tiles or block_tiles computes it",
            false};
    if (l.d > coop_max_head || l.dv > coop_max_head)
        return {"the cooperative-matrix family takes head widths up to " + std::to_string(coop_max_head) +
                    " (d_qk = " + std::to_string(l.d) + ", d_v = " + std::to_string(l.dv) + ")",
                true};
    if (l.heads > coop_max_count16 || l.group() > coop_max_count16)
        return {"the cooperative-matrix family takes at most 65,535 query heads (" + std::to_string(l.heads) + ")",
                true};
    coop_verdict v = choose_coop_tiles(desc, l.d, l.dv, split, set, tiles);
    if (!v.why.empty()) return v;
    v.automatic = !manual;
    return v;
}

contract::coop_push coop_push_for(const flash_layout& l) {
    coop_push p{};
    p.q_len = l.q_len, p.kv_len = l.kv_len;
    p.dims = l.d | (l.dv << 16);
    p.heads_group = l.heads | (l.group() << 16);
    p.q_bs = l.q.bs, p.q_hs = l.q.hs, p.q_rs = l.q.rs;
    p.k_bs = l.k.bs, p.k_hs = l.k.hs, p.k_rs = l.k.rs;
    p.v_bs = l.v.bs, p.v_hs = l.v.hs, p.v_rs = l.v.rs;
    p.q_off = 0, p.k_off = l.k_off, p.v_off = l.v_off;
    p.o_hs = l.o.hs, p.o_rs = l.o.rs;
    p.a_bs = l.a_bs, p.m_bs = l.m_bs, p.m_hs = l.m_hs, p.m_rs = l.m_rs, p.m_cs = l.m_cs;
    p.causal_offset = l.causal_offset;
    p.scale = l.scale;
    p.flags = l.mask_flags();
    p.kv_begin = 0, p.kv_stop = l.kv_len;
    p.chunk = l.kv_len;
    return p;
}

namespace {

/// The loop iterations of one invocation per K/V tile, and outside the tile loop. Every loop of
/// flash_coop.comp but the tile loop and the row reductions' butterflies has a constant trip count
/// and is unrolled by llvmpipe (measured: one dispatch over 8,750 tiles of 8 keys, S = 70,000, was
/// exact on Mesa 26.1), and its emulated matrix operations are straight-line code: those are what
/// counts towards its limit of 65,535 per invocation.
struct coop_loops {
    std::uint64_t per_tile = 0, fixed = 0;
};

coop_loops count_loops(const coop_tiles& t) {
    const std::uint64_t rs = std::uint64_t{t.row_tiles} * t.m;
    const std::uint64_t lpr = t.lanes >= rs ? t.lanes / rs : 1, rpl = rs > t.lanes ? rs / t.lanes : 1;
    coop_loops c;
    c.per_tile = 1 + 2 * rpl * log2_of(static_cast<std::uint32_t>(lpr));  // the tile loop, the butterflies
    c.fixed = log2_of(t.lanes) + 64;                                      // the resume's vote, a margin
    return c;
}

}  // namespace

std::uint64_t coop_loops_per_tile(const coop_tiles& tiles) { return count_loops(tiles).per_tile; }

flash_coop_plan plan_flash_coop(const device_desc& desc, const flash_layout& l, const settings& set) {
    flash_coop_plan p;
    const coop_verdict v = check_coop(desc, l, false, set, p.tiles);
    if (!v.why.empty()) {
        if (v.limit) throw limit_exceeded(v.why);
        throw unavailable(v.why);
    }
    // f16vec4 loads where every element offset the kernel forms is a multiple of 4.
    const std::uint32_t all[] = {l.d,    l.dv,   l.q.bs, l.q.hs, l.q.rs,  l.k.bs, l.k.hs,
                                 l.k.rs, l.v.bs, l.v.hs, l.v.rs, l.k_off, l.v_off};
    p.tiles.vec4 = std::all_of(std::begin(all), std::end(all), [](std::uint32_t x) { return x % 4 == 0; }) ? 1 : 0;
    std::uint64_t chunk = std::max(l.kv_len, 1u);
    if (desc.info.type == device_type::cpu) {
        // llvmpipe ends every loop of an invocation after 65,535 iterations in all: a dispatch takes
        // as many K/V tiles as fit that, with a margin; longer key ranges go to further dispatches.
        constexpr std::uint64_t budget = 65535 - 4096;
        const coop_loops c = count_loops(p.tiles);
        const std::uint64_t tiles = std::max<std::uint64_t>(1, (budget - std::min(budget - 1, c.fixed)) / c.per_tile);
        chunk = std::min<std::uint64_t>(chunk, tiles * p.tiles.bc);
    }
    if (set.max_fused_keys)
        chunk = std::min<std::uint64_t>(
            chunk, std::max<std::uint64_t>(p.tiles.bc, set.max_fused_keys / p.tiles.bc * p.tiles.bc));
    p.chunk_keys = static_cast<std::uint32_t>(chunk);
    return p;
}

}  // namespace qkv::vulkan::detail
