#include "vk/pipelines.hpp"

#include <atomic>
#include <string>

#include "qkv/vulkan/error.hpp"
#include "vk/check.hpp"

namespace qkv::vulkan::detail {

pipeline_set::pipeline_set(const device& dev) : dev_(dev), cache_(dev.fn(), dev.handle()) {
    auto info = vk_struct<VkPipelineCacheCreateInfo>(VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO);
    check(dev_.fn().vkCreatePipelineCache(dev_.handle(), &info, nullptr, cache_.put()), "vkCreatePipelineCache");
}

namespace {

std::atomic<std::size_t> pipelines_made{0};

/// The descriptor types of a shader's bindings, from its row of the shader table.
std::vector<VkDescriptorType> binding_types(shader_id shader) {
    std::vector<VkDescriptorType> types;
    for (const char c : describe(shader).bindings)
        types.push_back(c == 't' ? VK_DESCRIPTOR_TYPE_UNIFORM_TEXEL_BUFFER : VK_DESCRIPTOR_TYPE_STORAGE_BUFFER);
    return types;
}

}  // namespace

std::size_t pipeline_set::created() noexcept { return pipelines_made.load(std::memory_order_relaxed); }

const pipeline& pipeline_set::get_words(shader_id shader, const std::vector<std::uint32_t>& spec,
                                        std::uint32_t required_subgroup) {
    if (spec.size() * 4 != describe(shader).spec_bytes)
        throw error(std::string("internal: ") + std::to_string(spec.size()) + " specialization constants for shader " +
                    shader_name(shader) + ", whose row in shader_table.def has " +
                    std::to_string(describe(shader).spec_bytes / 4));
    auto key = std::make_pair(shader, spec);
    key.second.push_back(required_subgroup);
    if (auto it = pipelines_.find(key); it != pipelines_.end()) return it->second;

    const std::vector<VkDescriptorType> types = binding_types(shader);
    const std::uint32_t push_size = describe(shader).push_bytes;
    const auto bindings = static_cast<std::uint32_t>(types.size());

    const auto& fn = dev_.fn();
    const VkDevice d = dev_.handle();
    const std::string what = std::string(" (shader ") + shader_name(shader) + ")";
    // Each object is owned as soon as it exists: a failure below destroys those made before it.
    pipeline p;
    p.set_layout = set_layout_handle(fn, d);
    p.layout = pipeline_layout_handle(fn, d);
    p.handle = pipeline_handle(fn, d);
    p.bindings = bindings;
    p.push_size = push_size;
    p.types = types;
    std::vector<VkDescriptorSetLayoutBinding> slots(bindings);
    for (std::uint32_t i = 0; i < bindings; ++i) slots[i] = {i, types[i], 1, VK_SHADER_STAGE_COMPUTE_BIT, nullptr};
    auto set_info = vk_struct<VkDescriptorSetLayoutCreateInfo>(VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO);
    set_info.bindingCount = bindings;
    set_info.pBindings = slots.data();
    check(fn.vkCreateDescriptorSetLayout(d, &set_info, nullptr, p.set_layout.put()),
          "vkCreateDescriptorSetLayout" + what);

    const VkPushConstantRange range{VK_SHADER_STAGE_COMPUTE_BIT, 0, push_size};
    const VkDescriptorSetLayout set_layout = p.set_layout.get();
    auto layout_info = vk_struct<VkPipelineLayoutCreateInfo>(VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO);
    layout_info.setLayoutCount = 1;
    layout_info.pSetLayouts = &set_layout;
    layout_info.pushConstantRangeCount = push_size ? 1u : 0u;
    layout_info.pPushConstantRanges = &range;
    check(fn.vkCreatePipelineLayout(d, &layout_info, nullptr, p.layout.put()), "vkCreatePipelineLayout" + what);

    const auto code = spirv(shader);
    shader_module_handle module(fn, d);  // needed only until the pipeline exists
    auto module_info = vk_struct<VkShaderModuleCreateInfo>(VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO);
    module_info.codeSize = code.size_bytes();
    module_info.pCode = code.data();
    check(fn.vkCreateShaderModule(d, &module_info, nullptr, module.put()), "vkCreateShaderModule" + what);

    std::vector<VkSpecializationMapEntry> entries(spec.size());
    for (std::uint32_t i = 0; i < spec.size(); ++i)
        entries[i] = {i, i * static_cast<std::uint32_t>(sizeof(std::uint32_t)), sizeof(std::uint32_t)};
    const VkSpecializationInfo spec_info{static_cast<std::uint32_t>(entries.size()), entries.data(),
                                         spec.size() * sizeof(std::uint32_t), spec.data()};
    auto info = vk_struct<VkComputePipelineCreateInfo>(VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO);
    info.stage = vk_struct<VkPipelineShaderStageCreateInfo>(VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO);
    info.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
    info.stage.module = module.get();
    info.stage.pName = "main";
    info.stage.pSpecializationInfo = spec.empty() ? nullptr : &spec_info;
    auto size_info = vk_struct<VkPipelineShaderStageRequiredSubgroupSizeCreateInfo>(
        VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_REQUIRED_SUBGROUP_SIZE_CREATE_INFO);
    if (required_subgroup) {
        const subgroup_control& sc = dev_.subgroups();
        if (!sc.required_size || !sc.full_subgroups || required_subgroup < sc.min_size ||
            required_subgroup > sc.max_size)
            throw error("internal: subgroup size " + std::to_string(required_subgroup) + " required" + what +
                        " but the device does not offer it");
        size_info.requiredSubgroupSize = required_subgroup;
        info.stage.pNext = &size_info;
        info.stage.flags |= VK_PIPELINE_SHADER_STAGE_CREATE_REQUIRE_FULL_SUBGROUPS_BIT;
    }
    info.layout = p.layout.get();
    check(fn.vkCreateComputePipelines(d, cache_.get(), 1, &info, nullptr, p.handle.put()),
          "vkCreateComputePipelines" + what);
    pipelines_made.fetch_add(1, std::memory_order_relaxed);
    return pipelines_.emplace(std::move(key), std::move(p)).first->second;
}

}  // namespace qkv::vulkan::detail
