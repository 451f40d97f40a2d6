#include "vk/executor.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "vk/check.hpp"

namespace qkv::vulkan::detail {
namespace {
constexpr std::uint32_t max_sets = 1024;  // descriptor sets per pool (one per stage dispatch or key chunk)
}

recorder::recorder(const device& dev, std::uint32_t max_workgroup_count) : dev_(dev) {
    for (int i = 0; i < 3; ++i) {
        max_groups_[i] = dev_.limits().maxComputeWorkGroupCount[i];
        if (max_workgroup_count) max_groups_[i] = std::min(max_groups_[i], max_workgroup_count);
    }
}

void recorder::start(VkCommandBuffer cmd, VkDescriptorPool descriptors, VkQueryPool queries) {
    cmd_ = cmd;
    descriptors_ = descriptors;
    queries_ = queries;
    dispatches_ = 0;
    sets_ = 0;
    commands_ = 0;
    stamps_ = 0;
    more_used_ = 0;
}

descriptor_pool_handle make_descriptor_pool(const device& dev) {
    descriptor_pool_handle pool(dev.fn(), dev.handle());
    const VkDescriptorPoolSize sizes[] = {{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, max_sets * 8},
                                          {VK_DESCRIPTOR_TYPE_UNIFORM_TEXEL_BUFFER, max_sets * 3}};
    auto dp = vk_struct<VkDescriptorPoolCreateInfo>(VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO);
    dp.maxSets = max_sets;
    dp.poolSizeCount = 2;
    dp.pPoolSizes = sizes;
    check(dev.fn().vkCreateDescriptorPool(dev.handle(), &dp, nullptr, pool.put()), "vkCreateDescriptorPool");
    return pool;
}

executor::executor(const device& dev, std::uint32_t max_workgroup_count, std::uint32_t lose_device_at_submit)
    : recorder(dev, max_workgroup_count), lose_at_submit_(lose_device_at_submit) {
    const auto& fn = dev_.fn();
    const VkDevice d = dev_.handle();
    // Each object is owned as soon as it exists: a failure below destroys those made before it.
    pool_ = command_pool_handle(fn, d);
    fence_ = fence_handle(fn, d);
    query_pool_ = query_pool_handle(fn, d);
    auto pool = vk_struct<VkCommandPoolCreateInfo>(VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO);
    pool.flags = VK_COMMAND_POOL_CREATE_TRANSIENT_BIT;
    pool.queueFamilyIndex = dev_.queue_family();
    check(fn.vkCreateCommandPool(d, &pool, nullptr, pool_.put()), "vkCreateCommandPool");
    auto alloc = vk_struct<VkCommandBufferAllocateInfo>(VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO);
    alloc.commandPool = pool_.get();
    alloc.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    alloc.commandBufferCount = 1;
    check(fn.vkAllocateCommandBuffers(d, &alloc, &own_cmd_), "vkAllocateCommandBuffers");
    descriptor_pool_ = make_descriptor_pool(dev_);
    grows_descriptors_ = true;

    auto fence = vk_struct<VkFenceCreateInfo>(VK_STRUCTURE_TYPE_FENCE_CREATE_INFO);
    check(fn.vkCreateFence(d, &fence, nullptr, fence_.put()), "vkCreateFence");

    if (dev_.info().timestamps) {
        auto q = vk_struct<VkQueryPoolCreateInfo>(VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO);
        q.queryType = VK_QUERY_TYPE_TIMESTAMP;
        q.queryCount = max_marks + 2;
        check(fn.vkCreateQueryPool(d, &q, nullptr, query_pool_.put()), "vkCreateQueryPool");
    }
}

void executor::begin() {
    const auto& fn = dev_.fn();
    check(fn.vkResetCommandPool(dev_.handle(), pool_.get(), 0), "vkResetCommandPool");
    check(fn.vkResetDescriptorPool(dev_.handle(), descriptor_pool_.get(), 0), "vkResetDescriptorPool");
    for (std::size_t i = 0; i < more_used_; ++i)
        check(fn.vkResetDescriptorPool(dev_.handle(), more_pools_[i].get(), 0), "vkResetDescriptorPool");
    start(own_cmd_, descriptor_pool_.get(), query_pool_ ? query_pool_.get() : VK_NULL_HANDLE);
    marks_ms_.clear();
    auto info = vk_struct<VkCommandBufferBeginInfo>(VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO);
    info.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
    check(fn.vkBeginCommandBuffer(cmd_, &info), "vkBeginCommandBuffer");
    if (queries_) {
        fn.vkCmdResetQueryPool(cmd_, queries_, 0, max_marks + 2);
        fn.vkCmdWriteTimestamp(cmd_, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, queries_, stamps_++);
    }
}

external_recorder::external_recorder(const device& dev, std::uint32_t max_workgroup_count, VkCommandBuffer cmd)
    : recorder(dev, max_workgroup_count), descriptor_pool_(make_descriptor_pool(dev)) {
    start(cmd, descriptor_pool_.get(), VK_NULL_HANDLE);
}

dry_recorder::dry_recorder(const device& dev, std::uint32_t max_workgroup_count) : recorder(dev, max_workgroup_count) {
    dry_ = true;
}

void recorder::mark() {
    if (!queries_ || dry_) return;
    if (stamps_ > max_marks) throw error("internal: too many timestamp marks in one call");
    dev_.fn().vkCmdWriteTimestamp(cmd_, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, queries_, stamps_++);
    ++commands_;
}

void recorder::fill(VkBuffer dst, VkDeviceSize offset, VkDeviceSize size, std::uint32_t value) {
    if (dry_) return;
    dev_.fn().vkCmdFillBuffer(cmd_, dst, offset, size, value);
    ++commands_;
}

void recorder::copy(VkBuffer src, VkDeviceSize src_offset, VkBuffer dst, VkDeviceSize dst_offset, VkDeviceSize size) {
    if (dry_) return;
    const VkBufferCopy region{src_offset, dst_offset, size};
    dev_.fn().vkCmdCopyBuffer(cmd_, src, dst, 1, &region);
    ++commands_;
}

void recorder::copy(VkBuffer src, VkBuffer dst, const std::vector<VkBufferCopy>& regions) {
    if (regions.empty() || dry_) return;
    dev_.fn().vkCmdCopyBuffer(cmd_, src, dst, static_cast<std::uint32_t>(regions.size()), regions.data());
    ++commands_;
}

void recorder::barrier(VkPipelineStageFlags src, VkAccessFlags src_access, VkPipelineStageFlags dst,
                       VkAccessFlags dst_access) {
    if (dry_) return;
    auto b = vk_struct<VkMemoryBarrier>(VK_STRUCTURE_TYPE_MEMORY_BARRIER);
    b.srcAccessMask = src_access;
    b.dstAccessMask = dst_access;
    dev_.fn().vkCmdPipelineBarrier(cmd_, src, dst, 0, 1, &b, 0, nullptr, 0, nullptr);
    ++commands_;
}

void recorder::compute_barrier() {
    barrier(VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT,
            VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT);
}

void recorder::dispatch(const pipeline& p, std::initializer_list<binding> bindings, const void* push,
                        const std::uint32_t (&groups)[3]) {
    const auto& fn = dev_.fn();
    if (bindings.size() != p.bindings) throw error("internal: binding count does not match the pipeline");
    if (dry_) return;  // the pipeline is built: that was the point
    if (cmd_ == VK_NULL_HANDLE) throw error("internal: recording without a command buffer");
    if (sets_ == max_sets) {
        if (!grows_descriptors_) throw error("internal: too many dispatches in one call");
        if (more_used_ == more_pools_.size()) more_pools_.push_back(make_descriptor_pool(dev_));
        descriptors_ = more_pools_[more_used_++].get();
        sets_ = 0;
    }
    ++sets_;
    ++commands_;

    VkDescriptorSet set = VK_NULL_HANDLE;
    auto alloc = vk_struct<VkDescriptorSetAllocateInfo>(VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO);
    alloc.descriptorPool = descriptors_;
    alloc.descriptorSetCount = 1;
    const VkDescriptorSetLayout set_layout = p.set_layout.get();
    alloc.pSetLayouts = &set_layout;
    check(fn.vkAllocateDescriptorSets(dev_.handle(), &alloc, &set), "vkAllocateDescriptorSets");
    std::vector<VkDescriptorBufferInfo> infos;
    std::vector<VkBufferView> views;
    std::vector<VkWriteDescriptorSet> writes;
    infos.reserve(bindings.size());
    views.reserve(bindings.size());
    for (const auto& b : bindings) {
        infos.push_back({b.buffer, b.offset, b.range});
        views.push_back(b.view);
    }
    for (std::uint32_t i = 0; i < infos.size(); ++i) {
        auto w = vk_struct<VkWriteDescriptorSet>(VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET);
        w.dstSet = set;
        w.dstBinding = i;
        w.descriptorCount = 1;
        w.descriptorType = p.types[i];
        const bool texel_binding = p.types[i] == VK_DESCRIPTOR_TYPE_UNIFORM_TEXEL_BUFFER;
        if (texel_binding != (views[i] != VK_NULL_HANDLE))
            throw error("internal: binding " + std::to_string(i) + " does not match the pipeline's descriptor type");
        if (texel_binding)
            w.pTexelBufferView = &views[i];
        else
            w.pBufferInfo = &infos[i];
        writes.push_back(w);
    }
    fn.vkUpdateDescriptorSets(dev_.handle(), static_cast<std::uint32_t>(writes.size()), writes.data(), 0, nullptr);
    fn.vkCmdBindPipeline(cmd_, VK_PIPELINE_BIND_POINT_COMPUTE, p.handle.get());
    fn.vkCmdBindDescriptorSets(cmd_, VK_PIPELINE_BIND_POINT_COMPUTE, p.layout.get(), 0, 1, &set, 0, nullptr);

    push_copy_.assign(static_cast<const std::byte*>(push), static_cast<const std::byte*>(push) + p.push_size);
    for (std::uint32_t z = 0; z < groups[2]; z += max_groups_[2])
        for (std::uint32_t y = 0; y < groups[1]; y += max_groups_[1])
            for (std::uint32_t x = 0; x < groups[0]; x += max_groups_[0]) {
                const group_offset offset{x, y, z};
                std::memcpy(push_copy_.data(), &offset, sizeof offset);
                fn.vkCmdPushConstants(cmd_, p.layout.get(), VK_SHADER_STAGE_COMPUTE_BIT, 0, p.push_size,
                                      push_copy_.data());
                fn.vkCmdDispatch(cmd_, std::min(max_groups_[0], groups[0] - x), std::min(max_groups_[1], groups[1] - y),
                                 std::min(max_groups_[2], groups[2] - z));
                ++dispatches_;
            }
}

double executor::submit_and_wait() {
    const auto& fn = dev_.fn();
    const VkFence fence = fence_.get();
    if (queries_) fn.vkCmdWriteTimestamp(cmd_, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, queries_, stamps_++);
    check(fn.vkEndCommandBuffer(cmd_), "vkEndCommandBuffer");
    check(fn.vkResetFences(dev_.handle(), 1, &fence), "vkResetFences");
    auto submit = vk_struct<VkSubmitInfo>(VK_STRUCTURE_TYPE_SUBMIT_INFO);
    submit.commandBufferCount = 1;
    submit.pCommandBuffers = &cmd_;
    const bool simulate_loss = lose_at_submit_ != 0 && ++submits_ == lose_at_submit_;
    check(simulate_loss ? VK_ERROR_DEVICE_LOST : fn.vkQueueSubmit(dev_.queue(), 1, &submit, fence), "vkQueueSubmit");
    check(fn.vkWaitForFences(dev_.handle(), 1, &fence, VK_TRUE, UINT64_MAX), "vkWaitForFences");
    if (!queries_) return 0.0;
    std::uint64_t stamps[max_marks + 2] = {};
    check(fn.vkGetQueryPoolResults(dev_.handle(), queries_, 0, stamps_, sizeof stamps, stamps, sizeof(std::uint64_t),
                                   VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT),
          "vkGetQueryPoolResults");
    const double to_ms = dev_.info().timestamp_period_ns * 1e-6;
    for (std::uint32_t i = 1; i + 1 < stamps_; ++i)
        marks_ms_.push_back(static_cast<double>(stamps[i] - stamps[0]) * to_ms);
    return static_cast<double>(stamps[stamps_ - 1] - stamps[0]) * to_ms;
}

}  // namespace qkv::vulkan::detail
