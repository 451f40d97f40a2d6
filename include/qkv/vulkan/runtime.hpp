// qkv's run-time API in one include: the problem description, the errors, the Vulkan context and
// the CPU reference backend. Needs the qkv::vulkan library.
#pragma once

#include "qkv/runtime/sdpa.hpp"
#include "qkv/vulkan/context.hpp"
#include "qkv/vulkan/cpu.hpp"
#include "qkv/vulkan/error.hpp"
#include "qkv/vulkan/kv_cache.hpp"
#include "qkv/vulkan/problem.hpp"
