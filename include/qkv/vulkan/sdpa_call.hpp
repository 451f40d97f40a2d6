// qkv::vulkan::sdpa_call: scaled_dot_product_attention planned once and run many times over device
// tensors (qkv/vulkan/tensor.hpp), with nothing crossing to the host that the caller did not ask
// for; qkv/vulkan/interop.hpp records it into a caller's command buffer, qkv/vulkan/sequence.hpp
// into a sequence of qkv's.
#pragma once

#include <memory>

#include "qkv/runtime/sdpa.hpp"
#include "qkv/vulkan/context.hpp"
#include "qkv/vulkan/export.hpp"
#include "qkv/vulkan/tensor.hpp"

namespace qkv::vulkan {

class kv_cache;

/// The tensors of one sdpa_call run or recording. Shapes as sdpa_problem's: q (B, Hq, L, E),
/// k (B, Hkv, S, E), v (B, Hkv, S, Ev), out (B, Hq, L, Ev) f32; 3-D and 2-D shapes are B = 1
/// (and H = 1), as on the host. q is f32 with precision fp32 and f16 with fp16; k and v are of
/// stored_kv_type(options): as q, or the options' kv_type (f32, f16, or ggml's q8_0 / q4_0
/// blocks). Against a kv_cache, k and v stay null. lse (B, Hq, L) and weights (B, Hq, L, S), f32,
/// where the options return them (and only then).
struct sdpa_tensors {
    const tensor* q = nullptr;
    const tensor* k = nullptr;
    const tensor* v = nullptr;
    tensor* out = nullptr;
    tensor* lse = nullptr;      ///< options.return_lse: each row's log-sum-exp
    tensor* weights = nullptr;  ///< options.return_weights: the attention probabilities
};

/// scaled_dot_product_attention planned once for a shape, options and masks, then run (or, with
/// interop.hpp, recorded into a caller's command buffer) many times over tensors: kernels chosen,
/// pipelines built and the masks placed on the device when it is made.
class QKV_VULKAN_API sdpa_call {
public:
    /// `description` as for context::sdpa, its q, k and v spans empty (the data comes as tensors
    /// at run time). Its masks (mask, additive_mask, mask_shape) and its sinks are host data, read
    /// (copied) now and kept with the plan: changing the caller's arrays afterwards changes nothing.
    /// The pipelines the plan needs are built now too. Throws as context::sdpa would before any
    /// work.
    sdpa_call(context& ctx, const sdpa_problem& description);
    /// Decode against `cache` (kept by reference: it must outlive the call): K and V are the
    /// cache's rows when the call runs (shape.kv_len 0: the cache's size then).
    sdpa_call(context& ctx, const sdpa_problem& description, kv_cache& cache);
    ~sdpa_call();
    sdpa_call(sdpa_call&&) noexcept;
    sdpa_call& operator=(sdpa_call&&) noexcept;
    sdpa_call(const sdpa_call&) = delete;
    sdpa_call& operator=(const sdpa_call&) = delete;

    /// Thread-safe: runs and recordings of one call from several threads are serialised by the
    /// device's lock, each run checked before the next begins.
    /// Runs over `tensors` on the context's queue and waits: nothing crosses to the host. The
    /// overflow rule holds as on the host path: finite inputs give the right finite answer or
    /// numeric_overflow (checked on the device, reported here). Throws qkv::invalid_argument for
    /// tensors whose element counts or types do not match the description (a tensor's shape is
    /// its own: (L, E) serves for (1, 1, L, E); its elements are read in the description's order).
    void run(const sdpa_tensors& tensors);

    /// The kernel family that runs (decode or fused).
    [[nodiscard]] kernel_family kernel() const;

    struct impl;

private:
    friend struct sdpa_call_access;
    sdpa_call(context& ctx, const sdpa_problem& description, kv_cache* cache);
    std::unique_ptr<impl> impl_;
};

}  // namespace qkv::vulkan
