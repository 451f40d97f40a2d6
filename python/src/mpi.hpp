// qkv.mpi's C++ side (mpi.cpp): context parallelism over an mpi4py communicator, where qkv::mpi
// is built; elsewhere only `_has_mpi = False`.
#pragma once

#include <pybind11/pybind11.h>

namespace qkv::python {

void bind_mpi(pybind11::module_& m);

}  // namespace qkv::python
