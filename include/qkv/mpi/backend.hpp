// What computes on each rank: a qkv::mpi::backend runs the partial attention of one block (a
// range of query rows against a range of key rows of the whole sequence) and holds the shards of
// a sharded K/V cache. qkv::mpi::cpu_backend runs the float64 CPU reference backend;
// qkv::mpi::vulkan_backend (qkv/mpi/vulkan.hpp) a qkv::vulkan::context. A program may bring its own.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>

#include "qkv/mpi/export.hpp"
#include "qkv/runtime/element_type.hpp"
#include "qkv/runtime/kv_layout.hpp"
#include "qkv/runtime/sdpa.hpp"

namespace qkv::mpi {

/// The rows of a sharded cache held by one rank.
class QKV_MPI_API kv_shard {
public:
    virtual ~kv_shard();
    /// Appends `rows` rows: k (B, Hkv, rows, E) and v (B, Hkv, rows, Ev) hold values of the shard's
    /// type exactly (dequantized stored form), so storing them as that type loses nothing.
    virtual void append(std::span<const float> k, std::span<const float> v, std::size_t rows) = 0;
    /// The partial attention of `queries` (k and v empty, shape.kv_len = size()) against the rows
    /// held, as backend::partial.
    [[nodiscard]] virtual sdpa_output_f64 partial(const sdpa_problem& queries) = 0;
    [[nodiscard]] virtual std::size_t size() const = 0;
};

class QKV_MPI_API backend {
public:
    virtual ~backend();
    /// Who computes, for people ("cpu reference", the Vulkan device's name).
    [[nodiscard]] virtual std::string name() const = 0;
    /// How this backend stores K and V for a call with `options` (and so the form in which they
    /// travel between ranks: quantized once, where they originate). Default: stored_kv_type.
    [[nodiscard]] virtual element_type kv_storage(const sdpa_options& options) const;
    /// One block's partial result: `block` is an sdpa_problem over a range of query rows and a
    /// range of key rows, with options.return_lse set, options.position_offset set (the block's
    /// place in the whole sequence), no sinks and no weights; its k and v hold values of
    /// kv_storage(options) exactly. Returns the output and the lse (as sdpa_output_f64).
    [[nodiscard]] virtual sdpa_output_f64 partial(const sdpa_problem& block) = 0;
    /// A shard of a sharded K/V cache: `layout.capacity` rows of K and V per (batch, kv head) on
    /// this rank, stored as `layout.type` says.
    [[nodiscard]] virtual std::unique_ptr<kv_shard> make_shard(const kv_layout& layout) = 0;
};

/// The float64 CPU reference backend (qkv::cpu::sdpa_f64): K and V travel as options.kv_type
/// says, or as float32 without one (the CPU backend ignores `precision`).
class QKV_MPI_API cpu_backend final : public backend {
public:
    [[nodiscard]] std::string name() const override;
    [[nodiscard]] element_type kv_storage(const sdpa_options& options) const override;
    [[nodiscard]] sdpa_output_f64 partial(const sdpa_problem& block) override;
    [[nodiscard]] std::unique_ptr<kv_shard> make_shard(const kv_layout& layout) override;
};

}  // namespace qkv::mpi
