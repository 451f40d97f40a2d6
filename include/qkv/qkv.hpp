// qkv — transformer self-attention, computed by the compiler.
// The umbrella header of the header-only constexpr core (no Vulkan here: see qkv/vulkan/).
#pragma once

#include "qkv/attention.hpp"
#include "qkv/attention_backward.hpp"
#include "qkv/dropout.hpp"
#include "qkv/mask.hpp"
#include "qkv/math.hpp"
#include "qkv/matrix.hpp"
#include "qkv/multi_head.hpp"
#include "qkv/philox.hpp"
#include "qkv/sdpa.hpp"
#include "qkv/sdpa_backward.hpp"
#include "qkv/softmax.hpp"
#include "qkv/staged.hpp"
#include "qkv/staged_backward.hpp"
#include "qkv/version.hpp"
