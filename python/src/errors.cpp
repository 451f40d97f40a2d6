// qkv's typed errors as Python exceptions (errors.hpp).
#include "errors.hpp"

#include <exception>
#include <new>
#include <string>

#include "qkv/runtime/error.hpp"
#include "qkv/vulkan/error.hpp"
#ifdef QKV_PYTHON_WITH_MPI
#include "qkv/mpi/error.hpp"
#endif

namespace qkv::python {
namespace {

namespace py = pybind11;

/// The classes of qkv/_errors.py, held for the life of the interpreter (never released: the
/// translator may run while the interpreter finalises).
struct error_classes {
    py::handle error, invalid_argument, limit_exceeded, numeric_overflow, unavailable, no_matching_device, device_lost,
        out_of_memory, vulkan_error, mpi_error, mpi_timeout;
};

error_classes& classes() {
    static error_classes c;
    return c;
}

void raise(py::handle type, const char* message) { PyErr_SetString(type.ptr(), message); }

}  // namespace

void bind_errors(py::module_& m) {
    const py::module_ errors = py::module_::import("qkv._errors");
    error_classes& c = classes();
    const auto get = [&](const char* name) { return py::object(errors.attr(name)).release(); };
    c.error = get("Error");
    c.invalid_argument = get("InvalidArgument");
    c.limit_exceeded = get("LimitExceeded");
    c.numeric_overflow = get("NumericOverflow");
    c.unavailable = get("Unavailable");
    c.no_matching_device = get("NoMatchingDevice");
    c.device_lost = get("DeviceLost");
    c.out_of_memory = get("OutOfMemory");
    c.vulkan_error = get("VulkanError");
    c.mpi_error = get("MPIError");
    c.mpi_timeout = get("Timeout");
    // For qkv's tests: throws the C++ error of `kind` with `message`, so that every mapping is seen,
    // the kinds a healthy machine cannot produce on demand included.
    m.def(
        "_raise",
        [](const std::string& kind, const std::string& message) {
            if (kind == "error") throw qkv::error(message);
            if (kind == "invalid_argument") throw qkv::invalid_argument(message);
            if (kind == "vulkan::error") throw qkv::vulkan::error(message);
            if (kind == "unavailable") throw qkv::vulkan::unavailable(message);
            if (kind == "no_matching_device") throw qkv::vulkan::no_matching_device(message);
            if (kind == "limit_exceeded") throw qkv::vulkan::limit_exceeded(message);
            if (kind == "out_of_memory") throw qkv::vulkan::out_of_memory(message);
            if (kind == "numeric_overflow") throw qkv::vulkan::numeric_overflow(message);
            if (kind == "device_lost") throw qkv::vulkan::device_lost(message);
            if (kind == "bad_alloc") throw std::bad_alloc();
#ifdef QKV_PYTHON_WITH_MPI
            if (kind == "mpi::error") throw qkv::mpi::error(message);
            if (kind == "mpi::timeout") throw qkv::mpi::timeout(message);
#endif
            throw qkv::invalid_argument("_raise: unknown kind " + kind);
        },
        py::arg("kind"), py::arg("message"));
    py::register_exception_translator([](std::exception_ptr p) {
        const error_classes& e = classes();
        try {
            if (p) std::rethrow_exception(p);
        } catch (const qkv::vulkan::no_matching_device& x) {
            raise(e.no_matching_device, x.what());
        } catch (const qkv::vulkan::unavailable& x) {
            raise(e.unavailable, x.what());
        } catch (const qkv::vulkan::limit_exceeded& x) {
            raise(e.limit_exceeded, x.what());
        } catch (const qkv::vulkan::out_of_memory& x) {
            raise(e.out_of_memory, x.what());
        } catch (const qkv::vulkan::numeric_overflow& x) {
            raise(e.numeric_overflow, x.what());
        } catch (const qkv::vulkan::device_lost& x) {
            raise(e.device_lost, x.what());
        } catch (const qkv::vulkan::error& x) {
            raise(e.vulkan_error, x.what());
#ifdef QKV_PYTHON_WITH_MPI
        } catch (const qkv::mpi::timeout& x) {
            raise(e.mpi_timeout, x.what());
        } catch (const qkv::mpi::error& x) {
            raise(e.mpi_error, x.what());
#endif
        } catch (const qkv::invalid_argument& x) {
            raise(e.invalid_argument, x.what());
        } catch (const qkv::error& x) {
            raise(e.error, x.what());
        } catch (const std::bad_alloc&) {
            raise(e.out_of_memory, "out of host memory (std::bad_alloc)");
        }
    });
}

}  // namespace qkv::python
