// The fused kernel's per-device tile choice (src/kernels/flash_tiles.cpp), a pure function of the device
// description, against the fake devices of support/fake_devices.hpp: discrete GPUs with subgroups of
// 32 and 64, an integrated GPU, a CPU implementation, and the smallest device the Vulkan spec allows.
// No Vulkan device needed.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/flash_tiles.hpp"
#include "support/catch.hpp"
#include "support/fake_devices.hpp"

using qkv::vulkan::device_info;
using qkv::vulkan::device_type;
using qkv::vulkan::detail::choose_flash_tiles;
using qkv::vulkan::detail::flash_chunk_keys;
using qkv::vulkan::detail::flash_tiles;
using qkv::vulkan::detail::flash_tiles_device;

namespace {

namespace fd = qkv::test;
using fake = fd::fake_device;
using fd::fake_devices;

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
    // At least 4 keys per tile; the widest heads (MLA's 576 / 512) on the 16 KiB minimum: fewer.
    CHECK(t.bc >= (d <= 256 && dv <= 256 ? 4u : 1u));
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
    for (const fake& f : fake_devices())
        for (std::uint32_t d : {1u, 3u, 16u, 64u, 80u, 100u, 128u, 256u, 320u, 576u})
            for (std::uint32_t dv : {1u, 5u, 64u, 100u, 256u, 512u, 576u})
                for (std::uint32_t seq : {1u, 17u, 300u, 4096u})
                    check_valid(f, choose_flash_tiles(f.info, seq, d, dv, f.control), d, dv);
}

TEST_CASE("fused tiles follow the device: GPUs get 128-256 invocations in subgroup-sized teams", "[flash_tiles]") {
    const auto f = fake_devices();
    const flash_tiles nv = choose_flash_tiles(f[fd::discrete_32].info, 4096, 64, 64, f[fd::discrete_32].control);
    CHECK(nv.wg == 256);
    CHECK(nv.team == 32);
    CHECK(nv.required_subgroup == 32);
    CHECK(nv.br == 32);  // 8 warps of 4 rows
    CHECK(nv.bc == 32);  // 64 keys would exceed 48 KiB
    CHECK(nv.q_regs == 0);
    const flash_tiles rdna = choose_flash_tiles(f[fd::discrete_64].info, 4096, 64, 64, f[fd::discrete_64].control);
    CHECK(rdna.wg == 256);
    CHECK(rdna.team == 32);  // wave32 where the pipeline may require it: 8 teams of 4 rows
    CHECK(rdna.required_subgroup == 32);
    CHECK(rdna.br == 32);
    CHECK(rdna.bc == 64);  // 64 KiB of LDS holds 64-key tiles
    const flash_tiles gcn =
        choose_flash_tiles(f[fd::discrete_64_only].info, 4096, 64, 64, f[fd::discrete_64_only].control);
    CHECK(gcn.wg == 256);
    CHECK(gcn.team == 64);
    CHECK(gcn.required_subgroup == 64);
    CHECK(gcn.bc == 64);  // a key per lane
    CHECK(gcn.br == 16);  // 4 waves of 4 rows
    const flash_tiles intel = choose_flash_tiles(f[fd::integrated_16].info, 4096, 64, 64, f[fd::integrated_16].control);
    CHECK(intel.wg == 128);
    CHECK(intel.team == 16);
    CHECK(intel.required_subgroup == 0);  // no size control: the shader checks the size at run time
    CHECK(intel.fallback == 1);
    const flash_tiles cpu = choose_flash_tiles(f[fd::cpu_8].info, 4096, 64, 64, f[fd::cpu_8].control);
    CHECK(cpu.wg == 64);
    CHECK(cpu.team == 8);
    CHECK(cpu.required_subgroup == 8);
    const flash_tiles small = choose_flash_tiles(f[fd::minimal].info, 4096, 256, 256, f[fd::minimal].control);
    CHECK(small.team == 32);  // unknown subgroup size: 32, with the shared-memory reductions
    CHECK(small.fallback == 1);
    CHECK(small.shared_bytes() <= 16384);
    // Short sequences: one row per team, so more workgroups share the work.
    CHECK(choose_flash_tiles(f[fd::discrete_32].info, 100, 64, 64, f[fd::discrete_32].control).rows_per_team() == 1);
    // Small heads: the queries stay in registers.
    CHECK(choose_flash_tiles(f[fd::discrete_32].info, 100, 16, 16, f[fd::discrete_32].control).q_regs == 1);
    // Wider heads take smaller tiles, never more shared memory than the device has.
    const flash_tiles wide = choose_flash_tiles(f[fd::discrete_32].info, 4096, 256, 256, f[fd::discrete_32].control);
    CHECK(wide.bc * wide.br < nv.bc * nv.br);
}

TEST_CASE("fused key chunks: every key on GPUs, bounded loop budgets on CPU devices", "[flash_tiles]") {
    const auto f = fake_devices();
    for (std::uint32_t seq : {1u, 1000u, 16384u, 65536u}) {
        CHECK(flash_chunk_keys(f[fd::discrete_32].info, f[fd::discrete_32].control, seq, 64, 64) == seq);
        CHECK(flash_chunk_keys(f[fd::integrated_16].info, f[fd::integrated_16].control, seq, 256, 256) == seq);
        CHECK(flash_chunk_keys(f[fd::discrete_32].info, f[fd::discrete_32].control, seq, 64, 64, 37) ==
              std::min(seq, 37u));
    }
    for (std::uint32_t d : {1u, 64u, 256u}) {
        const flash_tiles t = choose_flash_tiles(f[fd::cpu_8].info, 16384, d, d, f[fd::cpu_8].control);
        const std::uint32_t chunk = flash_chunk_keys(f[fd::cpu_8].info, f[fd::cpu_8].control, 16384, d, d);
        INFO("d " << d << " chunk " << chunk);
        CHECK(chunk < 16384);
        CHECK(chunk % t.bc == 0);
        // one tile costs at least BC iterations of the value loop: the chunk stays within 65,535
        CHECK(std::uint64_t{chunk} / t.bc * (t.bc + 1) < 65535);
        CHECK((16384 + chunk - 1) / chunk <= 1000);  // dispatch.cpp's cap on dispatches per call
    }
    // With a GPU's tiles forced onto the CPU device the chunk follows those tiles.
    const device_info as_gpu = flash_tiles_device(f[fd::cpu_8].info, &f[fd::discrete_32].info);
    CHECK(as_gpu.type == device_type::discrete_gpu);
    CHECK(as_gpu.max_shared_memory == 32768);  // the real device's limit
    const std::uint32_t forced =
        flash_chunk_keys(f[fd::cpu_8].info, f[fd::cpu_8].control, 16384, 64, 64, 0, &f[fd::discrete_32].info);
    CHECK(forced < 16384);
    CHECK(forced % choose_flash_tiles(as_gpu, 16384, 64, 64, f[fd::cpu_8].control).bc == 0);
}
