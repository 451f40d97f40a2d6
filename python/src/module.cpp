// qkv._qkv: the extension module of the Python package `qkv` (python/qkv). The Python layer
// (qkv/__init__.py, _sdpa.py, flash_attn.py, mpi.py, tutorial.py) is the public interface; this
// module holds what needs C++: reading arrays, the calls, the device objects, the errors and the
// compile-time tutorial.
#include <pybind11/pybind11.h>

#include "arrays.hpp"
#include "calls.hpp"
#include "errors.hpp"
#include "mpi.hpp"
#include "objects.hpp"
#include "qkv/version.hpp"
#include "tutorial.hpp"

PYBIND11_MODULE(_qkv, m) {
    m.doc() = "The C++ side of the qkv package; use the package `qkv`.";
    m.attr("__version__") = qkv::version_string;
    qkv::python::bind_errors(m);
    qkv::python::bind_arrays(m);
    qkv::python::bind_objects(m);
    qkv::python::bind_calls(m);
    qkv::python::bind_varlen(m);
    qkv::python::bind_paged(m);
    qkv::python::bind_tutorial(m);
    qkv::python::bind_mpi(m);
}
