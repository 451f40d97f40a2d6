// qkv's typed errors as Python exceptions (qkv/_errors.py defines the classes): every C++ error
// becomes the class of its kind with the C++ message, unchanged.
//
//   qkv::invalid_argument               qkv.InvalidArgument (ValueError)
//   qkv::vulkan::limit_exceeded         qkv.LimitExceeded (ValueError)
//   qkv::vulkan::numeric_overflow       qkv.NumericOverflow (ArithmeticError)
//   qkv::vulkan::no_matching_device     qkv.NoMatchingDevice (qkv.Unavailable)
//   qkv::vulkan::unavailable            qkv.Unavailable (RuntimeError)
//   qkv::vulkan::device_lost            qkv.DeviceLost (RuntimeError)
//   qkv::vulkan::out_of_memory          qkv.OutOfMemory (MemoryError), as is std::bad_alloc
//   qkv::vulkan::error                  qkv.VulkanError (RuntimeError)
//   qkv::mpi::timeout, qkv::mpi::error  qkv.mpi.Timeout (TimeoutError), qkv.mpi.MPIError (RuntimeError)
//   qkv::error                          qkv.Error, the base of them all
#pragma once

#include <pybind11/pybind11.h>

namespace qkv::python {

/// Registers the translator (once, with the module).
void bind_errors(pybind11::module_& m);

}  // namespace qkv::python
