// Opening a Vulkan context for the tool, and running a problem on the backend --backend names.
#include "backend.hpp"

#include <utility>

#include "qkv/runtime/cpu.hpp"
#include "qkv/vulkan/context.hpp"
#include "qkv/vulkan/error.hpp"

namespace qkv::cli {
namespace {

std::string describe(const qkv::vulkan::device_info& d) {
    return d.name + " \u2014 " + qkv::vulkan::to_string(d.type) + ", Vulkan " + d.api_version_string + ", driver " +
           d.driver;
}

}  // namespace

qkv::vulkan::context open_context(const std::string& device, bool cpu_backend,
                                  const qkv::vulkan::testing::hooks& hooks) {
    try {
        return qkv::vulkan::testing::make_context(
            {.device = device.empty() ? std::nullopt : std::optional<std::string>(device)}, hooks);
    } catch (const qkv::vulkan::no_matching_device& e) {  // a bad request, not a missing Vulkan
        if (!device.empty()) throw qkv::vulkan::no_matching_device("--device " + device + ": " + e.what());
        throw;  // QKV_DEVICE: the message names the variable
    } catch (const qkv::vulkan::unavailable& e) {
        if (!device.empty() || !cpu_backend) throw;
        throw qkv::vulkan::unavailable(std::string(e.what()) +
                                       "\nqkv: run with --backend cpu to use the CPU reference backend instead");
    }
}

backend_result run_attention(const qkv::attention_problem& problem, backend choice,
                             const std::optional<std::string>& device) {
    if (choice == backend::cpu)
        return {qkv::cpu::attention(problem),
                "the CPU reference backend (qkv::cpu, float64 on the host); no Vulkan device was used"};
    qkv::vulkan::context ctx = open_context(device.value_or(std::string()));
    qkv::attention_output result = ctx.attention(problem);
    return {std::move(result), describe(ctx.device())};
}

}  // namespace qkv::cli
