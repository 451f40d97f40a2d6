// The arithmetic of context parallelism, shared by the ring, the all-gather and the sharded cache:
// which blocks (a range of query rows against a range of key rows) the causal rule and the window
// leave anything in, the block's place in the sequence (its position_offset), its slice of the
// masks, the stored form in which K and V travel, and the float64 merge of the partials. No MPI
// here. Internal.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "mpi/channel.hpp"
#include "qkv/mpi/backend.hpp"
#include "qkv/mpi/layout.hpp"
#include "qkv/runtime/element_type.hpp"
#include "qkv/runtime/sdpa.hpp"

namespace qkv::mpi::detail {

/// The whole problem, as every rank sees it.
struct whole {
    sdpa_shape shape{};      ///< q_len = L, kv_len = S: the whole sequence
    sdpa_options options{};  ///< the caller's
    std::int64_t off = 0;    ///< causal_offset(shape, options): query i at key position i + off
    std::span<const std::uint8_t> mask{};
    std::span<const float> additive{};
    std::array<std::size_t, 4> mask_dims{};  ///< (B, Hq, L, S) broadcast dims of the masks, when given
    /// The key position of the masks' column 0 (a sharded cache's rank receives its columns only).
    std::size_t mask_first_key = 0;
    std::span<const float> sinks{};
    element_type wire = element_type::f32;  ///< how K and V travel (the backend's storage)

    [[nodiscard]] bool has_mask() const { return !mask.empty() || !additive.empty(); }
};

/// `w` with mask_dims and off filled in from its shape, options and mask_shape.
void complete(whole& w, const std::vector<std::size_t>& mask_shape);

/// Whether some query of `q` may attend some key of `k` by the causal rule and the window
/// (exact: the keys query i may see are i + off - left ... i + off + right, and the block holds
/// every difference j - i from k.first - q.end + 1 to k.end - 1 - q.first).
[[nodiscard]] bool visible(const whole& w, row_range q, row_range k);
/// Whether some range of `queries` sees some range of `keys`.
[[nodiscard]] bool visible(const whole& w, const sequence_slice& queries, const sequence_slice& keys);

/// The stored form of a rank's K and V: for each range of `keys`, K (B, Hkv, n, E) then V
/// (B, Hkv, n, Ev), as w.wire (qkv::quantize: quantized once, here).
[[nodiscard]] std::size_t kv_bytes(const whole& w, const sequence_slice& keys);
[[nodiscard]] shared_bytes encode_kv(const whole& w, std::span<const float> k, std::span<const float> v,
                                     const sequence_slice& keys);
/// The values a stored form holds, per range: k (B, Hkv, n, E), v (B, Hkv, n, Ev).
struct kv_values {
    row_range rows;
    std::vector<float> k, v;
};
[[nodiscard]] std::vector<kv_values> decode_kv(const whole& w, const bytes& stored, const sequence_slice& keys);

/// Query rows of range `index` of `queries` out of a rank's local q (B, Hq, rows, E), contiguous.
[[nodiscard]] std::vector<float> range_rows(std::span<const float> local, std::size_t outer, std::size_t width,
                                            const sequence_slice& slice, std::size_t index);

/// The block problem of query rows `q` against key rows `k` (data contiguous, k and v may be empty
/// for a shard): options.return_lse, position_offset = q.first + off - k.first, no sinks, no
/// weights, the masks' block. Keeps the block masks it makes.
class block_problem {
public:
    block_problem(const whole& w, row_range q, std::span<const float> q_rows, row_range k,
                  std::span<const float> k_rows, std::span<const float> v_rows);
    [[nodiscard]] const sdpa_problem& problem() const { return p_; }

private:
    sdpa_problem p_;
    std::vector<std::uint8_t> mask_;
    std::vector<float> additive_;
};

/// The merge of one range of query rows, float64: out (B, Hq, n, Ev), lse (B, Hq, n), starting
/// from nothing (zeros, -inf); parts merged in the order given (qkv::merge_attention's rule).
class merged_rows {
public:
    merged_rows(const whole& w, std::size_t rows);
    void merge(std::span<const double> out, std::span<const double> lse);
    void merge(const sdpa_output_f64& part) { merge(part.output, part.lse); }
    /// With the sinks applied (once), rounded to float32: written into the local (B, Hq, Lr, Ev)
    /// output and (B, Hq, Lr) lse (when not empty) at local row `at`.
    void finish(std::size_t local_rows, std::size_t at, std::vector<float>& out, std::vector<float>& lse) const;
    [[nodiscard]] const std::vector<double>& out() const { return out_; }
    [[nodiscard]] const std::vector<double>& lse() const { return lse_; }
    [[nodiscard]] std::size_t rows() const { return rows_; }

private:
    merge_shape shape_;
    std::size_t rows_;
    std::vector<double> out_, lse_, sinks_;
};

/// `n` bytes of `v` after `out`, little-endian; and back, from `in` at `at` (advanced past them).
void put_le(bytes& out, std::uint64_t v, std::size_t n);
[[nodiscard]] std::uint64_t get_le(const bytes& in, std::size_t& at, std::size_t n);

/// The shape and the options as bytes, every field by the field lists (visit_shape, qkv::to_bytes),
/// none by name: what a rank tells the others of a problem (the decode step's header) and what
/// their fingerprints compare.
[[nodiscard]] bytes problem_bytes(const sdpa_shape& shape, const sdpa_options& options);
[[nodiscard]] std::size_t problem_bytes_size();
/// The shape and options problem_bytes wrote, from `in` at byte `at` (advanced past them).
void problem_from_bytes(const bytes& in, std::size_t& at, sdpa_shape& shape, sdpa_options& options);

/// The fingerprint of what every rank must agree on.
void add_problem(fingerprint& fp, const sdpa_shape& shape, const sdpa_options& options,
                 const std::vector<std::size_t>& mask_shape, std::span<const std::uint8_t> mask,
                 std::span<const float> additive, std::span<const float> sinks);

/// Bytes of float64 values, and back.
[[nodiscard]] shared_bytes to_bytes(std::span<const double> a, std::span<const double> b = {});
[[nodiscard]] shared_bytes to_bytes(std::span<const float> a);
void from_bytes(const bytes& in, std::size_t at, std::span<double> out);
void from_bytes(const bytes& in, std::size_t at, std::span<float> out);

}  // namespace qkv::mpi::detail
