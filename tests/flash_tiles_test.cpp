// The fused kernel's per-device tile choice (src/kernels/flash_tiles.cpp), a pure function of the device
// description, against fake devices: discrete GPUs with subgroups of 32 and 64, an integrated GPU,
// a CPU implementation, and the smallest device the Vulkan spec allows. No Vulkan device needed.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/flash_tiles.hpp"
#include "support/catch.hpp"

using qkv::vulkan::device_info;
using qkv::vulkan::device_type;
using qkv::vulkan::detail::choose_flash_tiles;
using qkv::vulkan::detail::flash_chunk_keys;
using qkv::vulkan::detail::flash_tiles;
using qkv::vulkan::detail::flash_tiles_device;
using qkv::vulkan::detail::subgroup_control;

namespace {

struct fake {
    std::string name;
    device_info info;
    subgroup_control control;
};

device_info describe(device_type type, std::uint32_t subgroup, bool arithmetic, std::uint32_t shared,
                     std::uint32_t invocations) {
    device_info d;
    d.name = "fake";
    d.type = type;
    d.subgroup_size = subgroup;
    d.subgroup_arithmetic = arithmetic;
    d.max_shared_memory = shared;
    d.max_workgroup_invocations = invocations;
    d.max_workgroup_count[0] = d.max_workgroup_count[1] = d.max_workgroup_count[2] = 65535;
    return d;
}

std::vector<fake> fakes() {
    return {
        // NVIDIA: warps of 32, 48 KiB of static shared memory per workgroup
        {"discrete, subgroup 32", describe(device_type::discrete_gpu, 32, true, 49152, 1024), {32, 32, true, true, 32}},
        // AMD (GCN / RDNA wave64 default): 64 KiB of LDS, wave32..64 selectable
        {"discrete, subgroup 64", describe(device_type::discrete_gpu, 64, true, 65536, 1024), {32, 64, true, true, 16}},
        // AMD GCN: wave64 only
        {"discrete, subgroup 64 only",
         describe(device_type::discrete_gpu, 64, true, 65536, 1024),
         {64, 64, true, true, 16}},
        // Intel integrated: SIMD8..32, no subgroup size control offered here
        {"integrated, subgroup 16", describe(device_type::integrated_gpu, 16, true, 65536, 512), {}},
        // lavapipe: 8 lanes per AVX2 vector, 32 KiB
        {"cpu, subgroup 8", describe(device_type::cpu, 8, true, 32768, 1024), {8, 8, true, true, 128}},
        // the Vulkan minimum: 16 KiB, 128 invocations, no subgroup arithmetic, size unknown
        {"minimal", describe(device_type::other, 0, false, 16384, 128), {}},
    };
}

void check_valid(const fake& f, const flash_tiles& t, std::uint32_t d, std::uint32_t dv) {
    INFO(f.name << " d " << d << " dv " << dv << ": wg " << t.wg << " br " << t.br << " bc " << t.bc << " team "
                << t.team << " shared " << t.shared_bytes());
    CHECK(t.shared_bytes() <= f.info.max_shared_memory);
    CHECK(t.wg <= f.info.max_workgroup_invocations);
    CHECK(t.team >= 4);
    CHECK((t.team & (t.team - 1)) == 0);
    CHECK(t.wg % t.team == 0);
    CHECK(t.br % t.teams() == 0);
    CHECK(t.rows_per_team() >= 1);
    CHECK(t.bc >= 4);
    CHECK(t.d_max >= d);
    CHECK(t.d_max % 4 == 0);
    CHECK(t.dv_max >= dv);
    CHECK(t.dv_max % 4 == 0);
    const std::uint32_t dv4 = t.dv_max / 4, o_lanes = std::min(dv4, t.team);
    CHECK(t.team % o_lanes == 0);  // the value lanes tile a team exactly
    CHECK(dv4 % o_lanes == 0);
    CHECK(t.subgroup == f.info.subgroup_arithmetic);
    if (t.required_subgroup) {  // only what the device offers, and then no shared reductions
        CHECK(t.required_subgroup == t.team);
        CHECK(f.control.required_size);
        CHECK(t.required_subgroup >= f.control.min_size);
        CHECK(t.required_subgroup <= f.control.max_size);
        CHECK(t.teams() <= f.control.max_subgroups);
        CHECK(t.fallback == 0);
    } else {
        CHECK(t.fallback == 1);
    }
    if (t.q_regs) CHECK(t.rows_per_team() * t.d_max <= 64);
}

}  // namespace

TEST_CASE("fused tiles fit every fake device's limits for every head width", "[flash_tiles]") {
    for (const fake& f : fakes())
        for (std::uint32_t d : {1u, 3u, 16u, 64u, 80u, 100u, 128u, 256u})
            for (std::uint32_t dv : {1u, 5u, 64u, 100u, 256u})
                for (std::uint32_t seq : {1u, 17u, 300u, 4096u})
                    check_valid(f, choose_flash_tiles(f.info, seq, d, dv, f.control), d, dv);
}

TEST_CASE("fused tiles follow the device: GPUs get 128-256 invocations in subgroup-sized teams", "[flash_tiles]") {
    const auto f = fakes();
    const flash_tiles nv = choose_flash_tiles(f[0].info, 4096, 64, 64, f[0].control);
    CHECK(nv.wg == 256);
    CHECK(nv.team == 32);
    CHECK(nv.required_subgroup == 32);
    CHECK(nv.br == 32);  // 8 warps of 4 rows
    CHECK(nv.bc == 32);  // 64 keys would exceed 48 KiB
    CHECK(nv.q_regs == 0);
    const flash_tiles rdna = choose_flash_tiles(f[1].info, 4096, 64, 64, f[1].control);
    CHECK(rdna.wg == 256);
    CHECK(rdna.team == 32);  // wave32 where the pipeline may require it: 8 teams of 4 rows
    CHECK(rdna.required_subgroup == 32);
    CHECK(rdna.br == 32);
    CHECK(rdna.bc == 64);  // 64 KiB of LDS holds 64-key tiles
    const flash_tiles gcn = choose_flash_tiles(f[2].info, 4096, 64, 64, f[2].control);
    CHECK(gcn.wg == 256);
    CHECK(gcn.team == 64);
    CHECK(gcn.required_subgroup == 64);
    CHECK(gcn.bc == 64);  // a key per lane
    CHECK(gcn.br == 16);  // 4 waves of 4 rows
    const flash_tiles intel = choose_flash_tiles(f[3].info, 4096, 64, 64, f[3].control);
    CHECK(intel.wg == 128);
    CHECK(intel.team == 16);
    CHECK(intel.required_subgroup == 0);  // no size control: the shader checks the size at run time
    CHECK(intel.fallback == 1);
    const flash_tiles cpu = choose_flash_tiles(f[4].info, 4096, 64, 64, f[4].control);
    CHECK(cpu.wg == 64);
    CHECK(cpu.team == 8);
    CHECK(cpu.required_subgroup == 8);
    const flash_tiles small = choose_flash_tiles(f[5].info, 4096, 256, 256, f[5].control);
    CHECK(small.team == 32);  // unknown subgroup size: 32, with the shared-memory reductions
    CHECK(small.fallback == 1);
    CHECK(small.shared_bytes() <= 16384);
    // Short sequences: one row per team, so more workgroups share the work.
    CHECK(choose_flash_tiles(f[0].info, 100, 64, 64, f[0].control).rows_per_team() == 1);
    // Small heads: the queries stay in registers.
    CHECK(choose_flash_tiles(f[0].info, 100, 16, 16, f[0].control).q_regs == 1);
    // Wider heads take smaller tiles, never more shared memory than the device has.
    const flash_tiles wide = choose_flash_tiles(f[0].info, 4096, 256, 256, f[0].control);
    CHECK(wide.bc * wide.br < nv.bc * nv.br);
}

TEST_CASE("fused key chunks: every key on GPUs, bounded loop budgets on CPU devices", "[flash_tiles]") {
    const auto f = fakes();
    for (std::uint32_t seq : {1u, 1000u, 16384u, 65536u}) {
        CHECK(flash_chunk_keys(f[0].info, f[0].control, seq, 64, 64) == seq);
        CHECK(flash_chunk_keys(f[3].info, f[3].control, seq, 256, 256) == seq);
        CHECK(flash_chunk_keys(f[0].info, f[0].control, seq, 64, 64, 37) == std::min(seq, 37u));
    }
    for (std::uint32_t d : {1u, 64u, 256u}) {
        const flash_tiles t = choose_flash_tiles(f[4].info, 16384, d, d, f[4].control);
        const std::uint32_t chunk = flash_chunk_keys(f[4].info, f[4].control, 16384, d, d);
        INFO("d " << d << " chunk " << chunk);
        CHECK(chunk < 16384);
        CHECK(chunk % t.bc == 0);
        // one tile costs at least BC iterations of the value loop: the chunk stays within 65,535
        CHECK(std::uint64_t{chunk} / t.bc * (t.bc + 1) < 65535);
        CHECK((16384 + chunk - 1) / chunk <= 1000);  // dispatch.cpp's cap on dispatches per call
    }
    // With a GPU's tiles forced onto the CPU device the chunk follows those tiles.
    const device_info as_gpu = flash_tiles_device(f[4].info, &f[0].info);
    CHECK(as_gpu.type == device_type::discrete_gpu);
    CHECK(as_gpu.max_shared_memory == 32768);  // the real device's limit
    const std::uint32_t forced = flash_chunk_keys(f[4].info, f[4].control, 16384, 64, 64, 0, &f[0].info);
    CHECK(forced < 16384);
    CHECK(forced % choose_flash_tiles(as_gpu, 16384, 64, 64, f[4].control).bc == 0);
}
