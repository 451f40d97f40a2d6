// The device objects of the Python package: qkv.Device (a device_info), qkv.Context, qkv.Tensor
// and qkv.KVCache. A Tensor and a KVCache hold the Context they were made on (the C++ objects
// keep the device alive by themselves; the Python ones also keep the context, for the calls).
#pragma once

#include <pybind11/pybind11.h>

#include <memory>

#include "qkv/vulkan/context.hpp"
#include "qkv/vulkan/kv_cache.hpp"
#include "qkv/vulkan/tensor.hpp"

namespace qkv::python {

struct py_tensor {
    std::shared_ptr<qkv::vulkan::context> context;
    qkv::vulkan::tensor tensor;
};

struct py_kv_cache {
    std::shared_ptr<qkv::vulkan::context> context;
    qkv::vulkan::kv_cache cache;
};

void bind_objects(pybind11::module_& m);

}  // namespace qkv::python
