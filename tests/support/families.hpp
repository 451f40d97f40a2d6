// The fused kernel families the Vulkan tests run every fused case with: row_tiles and block_tiles
// on any device, and coopmat (the cooperative-matrix family) where the device and this build have
// it, so that the whole parity suite runs on each family the machine can run.
// QKV_TEST_FAMILIES=coopmat (or any comma-separated list of the families' names as qkv::parse_name
// reads them: row_tiles, block_tiles, coopmat) keeps only those: the mesa26 leg runs the suites once
// more that way, for the family only Mesa 26.1's lavapipe offers (tests/CMakeLists.txt, label
// coopmat).
//
// The cooperative-matrix family multiplies float16 operands, so a case run with it is run with
// precision fp16 and judged by the fp16 bound (case_precision, case_tolerance).
#pragma once

#include <qkv/runtime/options.hpp>
#include <qkv/vulkan/context.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "support/end_of_run.hpp"
#include "support/gpu.hpp"

namespace qkv_test {

/// Whether this build has the cooperative-matrix shaders (support/build_facts.cpp).
bool coopmat_shaders_built();

/// The exit status of a test program whose QKV_TEST_FAMILIES names no family that runs here (CTest's
/// SKIP_RETURN_CODE of those entries).
inline constexpr int skipped_exit_code = 77;

/// Whether the family can run on `d` in this build: the extension usable, the shaders built, and no
/// driver gate refusing it (src/kernels/flash_coop_plan.cpp: lavapipe with vectors other than 8 lanes).
inline bool coopmat_runs(const qkv::vulkan::device_info& d) {
    if (!coopmat_shaders_built() || !d.cooperative_matrix) return false;
    const bool llvmpipe = d.driver_id == 13;  // VK_DRIVER_ID_MESA_LLVMPIPE
    return !llvmpipe || d.subgroup_size == 8;
}

/// "row_tiles family", ..., "auto family" (the runtime's names of the kernel families).
inline std::string family_name(qkv::kernel_family f) { return std::string(qkv::name_of(f)) + " family"; }

/// The families of this run on the tests' device: QKV_TEST_FAMILIES's, or row_tiles, block_tiles and
/// (where it runs) coopmat.
inline std::vector<qkv::kernel_family> fused_families() {
    std::vector<qkv::kernel_family> all{qkv::kernel_family::row_tiles, qkv::kernel_family::block_tiles};
    if (coopmat_runs(gpu().device())) all.push_back(qkv::kernel_family::coopmat);
    const char* only = std::getenv("QKV_TEST_FAMILIES");
    if (!only || !*only) return all;
    std::vector<qkv::kernel_family> kept;
    std::stringstream names(only);
    for (std::string name; std::getline(names, name, ',');) {
        const std::optional<qkv::kernel_family> named = qkv::parse_name<qkv::kernel_family>(name);
        for (const auto f : all)
            if (named == f) kept.push_back(f);
    }
    if (kept.empty()) {  // nothing of this run's families runs here: the entry is skipped (SKIP_RETURN_CODE)
        std::printf("QKV_TEST_FAMILIES=%s: no such family runs on %s in this build; skipped\n", only,
                    gpu().device().name.c_str());
        std::fflush(stdout);
        end_of_run();
        std::exit(skipped_exit_code);
    }
    return kept;
}

/// Whether `family` runs in this test run (fused_families).
inline bool family_runs(qkv::kernel_family family) {
    const auto all = fused_families();
    return std::find(all.begin(), all.end(), family) != all.end();
}

/// The precision a case asked at `asked` runs at with `family`: the cooperative-matrix family's is fp16.
inline qkv::precision case_precision(qkv::kernel_family family, qkv::precision asked) {
    return family == qkv::kernel_family::coopmat ? qkv::precision::fp16 : asked;
}

/// The bound (normalised MSE against float64) a case asked with `tolerance` is judged by with
/// `family`: the fp16 bound (1e-5) where the family stores in float16.
inline double case_tolerance(qkv::kernel_family family, double tolerance) {
    return family == qkv::kernel_family::coopmat ? std::max(tolerance, 1e-5) : tolerance;
}

}  // namespace qkv_test
