// Records one call's work into a single command buffer and submits it once: uploads, every
// dispatch of every stage (split where a grid exceeds maxComputeWorkGroupCount), barriers,
// downloads, and timestamps where the queue supports them.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "vk/device.hpp"
#include "vk/memory.hpp"
#include "vk/pipelines.hpp"
#include "vk/vk_handle.hpp"

namespace qkv::vulkan::detail {

struct binding {
    VkBuffer buffer = VK_NULL_HANDLE;
    VkDeviceSize offset = 0;
    VkDeviceSize range = VK_WHOLE_SIZE;
    VkBufferView view = VK_NULL_HANDLE;  ///< for a texel-buffer binding (then buffer/offset/range unused)
};

inline binding texel(VkBufferView view) {
    binding b;
    b.view = view;
    return b;
}

/// Every push-constant block starts with these three: the workgroup offset of a split dispatch.
struct group_offset {
    std::uint32_t x = 0, y = 0, z = 0;
};

/// Records commands into a command buffer: copies, barriers, dispatches (split where a grid
/// exceeds the device's, or the configured, maximum), each dispatch with a descriptor set from a
/// descriptor pool, and timestamps where there is a query pool. executor records into its own
/// command buffer and submits it; external_recorder into a caller's, and submits nothing.
class recorder {
public:
    recorder(const recorder&) = delete;
    recorder& operator=(const recorder&) = delete;

    void fill(VkBuffer dst, VkDeviceSize offset, VkDeviceSize size, std::uint32_t value);
    void copy(VkBuffer src, VkDeviceSize src_offset, VkBuffer dst, VkDeviceSize dst_offset, VkDeviceSize size);
    /// Several regions from one buffer to another.
    void copy(VkBuffer src, VkBuffer dst, const std::vector<VkBufferCopy>& regions);
    /// A global memory barrier from `src` stage/access to `dst` stage/access.
    void barrier(VkPipelineStageFlags src, VkAccessFlags src_access, VkPipelineStageFlags dst,
                 VkAccessFlags dst_access);
    /// Shader writes visible to later shader reads and writes.
    void compute_barrier();
    /// Dispatches `groups` workgroups, split into several dispatches where a dimension exceeds
    /// the device's (or the configured) maximum; `push` must start with a group_offset.
    void dispatch(const pipeline& p, std::initializer_list<binding> bindings, const void* push,
                  const std::uint32_t (&groups)[3]);

    /// Marks the end of a phase of the work recorded so far (a timestamp once every earlier
    /// command has finished); at most max_marks per call, no-op without timestamps.
    void mark();
    static constexpr std::uint32_t max_marks = 6;

    [[nodiscard]] std::uint32_t dispatches_recorded() const { return dispatches_; }
    /// Commands recorded since start(): copies, fills, barriers, dispatches, timestamps.
    [[nodiscard]] std::uint64_t commands_recorded() const { return commands_; }
    [[nodiscard]] std::uint32_t max_groups(int dim) const { return max_groups_[dim]; }
    [[nodiscard]] const device& dev() const { return dev_; }

protected:
    recorder(const device& dev, std::uint32_t max_workgroup_count);
    ~recorder() = default;
    /// Starts recording into `cmd` with sets from `descriptors` (reset by the caller) and, where not
    /// null, timestamps into `queries`.
    void start(VkCommandBuffer cmd, VkDescriptorPool descriptors, VkQueryPool queries);

    const device& dev_;
    VkCommandBuffer cmd_ = VK_NULL_HANDLE;
    VkDescriptorPool descriptors_ = VK_NULL_HANDLE;
    VkQueryPool queries_ = VK_NULL_HANDLE;
    std::uint32_t max_groups_[3] = {0, 0, 0};
    std::uint32_t dispatches_ = 0;
    std::uint32_t sets_ = 0;  // taken from descriptors_
    std::uint64_t commands_ = 0;
    /// Where the descriptor pool is full: an executor (whose command buffer may hold a sequence of
    /// calls) takes another pool, kept for the next begin(); an external_recorder (one call, which
    /// its plan keeps within a pool) refuses.
    bool grows_descriptors_ = false;
    std::vector<descriptor_pool_handle> more_pools_;
    std::size_t more_used_ = 0;
    std::uint32_t stamps_ = 0;  // timestamps written in this command buffer
    std::vector<std::byte> push_copy_;
    bool dry_ = false;  // dry_recorder: records nothing
};

/// Goes through a call's recording without a command buffer: every pipeline it dispatches is built
/// (and its scratch allocated), nothing is recorded. What a planned call does when it is made, so
/// that its first record costs what later ones do.
class dry_recorder : public recorder {
public:
    dry_recorder(const device& dev, std::uint32_t max_workgroup_count);
};

/// A descriptor pool for up to 1,024 dispatches (what one call may record).
descriptor_pool_handle make_descriptor_pool(const device& dev);

/// Records one call's work into its own command buffer and submits it once.
class executor : public recorder {
public:
    executor(const device& dev, std::uint32_t max_workgroup_count, std::uint32_t lose_device_at_submit = 0);

    void begin();
    /// Ends, submits, waits. Returns the device time in milliseconds (0 without timestamps).
    double submit_and_wait();
    /// After submit_and_wait: device time from the start of the command buffer to each mark, in
    /// milliseconds, in order (empty without timestamps).
    [[nodiscard]] const std::vector<double>& marks_ms() const { return marks_ms_; }

private:
    command_pool_handle pool_;
    VkCommandBuffer own_cmd_ = VK_NULL_HANDLE;  // freed with pool_
    descriptor_pool_handle descriptor_pool_;
    fence_handle fence_;
    query_pool_handle query_pool_;
    std::uint32_t submits_ = 0, lose_at_submit_ = 0;
    std::vector<double> marks_ms_;
};

/// Records into a caller's command buffer (a recorded call: plan once, record many times). Owns
/// the descriptor sets of what it records, which stay valid until it is destroyed: keep it until
/// the command buffer has completed. Submits nothing; no timestamps.
class external_recorder : public recorder {
public:
    external_recorder(const device& dev, std::uint32_t max_workgroup_count, VkCommandBuffer cmd);

private:
    descriptor_pool_handle descriptor_pool_;
};

}  // namespace qkv::vulkan::detail
