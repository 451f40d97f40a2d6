// Compute pipelines, built once per device (through a pipeline cache) for each shader and set of
// specialization constants, and kept for the context's lifetime.
#pragma once

#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <type_traits>
#include <vector>

#include "vk/device.hpp"
#include "vk/shaders.hpp"
#include "vk/vk_handle.hpp"

namespace qkv::vulkan::detail {

struct pipeline {
    set_layout_handle set_layout;  // destroyed last (members are destroyed in reverse order)
    pipeline_layout_handle layout;
    pipeline_handle handle;
    std::uint32_t bindings = 0;
    std::uint32_t push_size = 0;
    std::vector<VkDescriptorType> types;  ///< of bindings 0..n-1
};

class pipeline_set {
public:
    explicit pipeline_set(const device& dev);
    pipeline_set(const pipeline_set&) = delete;
    pipeline_set& operator=(const pipeline_set&) = delete;

    /// The pipeline for `shader` specialised with `spec`, the contract's struct for it (member n is
    /// constant_id n; its row in shaders/shader_table.def names the struct, and the size is checked
    /// against it); its bindings and push-constant size come from the same row.
    /// `required_subgroup` (not 0): the pipeline runs with exactly that subgroup size and full
    /// subgroups (VK_EXT_subgroup_size_control; only where device::subgroups() allows it).
    template <class Spec>
    const pipeline& get(shader_id shader, const Spec& spec, std::uint32_t required_subgroup = 0) {
        static_assert(std::is_trivially_copyable_v<Spec> && sizeof(Spec) % 4 == 0,
                      "a specialization struct holds 32-bit members only");
        std::vector<std::uint32_t> words(sizeof(Spec) / 4);
        std::memcpy(words.data(), &spec, sizeof(Spec));
        return get_words(shader, words, required_subgroup);
    }
    /// The pipeline of a shader without specialization constants (QKV_NO_SPEC).
    const pipeline& get(shader_id shader) { return get_words(shader, {}, 0); }

    [[nodiscard]] const device& dev() const { return dev_; }

    [[nodiscard]] std::size_t size() const { return pipelines_.size(); }

    /// How many pipelines every pipeline_set of this process has created (testing::pipelines_created).
    [[nodiscard]] static std::size_t created() noexcept;

private:
    /// Throws error (internal) when `spec` is not as many words as the shader's row says.
    const pipeline& get_words(shader_id shader, const std::vector<std::uint32_t>& spec,
                              std::uint32_t required_subgroup);

    const device& dev_;
    pipeline_cache_handle cache_;  // destroyed after the pipelines
    // Keyed by shader, then the specialization constants followed by the required subgroup size.
    std::map<std::pair<shader_id, std::vector<std::uint32_t>>, pipeline> pipelines_;
};

}  // namespace qkv::vulkan::detail
