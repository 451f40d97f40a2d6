// qkv.tutorial's C++ side (tutorial.cpp): the worked example's matrices, proven at compile time,
// and the walkthrough of `qkv example`.
#pragma once

#include <pybind11/pybind11.h>

namespace qkv::python {

void bind_tutorial(pybind11::module_& m);

}  // namespace qkv::python
