// What the tests of the backends compare with: the CPU backend on a ragged or paged batch against
// the tests' own float64 reference (support/ragged_reference.hpp), and the device's dense, ragged and
// paged calls against the CPU backend's float64 result from the values the device computes with.
#pragma once

#include <qkv/runtime/cpu.hpp>
#include <qkv/runtime/element_type.hpp>
#include <qkv/runtime/varlen.hpp>

#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

#include "support/catch.hpp"
#include "support/ragged_reference.hpp"
#include "support/reference.hpp"

namespace qkv_test {

/// qkv's CPU backend on `p` (a varlen_problem or paged_problem) against the tests' reference `want`
/// of it: float64 finite and within nmse 1e-24, lse -inf exactly where want's is and the rest within
/// 1e-12, the float32 form the float64 values rounded once.
template <class Problem>
void check_cpu_backend(const Problem& p, const ragged_ref_result& want) {
    const qkv::varlen_output_f64 got = qkv::cpu::sdpa_f64(p);
    REQUIRE(got.output.size() == want.output.size());
    for (const double x : got.output) REQUIRE(std::isfinite(x));
    CHECK(nmse(got.output, want.output) <= 1e-24);
    if (p.options.return_lse) {
        REQUIRE(got.lse.size() == want.lse.size());
        for (std::size_t i = 0; i < want.lse.size(); ++i) {
            INFO("lse " << i);
            if (std::isinf(want.lse[i]))
                CHECK(got.lse[i] == want.lse[i]);
            else
                CHECK(std::abs(got.lse[i] - want.lse[i]) <= 1e-12);
        }
    }
    const qkv::varlen_output f = qkv::cpu::sdpa(p);
    REQUIRE(f.output.size() == got.output.size());
    for (std::size_t i = 0; i < f.output.size(); ++i) REQUIRE(f.output[i] == static_cast<float>(got.output[i]));
}

/// The float64 reference of what the device computes for `p` (a qkv::sdpa_problem, varlen_problem
/// or paged_problem): Q through float16 for precision fp16, K and V through the type the device
/// stores them in (the CPU backend round-trips them for an explicit kv_type).
template <class Problem>
auto device_reference(const Problem& p) {
    Problem r = p;
    std::vector<float> q;
    if (p.options.precision == qkv::precision::fp16) {
        q = qkv::round_trip(qkv::element_type::f16, p.q);
        r.q = q;
    }
    r.options.kv_type = qkv::stored_kv_type(p.options);
    return qkv::cpu::sdpa_f64(r);
}

/// lse: -inf exactly where the reference has -inf, the finite ones close.
inline void check_lse(const std::vector<float>& got, const std::vector<double>& want, double tolerance) {
    REQUIRE(got.size() == want.size());
    std::vector<float> g;
    std::vector<double> w;
    std::size_t wrong_inf = 0;
    for (std::size_t i = 0; i < want.size(); ++i) {
        if (want[i] == -std::numeric_limits<double>::infinity()) {
            wrong_inf += got[i] != -std::numeric_limits<float>::infinity();
            continue;
        }
        g.push_back(got[i]);
        w.push_back(want[i]);
    }
    CHECK(wrong_inf == 0);
    const double e = nmse(g, w);
    INFO("lse nmse " << e);
    CHECK(e <= tolerance);
}

/// A ragged or paged batch's packed output (finite) and lse against the reference at `tolerance`
/// (float32's 1e-9 unless a case says otherwise).
inline void check_packed(const qkv::varlen_output& got, const qkv::varlen_output_f64& want, double tolerance = 1e-9) {
    REQUIRE(got.output.size() == want.output.size());
    for (const float x : got.output) REQUIRE(std::isfinite(x));
    const double e = nmse(got.output, want.output);
    INFO("output nmse " << e);
    CHECK(e <= tolerance);
    check_lse(got.lse, want.lse, tolerance);
}

}  // namespace qkv_test
