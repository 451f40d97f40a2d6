// qkv's run-time API in one include: the problem descriptions, the errors, the CPU reference
// backend, and the Vulkan backend's objects (context, kv_cache, tensors, planned calls,
// sequences). Needs the qkv::vulkan library; qkv/vulkan/interop.hpp (the caller's own device and
// command buffers) and qkv/vulkan/testing.hpp (test and measurement hooks) are apart.
#pragma once

#include "qkv/runtime/cpu.hpp"
#include "qkv/runtime/problem.hpp"
#include "qkv/runtime/sdpa.hpp"
#include "qkv/runtime/sdpa_backward.hpp"
#include "qkv/vulkan/attention_call.hpp"
#include "qkv/vulkan/context.hpp"
#include "qkv/vulkan/error.hpp"
#include "qkv/vulkan/kv_cache.hpp"
#include "qkv/vulkan/paged_call.hpp"
#include "qkv/vulkan/sdpa_backward_call.hpp"
#include "qkv/vulkan/sdpa_call.hpp"
#include "qkv/vulkan/sequence.hpp"
#include "qkv/vulkan/tensor.hpp"
