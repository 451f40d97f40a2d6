// Must not compile under -Werror: the backward's recording, discarded at once, would free what its
// commands use before they run (record() is [[nodiscard]] for every call it records).
#include <qkv/vulkan/interop.hpp>

void record_and_forget(qkv::vulkan::sdpa_backward_call& call, VkCommandBuffer cmd,
                       const qkv::vulkan::sdpa_backward_tensors& t) {
    qkv::vulkan::record(call, cmd, t);
}
