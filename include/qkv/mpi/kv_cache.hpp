// A K/V cache sharded across the ranks of a communicator, for decoding past one device's memory:
// rank r holds rows [r·capacity, r·capacity + its size) of the sequence (capacity: the layout's,
// each rank's), appends fill
// the ranks in turn (rank 0 first), and a decode step sends q from the rank that asks (`root`) to
// every rank holding rows it may see, computes the partials there and merges them on root.
//
//   qkv::mpi::cpu_backend compute;   // or qkv::mpi::vulkan_backend (a kv_cache on each device)
//   qkv::mpi::sharded_kv_cache cache(MPI_COMM_WORLD, compute,
//                                    {.kv_heads = 8, .capacity = 1 << 20, .d_qk = 128, .d_v = 128});
//   cache.append(k_new, v_new, 1);                  // every rank calls it; k, v read on root
//   qkv::sdpa_output o = cache.decode(problem);     // every rank calls it; q read and o filled on root
//
// Every member that communicates is collective over the communicator (each rank calls it, in the
// same order) and agreed: it returns on every rank or throws the same error on every rank
// (error.hpp). K and V are quantized once, on root, to the cache's type; what travels is that
// stored form. The cache holds a duplicate of the communicator: destroy it before MPI_Finalize.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <memory>
#include <span>

#include "qkv/mpi/backend.hpp"
#include "qkv/mpi/collective.hpp"
#include "qkv/mpi/export.hpp"
#include "qkv/mpi/layout.hpp"
#include "qkv/mpi/sdpa.hpp"
#include "qkv/runtime/kv_layout.hpp"
#include "qkv/runtime/sdpa.hpp"

namespace qkv::mpi {

class QKV_MPI_API sharded_kv_cache {
public:
    /// Collective: each rank makes its shard on `compute` (kept by reference: it must outlive the
    /// cache). Throws on every rank if any rank cannot (qkv::invalid_argument for a zero
    /// dimension, the backend's errors).
    /// `layout.capacity` is each rank's: the cache holds ranks · capacity rows.
    sharded_kv_cache(MPI_Comm comm, backend& compute, const kv_layout& layout, int root = 0,
                     const comm_options& options = {});
    ~sharded_kv_cache();
    sharded_kv_cache(sharded_kv_cache&&) noexcept;
    sharded_kv_cache& operator=(sharded_kv_cache&&) noexcept;
    sharded_kv_cache(const sharded_kv_cache&) = delete;
    sharded_kv_cache& operator=(const sharded_kv_cache&) = delete;

    /// Collective: appends `rows` rows (the same `rows` on every rank) after the last, filling
    /// the ranks in turn. k (B, Hkv, rows, E) and v (B, Hkv, rows, Ev) are read on root only
    /// (other ranks pass empty spans). Throws on every rank, appending nothing: qkv::invalid_argument
    /// for spans that do not fit, `rows` that differ between ranks, more rows than the cache has
    /// room for, or a value the cache's type cannot store (qkv::quantize's refusals). A failure
    /// of a rank's shard after others appended (a device lost) leaves the cache unusable: every
    /// later call throws qkv::mpi::error.
    void append(std::span<const float> k, std::span<const float> v, std::size_t rows);

    /// Collective: attention of root's queries against every row appended, as context::sdpa(problem,
    /// cache) of one cache holding them all. On root: `queries` as for that call (k and v empty,
    /// shape.kv_len 0 or size(); batch, kv_heads, d_qk and d_v the cache's; options.kv_type unset
    /// or the cache's type; masks over (B, Hq, L, size()); sinks applied once, after merging);
    /// return_weights and alibi_slopes (use options.alibi_max_bias) are refused. Other ranks pass
    /// any problem (it is not read). Returns the output (and lse) on root, an empty sdpa_output
    /// elsewhere.
    [[nodiscard]] sdpa_output decode(const sdpa_problem& queries);

    /// Rows appended in all (the same on every rank), the most it can hold, those held here.
    [[nodiscard]] std::size_t size() const;
    [[nodiscard]] std::size_t capacity() const;
    [[nodiscard]] std::size_t local_size() const;
    /// The global positions of the rows held here.
    [[nodiscard]] row_range local_rows() const;
    /// The layout it was made with (capacity: each rank's).
    [[nodiscard]] const kv_layout& layout() const;
    /// What this rank did in the last decode (compute, communication, bytes).
    [[nodiscard]] const cp_stats& last_stats() const;

    struct impl;

private:
    std::unique_ptr<impl> impl_;
};

}  // namespace qkv::mpi
