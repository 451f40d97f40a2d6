// qkv inside the caller's Vulkan application (qkv/vulkan/interop.hpp): contexts on the caller's
// device, tensors over the caller's buffers, and recordings into the caller's command buffers.
#include "qkv/vulkan/interop.hpp"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "api/attention_call_impl.hpp"
#include "api/context_impl.hpp"
#include "api/kv_cache_impl.hpp"
#include "api/paged_call_impl.hpp"
#include "api/recording_impl.hpp"
#include "api/sdpa_call_impl.hpp"
#include "api/tensor_impl.hpp"
#include "plan/buffers.hpp"
#include "vk/check.hpp"

namespace qkv::vulkan {

using namespace detail;

namespace {

/// What the caller's VkDeviceCreateInfo enabled, as far as qkv needs to know.
external_handles enabled_by(const external_device& d) {
    external_handles h;
    h.device = d.device;
    h.queue_family = d.queue_family;
    h.queue = d.queue;
    const VkDeviceCreateInfo* info = d.create_info;
    if (!info) return h;
    bool size_extension = false;
    for (std::uint32_t i = 0; i < info->enabledExtensionCount; ++i)
        if (std::strcmp(info->ppEnabledExtensionNames[i], VK_EXT_SUBGROUP_SIZE_CONTROL_EXTENSION_NAME) == 0)
            size_extension = true;
    if (info->pEnabledFeatures) h.shader_int64 = info->pEnabledFeatures->shaderInt64 == VK_TRUE;
    bool size_control = false, full = false;
    for (auto* s = static_cast<const VkBaseInStructure*>(info->pNext); s; s = s->pNext) {
        switch (s->sType) {
            case VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2:
                h.shader_int64 = h.shader_int64 ||
                                 reinterpret_cast<const VkPhysicalDeviceFeatures2*>(s)->features.shaderInt64 == VK_TRUE;
                break;
            case VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES:
                h.storage_16bit =
                    h.storage_16bit ||
                    reinterpret_cast<const VkPhysicalDevice16BitStorageFeatures*>(s)->storageBuffer16BitAccess ==
                        VK_TRUE;
                break;
            case VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES:
                h.storage_16bit =
                    h.storage_16bit ||
                    reinterpret_cast<const VkPhysicalDeviceVulkan11Features*>(s)->storageBuffer16BitAccess == VK_TRUE;
                break;
            case VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_FEATURES: {
                const auto* f = reinterpret_cast<const VkPhysicalDeviceSubgroupSizeControlFeatures*>(s);
                size_control = size_control || f->subgroupSizeControl == VK_TRUE;
                full = full || f->computeFullSubgroups == VK_TRUE;
                break;
            }
            case VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_3_FEATURES: {
                const auto* f = reinterpret_cast<const VkPhysicalDeviceVulkan13Features*>(s);
                size_control = size_control || f->subgroupSizeControl == VK_TRUE;
                full = full || f->computeFullSubgroups == VK_TRUE;
                size_extension = true;  // core in Vulkan 1.3
                break;
            }
            default:
                break;
        }
    }
    h.subgroup_size_control = size_control && size_extension;
    h.compute_full_subgroups = h.subgroup_size_control && full;
    return h;
}

}  // namespace

context testing::make_context(const external_device& d, const context_options& options, const hooks& h) {
    auto inst = std::make_shared<const instance>(d.instance, d.get_instance_proc_addr, d.physical_device);
    auto core = std::make_shared<device_core>(std::move(inst), enabled_by(d), options, h);
    return context_access::make(std::make_unique<context::impl>(std::move(core), h));
}

context make_context(const external_device& d, const context_options& options) {
    return testing::make_context(d, options, {});
}

tensor wrap(context& ctx, VkBuffer buffer, VkDeviceSize offset, VkDeviceSize size, std::vector<std::size_t> shape,
            element_type type, VkBufferUsageFlags usage) {
    if (!buffer) throw qkv::invalid_argument("wrap: no VkBuffer");
    context::impl& c = context_access::of(ctx);
    // A tensor of the shape first (its checks), without memory, then the caller's buffer.
    auto t = std::make_unique<tensor::impl>();
    t->core = c.core;
    describe(*t, std::move(shape), type, c.core->dev->info(), "wrap");
    t->usage = usage;
    require_usage(*t, VK_BUFFER_USAGE_STORAGE_BUFFER_BIT, "VK_BUFFER_USAGE_STORAGE_BUFFER_BIT", "wrap", "wrapped");
    const std::uint64_t align = t->element_bytes() ? t->element_bytes() : 2;  // blocks: every row starts even
    if (offset % align != 0)
        throw qkv::invalid_argument("wrap: offset " + std::to_string(offset) + " is not a multiple of " +
                                    std::to_string(align) + " bytes (" + std::string(to_string(type)) + ")");
    // The buffer's size, as far as Vulkan tells it: its memory requirements (perhaps rounded up to
    // its alignment). A range beyond it would read and write outside the buffer.
    VkMemoryRequirements req{};
    c.core->dev->fn().vkGetBufferMemoryRequirements(c.core->dev->handle(), buffer, &req);
    if (offset > req.size)
        throw qkv::invalid_argument("wrap: offset " + std::to_string(offset) + " is past the end of the VkBuffer (" +
                                    std::to_string(req.size) + " bytes by its memory requirements)");
    if (size == VK_WHOLE_SIZE) size = req.size - offset;
    if (size > req.size - offset)
        throw qkv::invalid_argument("wrap: offset " + std::to_string(offset) + " + size " + std::to_string(size) +
                                    " passes the end of the VkBuffer (" + std::to_string(req.size) +
                                    " bytes by its memory requirements)");
    if (t->bytes > size)
        throw qkv::invalid_argument("wrap: shape " + shape_string(t->shape) + " of " + std::string(to_string(type)) +
                                    " needs " + std::to_string(t->bytes) + " bytes; the buffer range has " +
                                    std::to_string(size));
    t->handle = buffer;
    t->offset = offset;
    t->reach = std::min(align_up(offset + t->bytes, 4) - offset, size);  // whole words where the range has them
    t->wrapped = true;
    return tensor_access::make(std::move(t));
}

VkBuffer buffer_of(const tensor& t) { return tensor_access::of(t, "buffer_of").handle; }
VkDeviceSize offset_of(const tensor& t) { return tensor_access::of(t, "offset_of").offset; }

recording record(sdpa_call& call, VkCommandBuffer cmd, const sdpa_tensors& tensors) {
    return record_call(sdpa_call_access::of(call), cmd, tensors);
}

recording record(attention_call& call, VkCommandBuffer cmd, const attention_tensors& tensors) {
    return record_call(attention_call_access::of(call), cmd, tensors);
}

recording record(paged_call& call, VkCommandBuffer cmd, const paged_tensors& tensors) {
    return record_call(paged_call_access::of(call), cmd, tensors);
}

recording record_append(kv_cache& cache, VkCommandBuffer cmd, const tensor& k, const tensor& v, std::size_t rows) {
    if (!cmd) throw qkv::invalid_argument("record_append: no VkCommandBuffer");
    const std::shared_ptr<kv_cache::impl> c = kv_cache_access::of(cache);
    auto r = std::make_unique<recording::impl>();
    r->core = c->core;
    std::vector<std::shared_ptr<void>> later;  // retired recordings let go of after the lock
    std::shared_ptr<void> held;                // a failed recording's cache, likewise
    const void* in = static_cast<const void*>(cmd);
    const auto lock = c->lock_for_append(rows, "record_append", in);  // refused while another holds rows
    later = c->core->reclaim();
    if (rows) (void)c->check_append(k, v, rows);  // every refusal before anything is recorded
    r->rec = std::make_unique<external_recorder>(*c->core->dev, c->core->exec->max_groups(0), cmd);
    r->begin_marker(*r->rec);
    const std::size_t before = c->size;
    try {
        if (rows) c->record_append(*r->rec, k, v, rows, r->scratch);
    } catch (...) {
        c->size = before;                                      // not grown (it grows last)
        held = recording_access::retire_locked(std::move(r));  // its commands may be in `cmd`: kept
        throw;
    }
    r->end_marker(*r->rec);
    r->cache = c;  // its storage and statistics live until the recording goes (after the commands)
    // The rows are the cache's once the recording is known to have run (check(), or its
    // destruction after completion); until then only this command buffer may use them, and a
    // recording destroyed before then takes them back.
    if (rows) r->hold_append(*c, cmd, before);
    return recording_access::make(std::move(r));
}

void record_barrier(const context& ctx, VkCommandBuffer cmd) {
    const device& dev = *context_access::of(ctx).core->dev;
    auto b = vk_struct<VkMemoryBarrier>(VK_STRUCTURE_TYPE_MEMORY_BARRIER);
    b.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT;
    b.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_UNIFORM_READ_BIT;
    dev.fn().vkCmdPipelineBarrier(cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1,
                                  &b, 0, nullptr, 0, nullptr);
}

}  // namespace qkv::vulkan
