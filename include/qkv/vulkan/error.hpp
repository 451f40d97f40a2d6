// The errors of qkv's run-time API. Every failure is one of these; the message names the problem.
// qkv::error and qkv::invalid_argument are qkv::runtime's (qkv/runtime/error.hpp); the Vulkan
// backend's errors derive from them.
//
//   qkv::error                      base of everything qkv throws
//   ├─ qkv::invalid_argument        bad input: shapes that do not fit together, a bad mask, ...
//   │                               nothing was computed; every object is as before
//   └─ qkv::vulkan::error           the Vulkan runtime failed
//      ├─ unavailable               no Vulkan loader, no device, no device matching the request
//      │  └─ no_matching_device     the device asked for (an index or a name, from the caller or
//      │                            QKV_DEVICE) names no usable device: a bad request, not a
//      │                            broken machine
//      ├─ limit_exceeded            the request is larger than a device limit; refused before any
//      │                            work was submitted; the context stays usable
//      ├─ out_of_memory             a host or device allocation failed; everything allocated for
//      │                            the call is released; the context stays usable
//      ├─ numeric_overflow          finite inputs too large for the chosen precision: a value or a
//      │                            score would not be finite in float32/float16; no result is
//      │                            returned; the context stays usable
//      ├─ not_complete              a recording's verdict asked for (recording::check) before its
//      │                            command buffer has completed: not submitted, or still running
//      └─ device_lost               VK_ERROR_DEVICE_LOST: the context must be recreated
#pragma once

#include <stdexcept>
#include <string>

#include "qkv/runtime/error.hpp"
#include "qkv/vulkan/export.hpp"

namespace qkv {
namespace vulkan {

class QKV_VULKAN_API error : public qkv::error {
public:
    using qkv::error::error;
};

class QKV_VULKAN_API unavailable : public error {
public:
    using error::error;
};

class QKV_VULKAN_API no_matching_device : public unavailable {
public:
    using unavailable::unavailable;
};

class QKV_VULKAN_API limit_exceeded : public error {
public:
    using error::error;
};

class QKV_VULKAN_API out_of_memory : public error {
public:
    using error::error;
};

/// Finite inputs whose projections, scores or value sums leave the range the Vulkan backend
/// computes in (float32, or float16 storage for Q, K, V). The message names the stage and the
/// magnitude. Nothing is returned; use fp32 instead of fp16, scale the inputs down, or the float64
/// CPU backend.
class QKV_VULKAN_API numeric_overflow : public error {
public:
    using error::error;
};

/// recording::check() (qkv/vulkan/interop.hpp) called before the recorded commands have completed:
/// the command buffer was not submitted, or is still running. The verdict is unknown, so nothing is
/// returned; call check() again after the caller's fence (or timeline semaphore) wait.
class QKV_VULKAN_API not_complete : public error {
public:
    using error::error;
};

class QKV_VULKAN_API device_lost : public error {
public:
    using error::error;
};

}  // namespace vulkan
}  // namespace qkv
