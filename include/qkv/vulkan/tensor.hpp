// Device tensors and planned calls: data that stays on the device between calls, and attention
// planned once and run many times over it, with nothing crossing to the host that the caller did
// not ask for.
//
//   qkv::vulkan::context ctx;
//   qkv::vulkan::tensor q(ctx, {1, 8, 1, 64}), k(ctx, {1, 2, 4096, 64}), v(ctx, {1, 2, 4096, 64}),
//       out(ctx, {1, 8, 1, 64});
//   q.upload(host_q);  k.upload(host_k);  v.upload(host_v);
//   qkv::vulkan::sdpa_call call(ctx, description);     // shape, options, masks: planned once
//   call.run({.q = &q, .k = &k, .v = &v, .out = &out}); // on the device; throws as the host calls do
//   std::vector<float> o = out.download();
//
// qkv/vulkan/interop.hpp adds the caller's own device, buffers and command buffers.
//
// A tensor is row-major and contiguous: `shape` outermost first, of element type f32 or f16 (the
// quantized types are the K/V cache's storage formats, kv_cache). It keeps its device alive, like
// a kv_cache: destroying the context first is safe. A moved-from tensor is empty: using it throws
// qkv::error. Member functions are thread-safe (the device's lock).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "qkv/runtime/element_type.hpp"
#include "qkv/runtime/sdpa.hpp"
#include "qkv/vulkan/context.hpp"
#include "qkv/vulkan/export.hpp"

namespace qkv::vulkan {

class kv_cache;

class QKV_VULKAN_API tensor {
public:
    /// An empty tensor (no memory; using it throws qkv::error).
    tensor() noexcept;
    /// New device memory of `shape` and `type` (f32 or f16) on ctx's device, counted towards
    /// context_options::device_memory_limit; its contents are undefined until written. Throws
    /// qkv::invalid_argument (a zero dimension, a size that overflows, another type),
    /// limit_exceeded (beyond maxStorageBufferRange), out_of_memory, unavailable (f16 on a
    /// device without 16-bit storage).
    tensor(context& ctx, std::vector<std::size_t> shape, element_type type = element_type::f32);
    ~tensor();
    tensor(tensor&&) noexcept;
    tensor& operator=(tensor&&) noexcept;
    tensor(const tensor&) = delete;
    tensor& operator=(const tensor&) = delete;

    /// Host values into the tensor (elements() of them, row-major), converted to its type: f16
    /// rounds to nearest even and refuses a finite value beyond float16's range
    /// (numeric_overflow; nothing is written). Waits until the device has them.
    void upload(std::span<const float> values);
    /// The tensor's values, as float32. Waits for the device.
    [[nodiscard]] std::vector<float> download() const;

    [[nodiscard]] const std::vector<std::size_t>& shape() const;
    [[nodiscard]] element_type type() const;
    [[nodiscard]] std::size_t elements() const;
    [[nodiscard]] std::uint64_t bytes() const;
    /// True for a tensor over a caller's VkBuffer (interop.hpp: wrap), which qkv never frees.
    [[nodiscard]] bool wraps_caller_memory() const;
    [[nodiscard]] explicit operator bool() const noexcept { return impl_ != nullptr; }

    struct impl;

private:
    friend struct tensor_access;
    explicit tensor(std::unique_ptr<impl> i) noexcept;
    std::unique_ptr<impl> impl_;
};

/// The tensors of one sdpa_call run or recording. Shapes as sdpa_problem's: q (B, Hq, L, E),
/// k (B, Hkv, S, E), v (B, Hkv, S, Ev), out (B, Hq, L, Ev) f32; 3-D and 2-D shapes are B = 1
/// (and H = 1), as on the host. q, k and v share one element type: f32 with precision fp32, f16
/// with precision fp16 (the description's). Against a kv_cache, k and v stay null.
struct sdpa_tensors {
    const tensor* q = nullptr;
    const tensor* k = nullptr;
    const tensor* v = nullptr;
    tensor* out = nullptr;
};

/// scaled_dot_product_attention planned once for a shape, options and masks, then run (or, with
/// interop.hpp, recorded into a caller's command buffer) many times over tensors: kernels chosen,
/// pipelines built and the masks placed on the device when it is made.
class QKV_VULKAN_API sdpa_call {
public:
    /// `description` as for context::sdpa, its q, k and v spans empty (the data comes as tensors
    /// at run time). Its masks (mask, additive_mask, mask_shape) are host data, read now and kept
    /// on the device with the plan. Throws as context::sdpa would before any work.
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

/// The tensors of one attention_call run or recording, float32, shapes as attention_problem's:
/// x (batch, seq, d_in); wq, wk (d_in, d_k); wv (d_in, d_v); biases bq, bk (d_k) and bv (d_v), each
/// optional (null: none); with an output projection (shape.d_out > 0) wo (d_v, d_out) and an
/// optional bo (d_out); out (batch, seq, out_width).
struct attention_tensors {
    const tensor* x = nullptr;
    const tensor* wq = nullptr;
    const tensor* wk = nullptr;
    const tensor* wv = nullptr;
    const tensor* bq = nullptr;
    const tensor* bk = nullptr;
    const tensor* bv = nullptr;
    const tensor* wo = nullptr;
    const tensor* bo = nullptr;
    tensor* out = nullptr;
};

/// Self-attention (context::attention) planned once and run or recorded many times over tensors.
class QKV_VULKAN_API attention_call {
public:
    /// `description` as for context::attention, its data spans empty but for the masks (host data,
    /// kept on the device with the plan); return_weights is not available over tensors.
    attention_call(context& ctx, const attention_problem& description);
    ~attention_call();
    attention_call(attention_call&&) noexcept;
    attention_call& operator=(attention_call&&) noexcept;
    attention_call(const attention_call&) = delete;
    attention_call& operator=(const attention_call&) = delete;

    /// Thread-safe: runs and recordings of one call from several threads are serialised by the
    /// device's lock, each run checked before the next begins.
    /// Runs over `tensors` on the context's queue and waits; the overflow rule holds as on the
    /// host path (the range guard runs on the device, its verdict reported here).
    void run(const attention_tensors& tensors);
    [[nodiscard]] implementation implementation_run() const;
    [[nodiscard]] kernel_family kernel() const;

    struct impl;

private:
    friend struct attention_call_access;
    std::unique_ptr<impl> impl_;
};

/// Several planned calls (and cache appends) in one command buffer of qkv's, submitted once
/// (Kompute's "sequence"): what a model does per token, without a Vulkan header of its own. Each
/// recorded call keeps its scratch until the sequence records again after a run, or is destroyed.
/// One sequence is used by one thread at a time (different sequences may run concurrently).
///
/// A record refused before it records anything (its arguments: every check comes first) leaves
/// the sequence as it was. One that fails part-way (out_of_memory while recording) cannot be
/// taken back: everything recorded since the last run is dropped, and the appends among it are
/// undone (recorded() is then 0). A sequence destroyed before its run undoes its appends too.
/// The calls and tensors recorded must live until run() returns (the caches are kept alive).
class QKV_VULKAN_API sequence {
public:
    explicit sequence(context& ctx);
    ~sequence();
    sequence(sequence&&) noexcept;
    sequence& operator=(sequence&&) noexcept;
    sequence(const sequence&) = delete;
    sequence& operator=(const sequence&) = delete;

    /// Records `call` over `tensors` after what is recorded already (in order: each waits for the
    /// ones before it where they share memory).
    void record(sdpa_call& call, const sdpa_tensors& tensors);
    void record(attention_call& call, const attention_tensors& tensors);
    /// Records an append of device rows to `cache`. Its size grows now, so calls recorded after it
    /// in this sequence see the rows; until run(), every other use of the cache (its appends, the
    /// calls over it, other sequences) is refused with qkv::invalid_argument, since those rows are
    /// not written yet.
    void record_append(kv_cache& cache, const tensor& k, const tensor& v, std::size_t rows);
    /// Submits everything recorded, once, waits, then checks every call (numeric_overflow as the
    /// host path). The sequence is empty again afterwards.
    void run();
    /// The calls and appends recorded since the last run.
    [[nodiscard]] std::size_t recorded() const;

    struct impl;

private:
    std::unique_ptr<impl> impl_;
};

}  // namespace qkv::vulkan
