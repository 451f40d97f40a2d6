// qkv::mpi on a qkv::vulkan::context (qkv/mpi/vulkan.hpp).
#include "qkv/mpi/vulkan.hpp"

#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "mpi/failure.hpp"
#include "qkv/mpi/error.hpp"
#include "qkv/runtime/error.hpp"
#include "qkv/vulkan/error.hpp"
#include "qkv/vulkan/kv_cache.hpp"

namespace qkv::mpi {
namespace {

/// The Vulkan backend's errors travel between ranks as themselves (failure.hpp), derived types
/// before their bases. Registered once, when this library is loaded, and again (a no-op) by
/// every vulkan_backend, for a static link that would leave the initialiser out.
bool register_vulkan_failures() {
    static const bool done = [] {
        namespace vk = qkv::vulkan;
        using detail::kind_of;
        for (const detail::failure_kind& k :
             {kind_of<vk::no_matching_device>(11), kind_of<vk::unavailable>(10), kind_of<vk::limit_exceeded>(12),
              kind_of<vk::out_of_memory>(13), kind_of<vk::numeric_overflow>(14), kind_of<vk::device_lost>(15),
              kind_of<vk::error>(16)})
            detail::register_failure_kind(k);
        return true;
    }();
    return done;
}
[[maybe_unused]] const bool vulkan_failures_registered = register_vulkan_failures();

void detail_check(int size_rc, int rank_rc) {
    if (size_rc != MPI_SUCCESS || rank_rc != MPI_SUCCESS)
        throw qkv::mpi::error("qkv::mpi::sdpa: MPI_Comm_size or MPI_Comm_rank failed on the communicator");
}

sdpa_output_f64 widen(const sdpa_output& o) {
    sdpa_output_f64 r;
    r.output.assign(o.output.begin(), o.output.end());
    r.lse.assign(o.lse.begin(), o.lse.end());
    r.shape = o.shape;
    r.kernel = o.kernel;
    r.device = o.device;
    return r;
}

/// A shard as a qkv::vulkan::kv_cache on the device.
class vulkan_shard final : public kv_shard {
public:
    // The cache stores the shard's type; the rows it is given are that type's values, so storing
    // them again (quantizing on append) keeps them exactly.
    vulkan_shard(qkv::vulkan::context& ctx, const kv_layout& layout) : ctx_(&ctx), cache_(ctx, layout) {}

    void append(std::span<const float> k, std::span<const float> v, std::size_t rows) override {
        cache_.append(k, v, rows);
    }

    sdpa_output_f64 partial(const sdpa_problem& queries) override {
        sdpa_problem p = queries;
        p.shape.kv_len = cache_.size();
        return widen(ctx_->sdpa(p, cache_));
    }

    std::size_t size() const override { return cache_.size(); }

private:
    qkv::vulkan::context* ctx_;
    qkv::vulkan::kv_cache cache_;
};

}  // namespace

vulkan_backend::vulkan_backend(qkv::vulkan::context& ctx) : ctx_(&ctx) { (void)register_vulkan_failures(); }

std::string vulkan_backend::name() const { return ctx_->device().name; }

sdpa_output_f64 vulkan_backend::partial(const sdpa_problem& block) { return widen(ctx_->sdpa(block)); }

std::unique_ptr<kv_shard> vulkan_backend::make_shard(const kv_layout& layout) {
    return std::make_unique<vulkan_shard>(*ctx_, layout);
}

cp_output sdpa(MPI_Comm comm, qkv::vulkan::context& ctx, const cp_problem& description,
               const qkv::vulkan::sdpa_tensors& tensors, const cp_options& options) {
    // MPI moves host memory: the tensors come down, the output goes back up. Each step is agreed,
    // so that a bad tensor on one rank fails every rank.
    std::vector<float> q, k, v;
    std::exception_ptr failure;
    try {
        const sdpa_shape& s = description.shape;
        int ranks = 1, rank = 0;
        detail_check(MPI_Comm_size(comm, &ranks), MPI_Comm_rank(comm, &rank));
        const std::size_t rows = slice_of(s.q_len, ranks, rank, options.slicing).rows();
        const std::size_t out_values = s.batch * s.q_heads * rows * s.d_v;
        if (out_values > 0 && (!tensors.out || tensors.out->elements() != out_values))
            throw qkv::invalid_argument("qkv::mpi::sdpa: tensors.out must hold this rank's (B, Hq, rows, Ev) = " +
                                        std::to_string(out_values) + " values");
        if (tensors.q) q = tensors.q->download();
        if (tensors.k) k = tensors.k->download();
        if (tensors.v) v = tensors.v->download();
    } catch (...) {
        failure = std::current_exception();
    }
    agree(comm, failure, options.comm);
    cp_problem p = description;
    p.q = q;
    p.k = k;
    p.v = v;
    vulkan_backend compute(ctx);
    cp_output out = sdpa(comm, compute, p, options);
    try {
        if (!out.output.empty()) tensors.out->upload(out.output);
    } catch (...) {
        failure = std::current_exception();
    }
    agree(comm, failure, options.comm);
    return out;
}

}  // namespace qkv::mpi
