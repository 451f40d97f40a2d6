// qkv inside your own Vulkan application: your device, your buffers, your command buffer.
//
//   qkv::vulkan::context ctx = qkv::vulkan::make_context({.instance = inst, .physical_device = pd,
//       .device = dev, .queue_family = family, .queue = queue,
//       .get_instance_proc_addr = vkGetInstanceProcAddr, .create_info = &device_create_info});
//   qkv::vulkan::tensor q = qkv::vulkan::wrap(ctx, my_q_buffer, 0, {1, 8, 1, 64});  // never freed by qkv
//   ...
//   qkv::vulkan::sdpa_call call(ctx, description);                  // plan once
//   vkBeginCommandBuffer(cmd, ...);
//   my_dispatch_that_writes_q_k_v(cmd);
//   qkv::vulkan::recording r = qkv::vulkan::record(call, cmd, {.q = &q, .k = &k, .v = &v, .out = &o});
//   barrier(cmd, COMPUTE_SHADER/SHADER_WRITE -> my consumer);  my_dispatch_that_reads_o(cmd);
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
//           it. Writes by any other stage (a transfer, the host, graphics) must be made available and
//           visible to VK_PIPELINE_STAGE_2_COMPUTE_SHADER_BIT / VK_ACCESS_2_SHADER_STORAGE_READ_BIT
//           (and UNIFORM_READ for a kv_cache's storage) by a barrier of yours.
//           (qkv's own scratch is also filled and copied by transfers, ordered by qkv's barriers.)
//   after   Its results (the out tensor, a cache's rows) are written by compute shaders: wait on
//           VK_PIPELINE_STAGE_2_COMPUTE_SHADER_BIT / VK_ACCESS_2_SHADER_STORAGE_WRITE_BIT before you read
//           them (record_barrier records the barrier to compute reads, the common case).
//   scratch A recording owns its scratch memory and descriptor sets; they stay valid until the
//           recording is destroyed: keep it until the command buffer has completed. Several
//           recordings of one call may be in flight at once; each has its own.
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
QKV_VULKAN_API context make_context(const external_device& device, const context_options& options = {});

/// A tensor over `size` bytes of the caller's `buffer` from `offset` (a multiple of the element
/// size), which must have been created with VK_BUFFER_USAGE_STORAGE_BUFFER_BIT (and
/// TRANSFER_SRC/DST for upload/download; UNIFORM_TEXEL_BUFFER for a kv_cache's storage), on the
/// context's device. qkv never frees it; the buffer must outlive the tensor and its recordings.
/// Throws qkv::invalid_argument where the shape does not fit `size` or the offset is misaligned.
QKV_VULKAN_API tensor wrap(context& ctx, VkBuffer buffer, VkDeviceSize offset, VkDeviceSize size,
                           std::vector<std::size_t> shape, element_type type = element_type::f32);

/// The buffer and byte offset of a tensor (for the caller's own dispatches).
QKV_VULKAN_API VkBuffer buffer_of(const tensor& t);
QKV_VULKAN_API VkDeviceSize offset_of(const tensor& t);

/// What a recorded call owns until its command buffer has completed: scratch memory, descriptor
/// sets, the device's overflow verdict. Destroy it (or let it go) only after completion.
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
    /// path), or a non-finite output though every input was finite. Does nothing for a recording
    /// that checks nothing (an append).
    void check() const;

    struct impl;

private:
    friend struct recording_access;
    std::unique_ptr<impl> impl_;
};

/// Records `call` over `tensors` into `cmd` (in the recording state), with the barriers it needs
/// inside; submits nothing. See the synchronisation contract above.
QKV_VULKAN_API recording record(sdpa_call& call, VkCommandBuffer cmd, const sdpa_tensors& tensors);
QKV_VULKAN_API recording record(attention_call& call, VkCommandBuffer cmd, const attention_tensors& tensors);
QKV_VULKAN_API recording record(sdpa_backward_call& call, VkCommandBuffer cmd, const sdpa_backward_tensors& tensors);

/// Records an append of `rows` rows of k (B, Hkv, rows, E) and v (B, Hkv, rows, Ev) tensors to
/// `cache`; the cache's size grows now (record in submission order). The recording keeps the
/// cache's memory alive. Throws limit_exceeded (nothing recorded) where they do not fit, and
/// qkv::invalid_argument while a sequence holds an unrun append to the cache.
QKV_VULKAN_API recording record_append(kv_cache& cache, VkCommandBuffer cmd, const tensor& k, const tensor& v,
                                       std::size_t rows);

/// Records a barrier from compute-shader writes to compute-shader reads (the "after" of the
/// contract, for a consumer that is a compute shader).
QKV_VULKAN_API void record_barrier(const context& ctx, VkCommandBuffer cmd);

}  // namespace qkv::vulkan
