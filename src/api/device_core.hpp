// The device side every call shares: instance, device, memory, pipelines and the executor, with
// the lock that serialises their use. Owned jointly (std::shared_ptr) by a context and every
// kv_cache made from it, so whichever of them goes last releases the device.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "qkv/vulkan/context.hpp"
#include "qkv/vulkan/error.hpp"
#include "qkv/vulkan/testing.hpp"
#include "vk/device.hpp"
#include "vk/executor.hpp"
#include "vk/instance.hpp"
#include "vk/memory.hpp"
#include "vk/pipelines.hpp"

namespace qkv::vulkan::detail {

/// Counts the live objects that hold one, one count per Tag (testing::live).
template <class Tag>
class live_count {
public:
    live_count() noexcept { n.fetch_add(1, std::memory_order_relaxed); }
    live_count(const live_count&) noexcept { n.fetch_add(1, std::memory_order_relaxed); }
    live_count& operator=(const live_count&) noexcept = default;
    ~live_count() { n.fetch_sub(1, std::memory_order_relaxed); }
    [[nodiscard]] static std::size_t now() noexcept { return n.load(std::memory_order_relaxed); }

private:
    static inline std::atomic<std::size_t> n{0};
};

/// What a recording into a caller's command buffer leaves behind when it is destroyed before qkv
/// knows its commands have completed: its scratch and descriptor sets, kept until they have
/// (finished() says so), then released. Never a driver's use-after-free.
struct retired {
    retired() = default;
    retired(const retired&) = delete;
    retired& operator=(const retired&) = delete;
    virtual ~retired() = default;
    /// Whether its commands have completed (the lock held).
    [[nodiscard]] virtual bool finished() const = 0;
    /// What must be let go of after the lock (a kv_cache it kept alive takes the lock itself).
    [[nodiscard]] virtual std::shared_ptr<void> after_lock() = 0;
};

struct device_core {
    std::shared_ptr<const instance> inst;
    std::unique_ptr<device> dev;
    std::unique_ptr<allocator> alloc;
    std::unique_ptr<pipeline_set> pipes;
    std::unique_ptr<executor> exec;
    /// Retired recordings whose commands had not completed when they were destroyed (declared
    /// after the device objects: released before them, at the latest when the last object that
    /// shares this core goes). A retiree holds nothing that holds the core (no kv_cache, no
    /// reference to it), so no cycle keeps the core alive. Guarded by `mutex`.
    std::vector<std::unique_ptr<retired>> retirees;
    /// Serialises every use of the device, its queue, the executor and the buffers of the contexts
    /// and caches that share this core.
    std::mutex mutex;
    bool lost = false;  ///< an earlier call lost the device (VK_ERROR_DEVICE_LOST); guarded by `mutex`
    live_count<device_core> counted;

    /// Picks and opens the device `options` asks for (QKV_DEVICE where unset).
    device_core(const context_options& options, const testing::hooks& hooks);
    /// The caller's device (interop.hpp: make_context), seen through `inst`.
    device_core(std::shared_ptr<const instance> inst, const external_handles& handles, const context_options& options,
                const testing::hooks& hooks);

    /// Throws device_lost when an earlier call lost the device. Call with `mutex` held.
    void check_alive() const;

    /// Releases the retirees whose commands have completed (with `mutex` held); returns what must
    /// be let go of after the lock.
    [[nodiscard]] std::vector<std::shared_ptr<void>> reclaim() noexcept;

    /// Runs `work` (with `mutex` held) and returns what it returns: device_lost marks the core
    /// lost for every later call, and a host allocation failure becomes out_of_memory naming `what`.
    template <class Work>
    decltype(auto) guarded(const char* what, Work&& work) {
        try {
            return work();
        } catch (const device_lost&) {
            lost = true;
            throw;
        } catch (const std::bad_alloc&) {
            throw out_of_memory(std::string("host memory allocation failed in ") + what);
        }
    }
};

}  // namespace qkv::vulkan::detail
