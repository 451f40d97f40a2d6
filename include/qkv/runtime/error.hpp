// The base errors of qkv's run-time API, shared by every backend. Every failure is one of these;
// the message names the problem.
//
//   qkv::error                      base of everything qkv throws
//   ├─ qkv::invalid_argument        bad input: shapes that do not fit together, a bad mask, ...
//   │                               nothing was computed; every object is as before
//   └─ qkv::vulkan::error           the Vulkan runtime failed (qkv/vulkan/error.hpp)
#pragma once

#include <stdexcept>
#include <string>

#include "qkv/runtime/export.hpp"

namespace qkv {

class QKV_RUNTIME_API error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

class QKV_RUNTIME_API invalid_argument : public error {
public:
    using error::error;
};

}  // namespace qkv
