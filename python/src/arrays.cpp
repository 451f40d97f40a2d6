// Host arrays between Python and qkv (arrays.hpp).
#include "arrays.hpp"

#include <dlpack/dlpack.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <string_view>
#include <utility>

#include "qkv/runtime/element_type.hpp"
#include "qkv/runtime/error.hpp"
#include "qkv/runtime/half.hpp"
#include "qkv/vulkan/error.hpp"

namespace qkv::python {
namespace {

static_assert(std::endian::native == std::endian::little, "qkv's Python package reads little-endian arrays");

std::size_t item_size(dtype t) {
    switch (t) {
        case dtype::f32:
        case dtype::i32:
            return 4;
        case dtype::f16:
        case dtype::bf16:
            return 2;
        case dtype::f64:
        case dtype::i64:
            return 8;
        case dtype::boolean:
            return 1;
    }
    return 0;
}

[[noreturn]] void refuse(const std::string& message) { throw qkv::invalid_argument(message); }

/// The element type of a buffer's struct-module format with elements of `itemsize` bytes, or none.
/// The C integer formats name their size by platform ('l' is 8 bytes on Linux, 4 on Windows):
/// the item size decides between int32 and int64.
bool format_type(std::string_view format, py::ssize_t itemsize, dtype& out) {
    if (!format.empty() && (format.front() == '@' || format.front() == '=' || format.front() == '<'))
        format.remove_prefix(1);
    if (format == "i" || format == "l" || format == "q") {
        if (itemsize != 4 && itemsize != 8) return false;
        out = itemsize == 4 ? dtype::i32 : dtype::i64;
        return true;
    }
    if (format == "f")
        out = dtype::f32;
    else if (format == "e")
        out = dtype::f16;
    else if (format == "d")
        out = dtype::f64;
    else if (format == "?")
        out = dtype::boolean;
    else
        return false;
    return true;
}

host_array from_buffer(py::handle object, const std::string& name) {
    auto view = std::make_unique<Py_buffer>();
    if (PyObject_GetBuffer(object.ptr(), view.get(), PyBUF_RECORDS_RO) != 0) throw py::error_already_set();
    // Released with the GIL held, whichever thread lets go of the array last.
    std::shared_ptr<Py_buffer> owner(view.release(), [](Py_buffer* b) {
        py::gil_scoped_acquire gil;
        PyBuffer_Release(b);
        delete b;
    });
    host_array a;
    const std::string format = owner->format ? owner->format : "B";
    if (!format_type(format, owner->itemsize, a.type))
        refuse(name + ": elements of buffer format '" + format + "' (" + std::to_string(owner->itemsize) +
               " bytes) are not supported: qkv reads float32, float16, bfloat16 (torch), float64 (device=\"cpu\"), "
               "bool (masks) and int32 / int64 (indices)");
    if (static_cast<std::size_t>(owner->itemsize) != item_size(a.type))
        refuse(name + ": buffer format '" + format + "' with " + std::to_string(owner->itemsize) + "-byte elements");
    const auto item = static_cast<std::ptrdiff_t>(owner->itemsize);
    for (int d = 0; d < owner->ndim; ++d) {
        a.shape.push_back(static_cast<std::size_t>(owner->shape[d]));
        const std::ptrdiff_t stride = owner->strides ? owner->strides[d] : 0;
        if (stride % item != 0)
            refuse(name + ": stride " + std::to_string(stride) + " bytes of dimension " + std::to_string(d) +
                   " is not a whole number of " + std::to_string(item) + "-byte elements");
        a.strides.push_back(stride / item);
    }
    if (!owner->strides) {  // C-contiguous (PyBUF_RECORDS_RO asks for strides; kept for safety)
        std::ptrdiff_t s = 1;
        for (std::size_t d = a.shape.size(); d-- > 0;) {
            a.strides[d] = s;
            s *= static_cast<std::ptrdiff_t>(a.shape[d]);
        }
    }
    a.data = static_cast<const std::byte*>(owner->buf);
    a.owner = std::move(owner);
    return a;
}

host_array from_dlpack(py::handle object, const std::string& name) {
    py::object capsule;
    try {
        capsule = object.attr("__dlpack__")();
    } catch (py::error_already_set& e) {  // torch: sparse, conjugate, a dtype DLPack lacks, ...
        refuse(name + ": it cannot be read through __dlpack__: " + e.what());
    }
    PyObject* c = capsule.ptr();
    if (!PyCapsule_IsValid(c, "dltensor"))
        throw py::type_error(name + ": __dlpack__() did not return an unused \"dltensor\" capsule");
    auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(c, "dltensor"));
    if (managed == nullptr) throw py::error_already_set();
    // Ours now: the capsule must not delete it when it goes (DLPack's protocol).
    if (PyCapsule_SetName(c, "used_dltensor") != 0) throw py::error_already_set();
    std::shared_ptr<DLManagedTensor> owner(managed, [](DLManagedTensor* m) {
        py::gil_scoped_acquire gil;  // the producer's deleter may reach the interpreter
        if (m->deleter) m->deleter(m);
    });
    const DLTensor& t = owner->dl_tensor;
    if (t.device.device_type != kDLCPU && t.device.device_type != kDLCUDAHost)
        refuse(name + ": the tensor is not in host memory (DLPack device type " +
               std::to_string(static_cast<int>(t.device.device_type)) +
               "); qkv reads host arrays: move it to the CPU first (tensor.cpu())");
    host_array a;
    const DLDataType dt = t.dtype;
    if (dt.lanes != 1) refuse(name + ": vector elements (DLPack lanes " + std::to_string(dt.lanes) + ")");
    if (dt.code == kDLFloat && dt.bits == 32)
        a.type = dtype::f32;
    else if (dt.code == kDLFloat && dt.bits == 16)
        a.type = dtype::f16;
    else if (dt.code == kDLFloat && dt.bits == 64)
        a.type = dtype::f64;
    else if (dt.code == kDLBfloat && dt.bits == 16)
        a.type = dtype::bf16;
    else if ((dt.code == kDLUInt || dt.code == kDLInt || dt.code == 6 /* kDLBool, DLPack 0.8 */) && dt.bits == 8)
        a.type = dtype::boolean;
    else if (dt.code == kDLInt && dt.bits == 32)
        a.type = dtype::i32;
    else if (dt.code == kDLInt && dt.bits == 64)
        a.type = dtype::i64;
    else
        refuse(name + ": elements of DLPack type code " + std::to_string(dt.code) + ", " + std::to_string(dt.bits) +
               " bits, are not supported: qkv reads float32, float16, bfloat16, float64 (device=\"cpu\"), bool and "
               "int32 / int64 (indices)");
    if (t.ndim < 0) refuse(name + ": negative rank");
    for (int d = 0; d < t.ndim; ++d) {
        if (t.shape[d] < 0) refuse(name + ": negative dimension " + std::to_string(t.shape[d]));
        a.shape.push_back(static_cast<std::size_t>(t.shape[d]));
        a.strides.push_back(t.strides ? static_cast<std::ptrdiff_t>(t.strides[d]) : 0);
    }
    if (!t.strides) {  // compact row-major
        std::ptrdiff_t s = 1;
        for (std::size_t d = a.shape.size(); d-- > 0;) {
            a.strides[d] = s;
            s *= static_cast<std::ptrdiff_t>(a.shape[d]);
        }
    }
    a.data = static_cast<const std::byte*>(t.data) + t.byte_offset;
    a.owner = std::move(owner);
    return a;
}

float element_as_float(dtype t, const std::byte* p) {
    switch (t) {
        case dtype::f32: {
            float f;
            std::memcpy(&f, p, 4);
            return f;
        }
        case dtype::f16: {
            std::uint16_t h;
            std::memcpy(&h, p, 2);
            return qkv::from_half_bits(h);
        }
        case dtype::bf16: {
            std::uint16_t h;
            std::memcpy(&h, p, 2);
            return from_bf16_bits(h);
        }
        case dtype::f64:
        case dtype::boolean:
        case dtype::i32:
        case dtype::i64:
            break;
    }
    return 0;  // not reached: the callers refuse these types first
}

double element_as_double(dtype t, const std::byte* p) {
    if (t == dtype::f64) {
        double d;
        std::memcpy(&d, p, 8);
        return d;
    }
    return static_cast<double>(element_as_float(t, p));
}

/// Calls row(pointer, step in bytes, count, index) for every row of `a` (its last dimension), in
/// row-major order: index is the row's first element's position.
template <class F>
void each_row(const host_array& a, F&& row) {
    const std::size_t n = a.elements();
    if (n == 0) return;
    const std::size_t rank = a.rank(), item = item_size(a.type);
    if (rank == 0) {
        row(a.data, std::ptrdiff_t{0}, std::size_t{1}, std::size_t{0});
        return;
    }
    const std::size_t inner = a.shape[rank - 1];
    const std::ptrdiff_t inner_step = a.strides[rank - 1] * static_cast<std::ptrdiff_t>(item);
    std::vector<std::size_t> index(rank - 1, 0);
    const std::byte* start = a.data;
    for (std::size_t out = 0; out < n; out += inner) {
        row(start, inner_step, inner, out);
        for (std::size_t d = rank - 1; d-- > 0;) {
            const std::ptrdiff_t step = a.strides[d] * static_cast<std::ptrdiff_t>(item);
            if (++index[d] < a.shape[d]) {
                start += step;
                break;
            }
            start -= step * static_cast<std::ptrdiff_t>(a.shape[d] - 1);
            index[d] = 0;
        }
    }
}

void expect_count(const host_array& a, std::size_t count, const char* name) {
    if (a.elements() != count)
        refuse(std::string(name) + ": " + std::to_string(a.elements()) + " elements where " + std::to_string(count) +
               " were expected");
}

/// Round a float64 to float32 towards zero, and to odd when inexact: rounding that once more to a
/// narrower type (float16, bfloat16: far fewer significand bits) gives the correctly rounded
/// narrow value, with no double rounding.
float round_to_odd(double d) {
    if (!std::isfinite(d)) return static_cast<float>(d);
    float f = static_cast<float>(d);
    if (static_cast<double>(f) == d || std::isinf(f)) return f;
    if (std::fabs(static_cast<double>(f)) > std::fabs(d)) f = std::nextafter(f, 0.0f);
    auto bits = std::bit_cast<std::uint32_t>(f);
    bits |= 1u;
    return std::bit_cast<float>(bits);
}

/// The output's element at row-major position `i` of the permuted shape reads the source at
/// offsets[i]: precomputed once per call as an odometer over the output.
template <class F>
void each_output(const std::vector<std::size_t>& shape, const std::vector<std::size_t>& perm, F&& f) {
    const std::size_t rank = shape.size();
    std::size_t n = 1;
    for (const std::size_t d : shape) n *= d;
    if (perm.empty()) {
        for (std::size_t i = 0; i < n; ++i) f(i, i);
        return;
    }
    std::vector<std::size_t> src_stride(rank);  // row-major strides of the source shape
    std::size_t s = 1;
    for (std::size_t d = rank; d-- > 0;) {
        src_stride[d] = s;
        s *= shape[d];
    }
    std::vector<std::size_t> out_shape(rank), step(rank), index(rank, 0);
    for (std::size_t d = 0; d < rank; ++d) out_shape[d] = shape[perm[d]], step[d] = src_stride[perm[d]];
    std::size_t src = 0;
    for (std::size_t i = 0; i < n; ++i) {
        f(i, src);
        for (std::size_t d = rank; d-- > 0;) {
            if (++index[d] < out_shape[d]) {
                src += step[d];
                break;
            }
            src -= step[d] * (out_shape[d] - 1);
            index[d] = 0;
        }
    }
}

std::vector<std::size_t> permuted(const std::vector<std::size_t>& shape, const std::vector<std::size_t>& perm) {
    if (perm.empty()) return shape;
    std::vector<std::size_t> out(shape.size());
    for (std::size_t d = 0; d < shape.size(); ++d) out[d] = shape[perm[d]];
    return out;
}

/// Refuses a type that holds no floating-point values where they are needed.
void expect_floats(const host_array& a, const char* name) {
    if (!is_float(a.type))
        refuse(std::string(name) + ": " + to_string(a.type) + " where floating-point values are needed");
}

[[noreturn]] void narrowing_overflow(const char* what, dtype type, double value) {
    throw qkv::vulkan::numeric_overflow(std::string(what) + ": the result " + std::to_string(value) +
                                        " is beyond the range of " + to_string(type) +
                                        ", the inputs' type; pass float32 inputs for a float32 result");
}

template <class Source, class Convert>
out_array narrow(const std::vector<Source>& values, dtype type, std::vector<std::size_t> shape,
                 const std::vector<std::size_t>& perm, const char* what, Convert&& to_bits) {
    std::vector<std::uint16_t> bits(values.size());
    each_output(shape, perm, [&](std::size_t i, std::size_t src) {
        const Source v = values[src];
        bits[i] = to_bits(v);
        if (std::isfinite(v)) {
            const float back = type == dtype::f16 ? qkv::from_half_bits(bits[i]) : from_bf16_bits(bits[i]);
            if (!std::isfinite(back)) narrowing_overflow(what, type, static_cast<double>(v));
        }
    });
    return out_array(std::move(bits), type, permuted(shape, perm));
}

}  // namespace

const char* to_string(dtype type) {
    switch (type) {
        case dtype::f32:
            return "float32";
        case dtype::f16:
            return "float16";
        case dtype::bf16:
            return "bfloat16";
        case dtype::f64:
            return "float64";
        case dtype::boolean:
            return "bool";
        case dtype::i32:
            return "int32";
        case dtype::i64:
            return "int64";
    }
    return "unknown";
}

bool is_float(dtype type) {
    return type == dtype::f32 || type == dtype::f16 || type == dtype::bf16 || type == dtype::f64;
}

std::size_t host_array::elements() const {
    std::size_t n = 1;
    for (const std::size_t d : shape) {
        if (d != 0 && n > std::numeric_limits<std::size_t>::max() / d)
            refuse("an array of " + std::to_string(shape.size()) + " dimensions whose size overflows");
        n *= d;
    }
    return n;
}

host_array read_array(py::handle object, const std::string& name) {
    if (object.is_none()) throw py::type_error(name + " is None; an array (numpy.ndarray or torch.Tensor) is needed");
    if (PyObject_CheckBuffer(object.ptr())) return from_buffer(object, name);
    if (py::hasattr(object, "__dlpack__")) return from_dlpack(object, name);
    throw py::type_error(name + ": a " + std::string(py::str(py::type::of(object).attr("__name__"))) +
                         " is not an array; pass a numpy.ndarray or a CPU torch.Tensor");
}

bool is_contiguous(const host_array& a) {
    std::ptrdiff_t expect = 1;
    for (std::size_t d = a.rank(); d-- > 0;) {
        if (a.shape[d] != 1 && a.strides[d] != expect) return false;
        expect *= static_cast<std::ptrdiff_t>(a.shape[d]);
    }
    return true;
}

void read_values(const host_array& a, values<float>& out, const char* name) {
    if (a.type == dtype::f32 && is_contiguous(a) && reinterpret_cast<std::uintptr_t>(a.data) % alignof(float) == 0) {
        out.view = std::span<const float>(reinterpret_cast<const float*>(a.data), a.elements());
        return;
    }
    out.owned.resize(a.elements());
    gather(a, std::span<float>(out.owned), name);
    out.view = out.owned;
}

void read_values(const host_array& a, values<double>& out, const char* name) {
    if (a.type == dtype::f64 && is_contiguous(a) && reinterpret_cast<std::uintptr_t>(a.data) % alignof(double) == 0) {
        out.view = std::span<const double>(reinterpret_cast<const double*>(a.data), a.elements());
        return;
    }
    out.owned.resize(a.elements());
    gather(a, std::span<double>(out.owned), name);
    out.view = out.owned;
}

void gather(const host_array& a, std::span<float> out, const char* name) {
    expect_count(a, out.size(), name);
    if (a.type == dtype::f64)
        refuse(std::string(name) +
               ": float64 is computed by the float64 reference only (device=\"cpu\"); a Vulkan "
               "device computes float32: convert the inputs to float32");
    expect_floats(a, name);
    if (a.type == dtype::f32) {
        if (is_contiguous(a)) {
            if (!out.empty()) std::memcpy(out.data(), a.data, out.size() * 4);
            return;
        }
        // Rows whose elements lie side by side (FlashAttention's layout read as qkv's: the heads'
        // rows of d values) are copied whole.
        each_row(a, [&](const std::byte* p, std::ptrdiff_t step, std::size_t count, std::size_t i) {
            if (step == 4) {
                std::memcpy(&out[i], p, count * 4);
                return;
            }
            for (std::size_t c = 0; c < count; ++c, p += step) std::memcpy(&out[i + c], p, 4);
        });
        return;
    }
    const dtype t = a.type;
    each_row(a, [&](const std::byte* p, std::ptrdiff_t step, std::size_t count, std::size_t i) {
        // float16 rows whose values lie side by side: converted in bulk (vectorized).
        if (t == dtype::f16 && step == 2 && reinterpret_cast<std::uintptr_t>(p) % alignof(std::uint16_t) == 0) {
            qkv::from_half_bits({reinterpret_cast<const std::uint16_t*>(p), count}, out.subspan(i, count));
            return;
        }
        for (std::size_t c = 0; c < count; ++c, p += step) out[i + c] = element_as_float(t, p);
    });
}

void gather(const host_array& a, std::span<std::uint16_t> out, const char* name) {
    expect_count(a, out.size(), name);
    if (a.type != dtype::f16) refuse(std::string(name) + ": " + to_string(a.type) + " where float16 is needed");
    each_row(a, [&](const std::byte* p, std::ptrdiff_t step, std::size_t count, std::size_t i) {
        if (step == 2) {
            std::memcpy(&out[i], p, count * 2);
            return;
        }
        for (std::size_t c = 0; c < count; ++c, p += step) std::memcpy(&out[i + c], p, 2);
    });
}

namespace {

template <class T>
void gather_slices_as(const host_array& a, std::span<const std::int32_t> which, std::span<T> out, const char* name) {
    if (a.rank() == 0) refuse(std::string(name) + ": slices of an array of rank 0");
    host_array slice = a;
    slice.shape[0] = 1;
    const std::size_t per = slice.elements();
    expect_count(a, a.shape[0] * per, name);
    if (out.size() != which.size() * per)
        refuse(std::string(name) + ": " + std::to_string(which.size()) + " slices of " + std::to_string(per) +
               " elements where " + std::to_string(out.size()) + " were expected");
    const std::ptrdiff_t step = a.strides[0] * static_cast<std::ptrdiff_t>(item_size(a.type));
    for (std::size_t c = 0; c < which.size(); ++c) {
        if (which[c] < 0 || static_cast<std::size_t>(which[c]) >= a.shape[0])
            refuse(std::string(name) + ": slice " + std::to_string(which[c]) + " of " + std::to_string(a.shape[0]));
        slice.data = a.data + step * which[c];
        gather(slice, out.subspan(c * per, per), name);
    }
}

}  // namespace

void gather_slices(const host_array& a, std::span<const std::int32_t> which, std::span<float> out, const char* name) {
    gather_slices_as(a, which, out, name);
}

void gather_slices(const host_array& a, std::span<const std::int32_t> which, std::span<std::uint16_t> out,
                   const char* name) {
    gather_slices_as(a, which, out, name);
}

void gather(const host_array& a, std::span<double> out, const char* name) {
    expect_count(a, out.size(), name);
    expect_floats(a, name);
    const dtype t = a.type;
    each_row(a, [&](const std::byte* p, std::ptrdiff_t step, std::size_t count, std::size_t i) {
        for (std::size_t c = 0; c < count; ++c, p += step) out[i + c] = element_as_double(t, p);
    });
}

void gather(const host_array& a, std::span<std::uint8_t> out, const char* name) {
    expect_count(a, out.size(), name);
    if (a.type != dtype::boolean) refuse(std::string(name) + ": " + to_string(a.type) + " where bool is needed");
    // Any nonzero byte is true (a bool is 0 or 1; DLPack's 8-bit integers are read the same way).
    each_row(a, [&](const std::byte* p, std::ptrdiff_t step, std::size_t count, std::size_t i) {
        for (std::size_t c = 0; c < count; ++c, p += step) out[i + c] = *p != std::byte{0} ? 1 : 0;
    });
}

void gather(const host_array& a, std::span<std::int32_t> out, const char* name) {
    expect_count(a, out.size(), name);
    if (a.type != dtype::i32 && a.type != dtype::i64)
        refuse(std::string(name) + ": " + to_string(a.type) +
               " where integers (int32, or int64 within int32's range) "
               "are needed");
    const bool wide = a.type == dtype::i64;
    each_row(a, [&](const std::byte* p, std::ptrdiff_t step, std::size_t count, std::size_t i) {
        for (std::size_t c = 0; c < count; ++c, p += step) {
            if (!wide) {
                std::memcpy(&out[i + c], p, 4);
                continue;
            }
            std::int64_t v;
            std::memcpy(&v, p, 8);
            if (v < std::numeric_limits<std::int32_t>::min() || v > std::numeric_limits<std::int32_t>::max())
                refuse(std::string(name) + ": the int64 value " + std::to_string(v) + " (element " +
                       std::to_string(i + c) + ") is outside int32's range; nothing was written");
            out[i + c] = static_cast<std::int32_t>(v);
        }
    });
}

out_array::out_array(storage data, dtype type, std::vector<std::size_t> shape)
    : data_(std::move(data)), type_(type), shape_(std::move(shape)) {}

py::buffer_info out_array::buffer() {
    std::vector<py::ssize_t> shape(shape_.begin(), shape_.end()), strides(shape_.size());
    const auto item = static_cast<py::ssize_t>(item_size(type_));
    py::ssize_t s = item;
    for (std::size_t d = shape_.size(); d-- > 0;) {
        strides[d] = s;
        s *= static_cast<py::ssize_t>(shape_[d]);
    }
    void* ptr = std::visit([](auto& v) { return static_cast<void*>(v.data()); }, data_);
    const char* format = type_ == dtype::f32   ? "f"
                         : type_ == dtype::f64 ? "d"
                         : type_ == dtype::f16 ? "e"
                         : type_ == dtype::i32 ? "i"
                                               : "H";
    return py::buffer_info(ptr, item, format, static_cast<py::ssize_t>(shape.size()), shape, strides);
}

out_array make_output(std::vector<float>&& values, dtype type, std::vector<std::size_t> shape,
                      const std::vector<std::size_t>& perm, const char* what) {
    switch (type) {
        case dtype::f32: {
            if (perm.empty()) return out_array(std::move(values), type, std::move(shape));
            std::vector<float> out(values.size());
            each_output(shape, perm, [&](std::size_t i, std::size_t src) { out[i] = values[src]; });
            return out_array(std::move(out), type, permuted(shape, perm));
        }
        case dtype::f16: {
            // In output order (a copy where permuted), checked, then converted in bulk (vectorized).
            std::vector<float> ordered;
            std::span<const float> from = values;
            if (!perm.empty()) {
                ordered.resize(values.size());
                each_output(shape, perm, [&](std::size_t i, std::size_t src) { ordered[i] = values[src]; });
                from = ordered;
            }
            if (const std::size_t i = qkv::half_overflow_index(from); i < from.size())
                narrowing_overflow(what, type, static_cast<double>(from[i]));
            std::vector<std::uint16_t> bits(from.size());
            qkv::to_half_bits(from, bits);
            return out_array(std::move(bits), type, permuted(shape, perm));
        }
        case dtype::bf16:
            return narrow(values, type, std::move(shape), perm, what, [](float v) { return to_bf16_bits(v); });
        case dtype::f64: {
            std::vector<double> out(values.size());
            each_output(shape, perm, [&](std::size_t i, std::size_t src) { out[i] = values[src]; });
            return out_array(std::move(out), type, permuted(shape, perm));
        }
        case dtype::boolean:
        case dtype::i32:
        case dtype::i64:
            break;
    }
    refuse(std::string(what) + ": no floating-point result of type " + to_string(type));
}

out_array make_output(const std::vector<double>& values, dtype type, std::vector<std::size_t> shape,
                      const std::vector<std::size_t>& perm, const char* what) {
    switch (type) {
        case dtype::f32: {
            std::vector<float> out(values.size());
            each_output(shape, perm, [&](std::size_t i, std::size_t src) { out[i] = static_cast<float>(values[src]); });
            return out_array(std::move(out), type, permuted(shape, perm));
        }
        case dtype::f16:
            return narrow(values, type, std::move(shape), perm, what,
                          [](double v) { return qkv::to_half_bits(round_to_odd(v)); });
        case dtype::bf16:
            return narrow(values, type, std::move(shape), perm, what,
                          [](double v) { return to_bf16_bits(round_to_odd(v)); });
        case dtype::f64: {
            std::vector<double> out(values.size());
            each_output(shape, perm, [&](std::size_t i, std::size_t src) { out[i] = values[src]; });
            return out_array(std::move(out), type, permuted(shape, perm));
        }
        case dtype::boolean:
        case dtype::i32:
        case dtype::i64:
            break;
    }
    refuse(std::string(what) + ": no floating-point result of type " + to_string(type));
}

float from_bf16_bits(std::uint16_t bits) { return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16); }

std::uint16_t to_bf16_bits(float value) {
    const auto bits = std::bit_cast<std::uint32_t>(value);
    if (std::isnan(value)) return static_cast<std::uint16_t>((bits >> 16) | 0x40u);  // quiet, sign kept
    const std::uint32_t rounded = bits + 0x7FFFu + ((bits >> 16) & 1u);              // to nearest, ties to even
    return static_cast<std::uint16_t>(rounded >> 16);
}

void bind_arrays(py::module_& m) {
    py::class_<out_array>(m, "_Array", py::buffer_protocol(),
                          "A result of qkv, owned by this object; NumPy and torch wrap its memory without a copy.")
        .def_buffer(&out_array::buffer)
        .def_property_readonly("shape",
                               [](const out_array& a) {
                                   py::tuple t(a.shape().size());
                                   for (std::size_t d = 0; d < a.shape().size(); ++d) t[d] = a.shape()[d];
                                   return t;
                               })
        .def_property_readonly("dtype", [](const out_array& a) { return to_string(a.type()); });
}

}  // namespace qkv::python
