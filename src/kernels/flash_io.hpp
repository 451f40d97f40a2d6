// The buffers a fused kernel of either family binds (the recording side of flash_layout.hpp).
#pragma once

#include "vk/executor.hpp"

namespace qkv::vulkan::detail {

/// The buffers a fused kernel reads and writes. `state` holds (max, sum) per (batch, head, row):
/// needed when the keys are split into chunks or the weights are asked for. `params`: the score
/// rules' values (contract/score.h), read only where layout.features is set; `lse`: one float per
/// (batch, head, row), written only with SCORE_LSE. Left empty (a null buffer) they are bound to
/// qkv and out, which the kernels then never touch through them.
struct flash_io {
    binding qkv, mask_bits, additive, out, state;
    binding params{}, lse{};
    [[nodiscard]] binding params_or_any() const { return params.buffer != VK_NULL_HANDLE ? params : qkv; }
    [[nodiscard]] binding lse_or_any() const { return lse.buffer != VK_NULL_HANDLE ? lse : out; }
};

}  // namespace qkv::vulkan::detail
