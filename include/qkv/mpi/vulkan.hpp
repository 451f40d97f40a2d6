// qkv::mpi on Vulkan devices: each rank computes on its own qkv::vulkan::context (any device:
// ranks may mix vendors). Available when qkv::mpi is built with qkv::vulkan.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

#include "qkv/mpi/backend.hpp"
#include "qkv/mpi/export.hpp"
#include "qkv/mpi/sdpa.hpp"
#include "qkv/vulkan/context.hpp"
#include "qkv/vulkan/sdpa_call.hpp"

namespace qkv::mpi {

/// Runs each block with context::sdpa (q, K and V uploaded from host memory, the output and lse
/// downloaded: Vulkan has no GPU-direct MPI transport), and each shard of a sharded cache as a
/// qkv::vulkan::kv_cache on the device. K and V are stored as stored_kv_type(options) says.
class QKV_MPI_API vulkan_backend final : public backend {
public:
    /// `ctx` is kept by reference: it must outlive the backend (and the shards it makes).
    explicit vulkan_backend(qkv::vulkan::context& ctx);
    [[nodiscard]] std::string name() const override;
    [[nodiscard]] sdpa_output_f64 partial(const sdpa_problem& block) override;
    [[nodiscard]] std::unique_ptr<kv_shard> make_shard(const kv_layout& layout) override;

private:
    qkv::vulkan::context* ctx_;
};

/// Context-parallel sdpa over this rank's device tensors: q (B, Hq, Lr, E), k (B, Hkv, Sr, E),
/// v (B, Hkv, Sr, Ev), out (B, Hq, Lr, Ev), f32 (the problem's q, k and v spans stay empty). They
/// are downloaded, the call runs as sdpa() above, and out is uploaded (MPI moves host memory);
/// returns the same cp_output (its output vector too). A rank with no rows passes null tensors.
[[nodiscard]] QKV_MPI_API cp_output sdpa(MPI_Comm comm, qkv::vulkan::context& ctx, const cp_problem& description,
                                         const qkv::vulkan::sdpa_tensors& tensors, const cp_options& options = {});

}  // namespace qkv::mpi
