// Context-parallel scaled dot-product attention: the query and key rows of one long sequence are
// spread over the ranks of an MPI communicator (qkv/mpi/layout.hpp); each rank passes its own
// slice of Q, K and V and gets back the attention output of its own query rows (and their lse),
// as the single-process qkv::cpu::sdpa / qkv::vulkan::context::sdpa of the whole would give them.
//
//   qkv::mpi::environment mpi(argc, argv);
//   const auto qs = qkv::mpi::slice_of(L, size, rank, qkv::mpi::layout::zigzag);
//   const auto ks = qkv::mpi::slice_of(S, size, rank, qkv::mpi::layout::zigzag);
//   qkv::mpi::cp_problem p{.shape = whole_shape,               // q_len = L, kv_len = S: the whole
//                          .q = my_q, .k = my_k, .v = my_v,     // (B, Hq, qs.rows(), E), ...
//                          .options = {.causal = true}};
//   qkv::vulkan::context gpu;
//   qkv::mpi::vulkan_backend compute(gpu);                      // or qkv::mpi::cpu_backend
//   qkv::mpi::cp_output o = qkv::mpi::sdpa(MPI_COMM_WORLD, compute, p, {.mode = qkv::mpi::cp_mode::ring});
//   // o.output: (B, Hq, qs.rows(), Ev), my query rows; o.stats: compute, communication, overlap
//
// Every partial is an sdpa call of the backend over a block (query rows of one range, keys of
// one range) with return_lse and the block's position in the sequence (options.position_offset),
// so causal (both alignments), windows and ALiBi measure global distances; the partials of a
// query row are merged by their log-sum-exp (qkv::merge_attention's rule, in float64) in a fixed
// order, and the sinks are applied once, after the last merge. Blocks that the causal rule or the
// window hide entirely are neither computed nor sent.
//
// Modes:
//   ring       K/V blocks travel around the ring r -> r + 1: at step t rank r computes its
//              queries against the block of rank r - t while it sends that block on and
//              receives the next (non-blocking, on a worker thread's compute). R - 1 steps;
//              each rank sends and receives (R - 1) / R of K and V at most.
//   allgather  the queries travel instead: each rank's queries go to the ranks whose keys they
//              see, each computes their partial against its own keys and sends it back; the owner
//              merges them in rank order. For decode and short queries (L·Hq small beside
//              S·Hkv): bytes per rank ~ (L / R)·Hq·(E + 2·(Ev + 1))·(R - 1) instead of ring's
//              (S / R)·Hkv·(E + Ev)·(R - 1).
// The merge order is fixed (ring: the ring's order; allgather: rank order), so equal inputs on an
// equal number of ranks give identical bits on every run.
//
// Data crosses ranks through host memory (Vulkan has no GPU-direct transport in MPI): a Vulkan
// backend uploads each block it computes. docs/distributed.md has the costs.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "qkv/mpi/backend.hpp"
#include "qkv/mpi/collective.hpp"
#include "qkv/mpi/export.hpp"
#include "qkv/mpi/layout.hpp"
#include "qkv/runtime/sdpa.hpp"

namespace qkv::mpi {

enum class cp_mode { ring, allgather };

/// "ring" or "allgather".
[[nodiscard]] QKV_MPI_API std::string to_string(cp_mode mode);

struct cp_options {
    cp_mode mode = cp_mode::ring;
    layout slicing = layout::zigzag;  ///< how the caller cut Q and K/V (the same for both)
    comm_options comm{};              ///< the timeout of every wait
};

/// One rank's part of a context-parallel call.
struct cp_problem {
    /// The whole problem: q_len = L and kv_len = S are the whole sequence's, on every rank.
    sdpa_shape shape{};
    /// This rank's rows (slice_of(L or S, ranks, rank, options.slicing)): q (B, Hq, Lr, E),
    /// k (B, Hkv, Sr, E), v (B, Hkv, Sr, Ev); empty where the rank holds no rows.
    std::span<const float> q{}, k{}, v{};
    /// The whole masks (broadcasting to (B, Hq, L, S), as sdpa_problem's), the same on every rank.
    std::span<const std::uint8_t> mask{};
    std::span<const float> additive_mask{};
    std::vector<std::size_t> mask_shape{};
    /// As sdpa_problem's; return_lse returns this rank's lse; return_weights is refused.
    sdpa_options options{};
    /// Empty, or one logit per query head (the same on every rank): applied once, after merging.
    std::span<const float> sinks{};
    /// Where every rank holds the same whole inputs and passes each its slice (the qkv tool reads
    /// whole files on every rank), a checksum of those whole inputs (qkv::mpi::checksum of q, k,
    /// v): it joins the fingerprint the ranks agree on, so ranks given different contents (the
    /// same file names and shapes, other bytes) fail on every rank with qkv::invalid_argument
    /// instead of mixing them. 0: none given. The slices themselves differ from rank to rank, so
    /// qkv::mpi cannot compare them; the masks and sinks, replicated, are always compared whole.
    std::uint64_t inputs_checksum = 0;
};

/// A checksum of `values`' bytes (64-bit, FNV-1a over 8-byte words), continuing from `seed`:
/// checksum(v, checksum(k, checksum(q))) for cp_problem::inputs_checksum. Never 0.
[[nodiscard]] QKV_MPI_API std::uint64_t checksum(std::span<const float> values, std::uint64_t seed = 0);

/// What one rank did in one call. Times are host milliseconds; the transfer times are observed by
/// polling (every ~0.1 ms), so they are upper bounds by that much.
struct cp_stats {
    int rank = 0, ranks = 1;
    std::size_t steps = 0;            ///< ring steps (or allgather rounds) this rank took part in
    std::size_t blocks_computed = 0;  ///< partial sdpa calls run here
    std::size_t blocks_skipped = 0;   ///< blocks of this rank's queries hidden by causal / window
    double compute_ms = 0;            ///< in the backend's partial calls and the merges
    double comm_ms = 0;               ///< while transfers of this rank were in flight, summed per step
    double exposed_ms = 0;            ///< of comm_ms: waiting with nothing left to compute
    double agreement_ms = 0;          ///< in the agreements that begin and end the call
    double total_ms = 0;              ///< the whole call
    std::uint64_t bytes_sent = 0, bytes_received = 0;
    /// The share of communication hidden behind compute: 1 - exposed_ms / comm_ms (1 without any).
    [[nodiscard]] double overlap() const { return comm_ms > 0 ? 1.0 - exposed_ms / comm_ms : 1.0; }
};

struct cp_output {
    std::vector<float> output;  ///< (B, Hq, Lr, Ev): this rank's query rows
    std::vector<float> lse;     ///< (B, Hq, Lr) when options.return_lse; sinks not included
    std::string device;         ///< the backend's name
    cp_stats stats;
};

/// Context-parallel sdpa (above). Collective over `comm`: every rank calls it with the same shape,
/// options, masks and sinks (checked), its own slices, and its own backend. Throws on every rank
/// (see error.hpp): qkv::invalid_argument for a bad problem on any rank (as qkv::validate, plus
/// slices that do not fit slice_of, return_weights, ranks that disagree on the call), the
/// backend's errors, qkv::mpi::timeout.
[[nodiscard]] QKV_MPI_API cp_output sdpa(MPI_Comm comm, backend& compute, const cp_problem& problem,
                                         const cp_options& options = {});

/// Every rank's stats, on `root` (empty elsewhere). Collective, agreed.
[[nodiscard]] QKV_MPI_API std::vector<cp_stats> gather_stats(MPI_Comm comm, const cp_stats& mine, int root = 0,
                                                             const comm_options& options = {});

}  // namespace qkv::mpi
