// What the MPI tests share: whole problems drawn from a seed (every rank draws the same), the
// single-process reference, each rank's slices, comparisons, and backends that fail on purpose.
#pragma once

#include <qkv/mpi/mpi.hpp>
#include <qkv/runtime/cpu.hpp>

#include <mpi.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "support/catch.hpp"

namespace qkv_mpi_test {

inline int world_rank() {
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}
inline int world_size() {
    int n = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    return n;
}

enum class mask_kind { none, boolean_full, boolean_rows, additive_heads };

struct spec {
    qkv::sdpa_shape shape{};
    qkv::sdpa_options options{};
    mask_kind mask = mask_kind::none;
    bool sinks = false;
    std::uint64_t seed = 1;
};

/// A whole problem that owns its data: N(0, 1) q, k, v (scores of order one at these widths),
/// masks that leave some rows empty, sinks around the scores' size.
struct whole_problem {
    spec s;
    std::vector<float> q, k, v, additive, sinks;
    std::vector<std::uint8_t> mask;
    std::vector<std::size_t> mask_shape;

    explicit whole_problem(const spec& sp) : s(sp) {
        std::mt19937_64 rng(sp.seed);
        std::normal_distribution<double> n01(0.0, 1.0);
        const auto draw = [&](std::size_t n) {
            std::vector<float> x(n);
            for (float& e : x) e = static_cast<float>(n01(rng));
            return x;
        };
        const qkv::sdpa_shape& h = sp.shape;
        q = draw(h.batch * h.q_heads * h.q_len * h.d_qk);
        k = draw(h.batch * h.kv_heads * h.kv_len * h.d_qk);
        v = draw(h.batch * h.kv_heads * h.kv_len * h.d_v);
        std::uniform_int_distribution<int> coin(0, 3);
        switch (sp.mask) {
            case mask_kind::none:
                break;
            case mask_kind::boolean_full:  // (L, S), 3/4 allowed, query row 1 sees nothing
                mask.resize(h.q_len * h.kv_len);
                for (std::size_t i = 0; i < h.q_len; ++i)
                    for (std::size_t j = 0; j < h.kv_len; ++j)
                        mask[i * h.kv_len + j] = i == 1 ? 0 : static_cast<std::uint8_t>(coin(rng) != 0);
                mask_shape = {h.q_len, h.kv_len};
                break;
            case mask_kind::boolean_rows:  // (B, 1, 1, S): a padding mask per batch element
                mask.resize(h.batch * h.kv_len);
                for (auto& e : mask) e = static_cast<std::uint8_t>(coin(rng) != 0);
                mask_shape = {h.batch, 1, 1, h.kv_len};
                break;
            case mask_kind::additive_heads:  // (Hq, L, S) float, some -inf
                additive.resize(h.q_heads * h.q_len * h.kv_len);
                for (auto& e : additive)
                    e = coin(rng) == 0 ? -std::numeric_limits<float>::infinity() : static_cast<float>(n01(rng));
                mask_shape = {h.q_heads, h.q_len, h.kv_len};
                break;
        }
        if (sp.sinks) {
            sinks = draw(h.q_heads);
            sinks.back() = -std::numeric_limits<float>::infinity();  // a head without a sink
        }
    }

    [[nodiscard]] qkv::sdpa_problem problem() const {
        qkv::sdpa_problem p{.shape = s.shape,
                            .q = q,
                            .k = k,
                            .v = v,
                            .mask = mask,
                            .additive_mask = additive,
                            .mask_shape = mask_shape,
                            .options = s.options,
                            .sinks = sinks};
        p.options.return_lse = true;
        return p;
    }

    /// This rank's part of it for qkv::mpi::sdpa (the slices are kept in `q_mine`, `k_mine`, `v_mine`).
    std::vector<float> q_mine, k_mine, v_mine;
    [[nodiscard]] qkv::mpi::cp_problem part(qkv::mpi::layout how, int ranks, int rank) {
        const qkv::sdpa_shape& h = s.shape;
        const auto qs = qkv::mpi::slice_of(h.q_len, ranks, rank, how);
        const auto ks = qkv::mpi::slice_of(h.kv_len, ranks, rank, how);
        q_mine = qkv::mpi::take_rows<float>(q, h.batch * h.q_heads, h.q_len, h.d_qk, qs);
        k_mine = qkv::mpi::take_rows<float>(k, h.batch * h.kv_heads, h.kv_len, h.d_qk, ks);
        v_mine = qkv::mpi::take_rows<float>(v, h.batch * h.kv_heads, h.kv_len, h.d_v, ks);
        qkv::mpi::cp_problem p{.shape = h,
                               .q = q_mine,
                               .k = k_mine,
                               .v = v_mine,
                               .mask = mask,
                               .additive_mask = additive,
                               .mask_shape = mask_shape,
                               .options = s.options,
                               .sinks = sinks};
        p.options.return_lse = true;
        return p;
    }
};

/// Σ(got − want)² / Σ want², over finite references; a non-finite result where the reference is
/// finite is +inf. All-zero references (every row masked) need exact zeros.
inline double nmse(const std::vector<float>& got, const std::vector<float>& want) {
    REQUIRE(got.size() == want.size());
    double num = 0, den = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
        if (!std::isfinite(want[i])) continue;
        if (!std::isfinite(got[i])) return std::numeric_limits<double>::infinity();
        const double d = static_cast<double>(got[i]) - static_cast<double>(want[i]);
        num += d * d;
        den += static_cast<double>(want[i]) * static_cast<double>(want[i]);
    }
    if (den == 0) return num == 0 ? 0 : std::numeric_limits<double>::infinity();
    return num / den;
}

/// lse: -inf exactly where the reference has -inf, else within `tol` (absolute, lse is a log).
inline void check_lse(const std::vector<float>& got, const std::vector<float>& want, double tol) {
    REQUIRE(got.size() == want.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
        INFO("lse element " << i << ": got " << got[i] << ", want " << want[i]);
        if (std::isinf(want[i])) {
            CHECK(got[i] == want[i]);
        } else {
            CHECK(std::abs(static_cast<double>(got[i]) - static_cast<double>(want[i])) <= tol);
        }
    }
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

/// Makes this rank's next MPI_Iprobe (qkv::mpi's look for failure notices) wait up to `limit` for a
/// message it matches, as a rank descheduled there would find it (slow_probe.cpp). Zero disarms.
void hold_next_probe(std::chrono::milliseconds limit);

/// A backend that fails on purpose on one rank: throws (or sleeps) at its n-th partial there.
class faulty_backend final : public qkv::mpi::backend {
public:
    enum class fault { none, throws, invalid, sleeps };
    faulty_backend(qkv::mpi::backend& inner, int rank, int at, fault f, std::chrono::milliseconds nap = {})
        : inner_(inner), mine_(world_rank() == rank), at_(at), fault_(f), nap_(nap) {}
    std::string name() const override { return "faulty " + inner_.name(); }
    qkv::element_type kv_storage(const qkv::sdpa_options& o) const override { return inner_.kv_storage(o); }
    qkv::sdpa_output_f64 partial(const qkv::sdpa_problem& block) override {
        if (mine_ && ++calls_ == at_) {  // (partial runs on a worker thread: no MPI call here)
            if (fault_ == fault::throws) throw qkv::error("injected failure in block " + std::to_string(at_));
            if (fault_ == fault::invalid) throw qkv::invalid_argument("injected bad block " + std::to_string(at_));
            if (fault_ == fault::sleeps) std::this_thread::sleep_for(nap_);
        }
        return inner_.partial(block);
    }
    std::unique_ptr<qkv::mpi::kv_shard> make_shard(const qkv::kv_layout& s) override { return inner_.make_shard(s); }

private:
    qkv::mpi::backend& inner_;
    bool mine_;
    int at_;
    fault fault_;
    std::chrono::milliseconds nap_;
    int calls_ = 0;
};

}  // namespace qkv_mpi_test
