// qkv inside your own Vulkan application: your device, your buffers, your command buffer.
//
//   qkv::vulkan::context ctx = qkv::vulkan::make_context({.instance = inst, .physical_device = pd,
//       .device = dev, .queue_family = family, .queue = queue,
//       .get_instance_proc_addr = vkGetInstanceProcAddr, .create_info = &device_create_info});
//   qkv::vulkan::tensor q = qkv::vulkan::wrap(ctx, my_q_buffer, 0, 8 * 64 * 4, {1, 8, 1, 64});  // never freed by qkv
//   ...
//   qkv::vulkan::sdpa_call call(ctx, description);                  // plan once: kernels, pipelines
//   vkBeginCommandBuffer(cmd, ...);
//   my_dispatch_that_writes_q_k_v(cmd);
//   qkv::vulkan::recording r = qkv::vulkan::record(call, cmd, {.q = &q, .k = &k, .v = &v, .out = &o});
//   barrier(cmd, COMPUTE_SHADER/SHADER_WRITE -> my consumer);  my_dispatch_that_reads_o(cmd);  // binds its own
//   vkEndCommandBuffer(cmd); vkQueueSubmit(...); vkWaitForFences(...);
//   r.check();   // numeric_overflow if the device found the inputs beyond float32's range
//
// Synchronisation contract of a recording:
//   before  Every access qkv records to your memory (tensors, a kv_cache's storage) is a
//           compute-shader access (storage and uniform-texel reads and writes:
//           VK_PIPELINE_STAGE_2_COMPUTE_SHADER_BIT with VK_ACCESS_2_SHADER_STORAGE_READ_BIT,
//           VK_ACCESS_2_UNIFORM_READ_BIT and VK_ACCESS_2_SHADER_STORAGE_WRITE_BIT). A recording begins
//           with a barrier from earlier compute-shader writes to its own compute-shader reads and
//           writes, so a compute dispatch of yours, or another qkv recording, needs no barrier before
//           it. Writes by a transfer or graphics stage must be made available and visible to
//           VK_PIPELINE_STAGE_2_COMPUTE_SHADER_BIT / VK_ACCESS_2_SHADER_STORAGE_READ_BIT (and
//           UNIFORM_READ for a kv_cache's storage) by a barrier of yours. Host writes made before
//           vkQueueSubmit need none (the submission makes them visible; host-coherent memory, or
//           flushed).
//           (qkv's own scratch is also filled and copied by transfers, ordered by qkv's barriers.)
//   after   Its results (the out tensor, a cache's rows) are written by compute shaders: wait on
//           VK_PIPELINE_STAGE_2_COMPUTE_SHADER_BIT / VK_ACCESS_2_SHADER_STORAGE_WRITE_BIT before you read
//           them (record_barrier records the barrier to compute reads, the common case).
//   state   A recording leaves qkv's compute pipeline, its descriptor sets and its push constants
//           bound to VK_PIPELINE_BIND_POINT_COMPUTE of `cmd`: after it, bind your own pipeline,
//           descriptor sets and push constants before your next dispatch. Nothing else of the
//           command buffer's state is changed (graphics state is untouched; no dynamic state is set).
//   scratch A recording owns its scratch memory, descriptor sets and a completion word the device
//           writes last. Keep it until the command buffer has completed. qkv submits nothing, so
//           it sees your fence only where you give it: recording::completes_with(fence) makes the
//           recording complete only once that fence is signalled (and the word says done), and
//           releases it at its destruction where the fence is signalled by then. Otherwise it
//           reads that word: a recording destroyed before its check() has seen that word say
//           "done" does not free what its commands use; its device objects are kept by the context
//           and released on a later record that finds the word done (make that call after
//           your fence, as the word is no host synchronisation), or when the context's device goes
//           (a recording never submitted keeps them until then): when the last qkv object of the
//           context (the context, its calls, caches, tensors and recordings) is destroyed, which
//           the application does after its work on them completed and before vkDestroyDevice. A
//           kept recording holds none of them alive. Several recordings of one
//           call may be in flight at once; each has its own. record() and record_append() are
//           [[nodiscard]]: a discarded recording would be destroyed before its commands ran.
//   check   recording::check() reads the same word (and the fence given to completes_with): before
//           completion it throws not_complete (the verdict is unknown), never returns normally.
//   appends An append recorded into `cmd` (record_append) grows the cache's size at once, so calls
//           over the cache recorded after it into the same command buffer see the rows; every
//           other use of the cache (a host call, a record into another command buffer, an append
//           from the host, a sequence) is refused with qkv::invalid_argument until the recording
//           is known to have completed: its check() (after your fence), or its destruction after
//           completion. Destroyed before completion, its rows are taken back (the cache's size as
//           before the command buffer's appends): an append never run is never seen. The same rule
//           as a sequence's appends, which are the cache's once the sequence has run.
//   aliasing A call refuses (qkv::invalid_argument) an output tensor whose bytes overlap another of
//           its tensors (input or output) in the same VkBuffer, and an append whose rows overlap
//           the cache's storage; nothing is computed in place.
//   queue   qkv submits nothing for a recording. Its host calls (context::sdpa, tensor::upload, ...)
//           submit to the queue you gave, under qkv's lock: do not use that queue from another
//           thread during them (Vulkan's external synchronisation of queues).
// This header needs the Vulkan headers (vulkan/vulkan_core.h); the rest of qkv does not.
#pragma once

#include <vulkan/vulkan_core.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "qkv/vulkan/attention_call.hpp"
#include "qkv/vulkan/context.hpp"
#include "qkv/vulkan/kv_cache.hpp"
#include "qkv/vulkan/paged_call.hpp"
#include "qkv/vulkan/sdpa_backward_call.hpp"
#include "qkv/vulkan/sdpa_call.hpp"
#include "qkv/vulkan/tensor.hpp"

namespace qkv::vulkan {

/// The caller's Vulkan objects a context is built on. qkv never destroys them, never waits for the
/// device to be idle, and records and submits only its own work.
struct external_device {
    VkInstance instance = VK_NULL_HANDLE;
    VkPhysicalDevice physical_device = VK_NULL_HANDLE;
    VkDevice device = VK_NULL_HANDLE;
    std::uint32_t queue_family = 0;  ///< a family with VK_QUEUE_COMPUTE_BIT
    VkQueue queue = VK_NULL_HANDLE;  ///< of that family: qkv's host calls submit here
    PFN_vkGetInstanceProcAddr get_instance_proc_addr = nullptr;
    /// What `device` was created with: qkv reads its pNext chain (VkPhysicalDeviceFeatures2,
    /// Vulkan11/13Features, 16-bit storage, subgroup size control), pEnabledFeatures and the
    /// enabled extensions, during make_context only. Null: no optional feature (fp32 only).
    const VkDeviceCreateInfo* create_info = nullptr;
};

/// A context on the caller's device. Checks what qkv needs (Vulkan 1.1, a compute queue) and
/// throws unavailable naming what is missing; what is optional (storageBuffer16BitAccess for fp16,
/// shaderInt64, subgroup size control) is used only where the caller enabled it, and a call that
/// needs it is refused with unavailable naming it. options.device and options.validation do not
/// apply (the caller's instance has its own layers and messenger).
[[nodiscard]] QKV_VULKAN_API context make_context(const external_device& device, const context_options& options = {});

/// The usage flags `wrap` assumes a caller's buffer was created with, unless told otherwise:
/// storage, and transfer source and destination (for tensor::upload and download).
inline constexpr VkBufferUsageFlags wrap_usage =
    VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;

/// A tensor over `size` bytes of the caller's `buffer` from `offset` (a multiple of the element
/// size), on the context's device, of `shape` (row-major, contiguous; a call checks it as the
/// shape it needs, dimension by dimension). `size` may be VK_WHOLE_SIZE: the rest of the buffer.
/// `usage` is what the buffer was created with (Vulkan cannot be asked): it must hold
/// VK_BUFFER_USAGE_STORAGE_BUFFER_BIT; tensor::upload and download need TRANSFER_DST and
/// TRANSFER_SRC, and a kv_cache's storage UNIFORM_TEXEL_BUFFER, each refused with
/// qkv::invalid_argument where `usage` lacks it. qkv never frees the buffer; it must outlive the
/// tensor and its recordings. Throws qkv::invalid_argument where the shape does not fit `size`, the
/// offset is misaligned, or offset + size passes the end of the buffer (its size as
/// vkGetBufferMemoryRequirements reports it, which a driver may round up to the buffer's
/// alignment: the check catches every range beyond that). An f16 tensor of an odd number of
/// values, or a q8_0 / q4_0 tensor of an odd number of rows (34- and 18-byte rows of 32 values),
/// ends mid 32-bit word; what reads it as float32 first (a call's K/V of another type than q, or
/// quantized; a quantized kv_cache's append from it) reads that last word whole, so `size` must
/// reach the word's end (offset + bytes rounded up to a multiple of 4), or recording or running
/// that throws qkv::invalid_argument.
[[nodiscard]] QKV_VULKAN_API tensor wrap(context& ctx, VkBuffer buffer, VkDeviceSize offset, VkDeviceSize size,
                                         std::vector<std::size_t> shape, element_type type = element_type::f32,
                                         VkBufferUsageFlags usage = wrap_usage);

/// The buffer and byte offset of a tensor (for the caller's own dispatches).
QKV_VULKAN_API VkBuffer buffer_of(const tensor& t);
QKV_VULKAN_API VkDeviceSize offset_of(const tensor& t);

/// What a recorded call owns until its command buffer has completed: scratch memory, descriptor
/// sets, the device's overflow verdict and its completion word (the contract's "scratch", "check"
/// and "appends" above). record() and record_append() are [[nodiscard]].
class QKV_VULKAN_API recording {
public:
    recording() noexcept;
    ~recording();
    recording(recording&&) noexcept;
    recording& operator=(recording&&) noexcept;
    recording(const recording&) = delete;
    recording& operator=(const recording&) = delete;

    /// After the command buffer has completed: throws numeric_overflow where the device found
    /// the inputs beyond what float32 computes (the README's rule, the same message as the host
    /// path), or a non-finite output though every input was finite; an append's rows become the
    /// cache's for every use. Before completion (not submitted, or still running) it throws
    /// not_complete and changes nothing.
    void check() const;

    /// Ties completion to `fence`: the fence your vkQueueSubmit of the command buffer signals
    /// (the contract's "scratch" above). From then on the recording counts as completed only once
    /// that fence is signalled (vkGetFenceStatus) and its word says done: check() throws
    /// not_complete before, and the recording, destroyed with its fence signalled, releases what
    /// its commands used at once, with no later call needed. Keep the fence (not destroyed, not
    /// reset) until check() has returned or the recording is destroyed. Destroyed before the
    /// fence signalled, the recording forgets the fence (you may destroy it) and falls back to its
    /// word. Throws qkv::invalid_argument for VK_NULL_HANDLE, and for a recording run by qkv or
    /// empty.
    void completes_with(VkFence fence);

    struct impl;

private:
    friend struct recording_access;
    std::unique_ptr<impl> impl_;
};

/// Records `call` over `tensors` into `cmd` (in the recording state), with the barriers it needs
/// inside; submits nothing. See the synchronisation contract above.
[[nodiscard]] QKV_VULKAN_API recording record(sdpa_call& call, VkCommandBuffer cmd, const sdpa_tensors& tensors);
[[nodiscard]] QKV_VULKAN_API recording record(attention_call& call, VkCommandBuffer cmd,
                                              const attention_tensors& tensors);
/// A paged batch's step (block table and lengths read now) against its pool: a server's batched
/// decode step recorded into its own command buffer.
[[nodiscard]] QKV_VULKAN_API recording record(paged_call& call, VkCommandBuffer cmd, const paged_tensors& tensors);
[[nodiscard]] QKV_VULKAN_API recording record(sdpa_backward_call& call, VkCommandBuffer cmd,
                                              const sdpa_backward_tensors& tensors);

/// Records an append of `rows` rows of k (B, Hkv, rows, E) and v (B, Hkv, rows, Ev) tensors to
/// `cache`; the cache's size grows now, for the calls recorded after it into `cmd` (the contract's
/// "appends": other uses wait for its check()). The recording keeps the cache's memory alive.
/// Throws limit_exceeded (nothing recorded) where they do not fit, and qkv::invalid_argument while
/// a sequence or another command buffer holds an append to the cache not known to have run.
[[nodiscard]] QKV_VULKAN_API recording record_append(kv_cache& cache, VkCommandBuffer cmd, const tensor& k,
                                                     const tensor& v, std::size_t rows);

/// Records a barrier from compute-shader writes to compute-shader reads (the "after" of the
/// contract, for a consumer that is a compute shader).
QKV_VULKAN_API void record_barrier(const context& ctx, VkCommandBuffer cmd);

}  // namespace qkv::vulkan
