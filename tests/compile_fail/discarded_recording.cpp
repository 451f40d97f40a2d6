// Must not compile under -Werror: a recording discarded at once would free what its commands use
// before they run (record() and record_append() are [[nodiscard]]).
#include <qkv/vulkan/interop.hpp>

void record_and_forget(qkv::vulkan::sdpa_call& call, VkCommandBuffer cmd, const qkv::vulkan::sdpa_tensors& t) {
    qkv::vulkan::record(call, cmd, t);
}
