// Host arrays between Python and qkv: reading any array the caller passes (NumPy and anything else
// with the buffer protocol; torch tensors through DLPack) as a strided view of its own memory,
// gathering it into the contiguous float32 (or float64) rows qkv's calls take, and the results
// handed back as buffers that NumPy and torch wrap without copying.
//
// Reading never copies in Python and never takes the array's memory: the view keeps its owner
// alive (the buffer, or the DLPack capsule's managed tensor) and is read once, while packing,
// from any strides (transposes, slices, negative and zero strides). float16 and bfloat16 are
// widened exactly to float32 on the way.
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace qkv::python {

namespace py = pybind11;

/// The element types qkv reads and writes: floating point (the calls' data), bool (masks), and
/// integers (int32 indices: an int32 qkv.Tensor, a block table on the device; int64, numpy's
/// default integer, read as int32 where every value fits).
enum class dtype { f32, f16, bf16, f64, boolean, i32, i64 };

/// "float32", "float16", "bfloat16", "float64", "bool", "int32", "int64".
[[nodiscard]] const char* to_string(dtype type);
/// Whether `type` holds floating-point values (float32, float16, bfloat16, float64).
[[nodiscard]] bool is_float(dtype type);

/// A read-only strided view of a caller's host array. Strides are in elements and may be negative
/// or zero; `data` points at element (0, ..., 0). Copyable: copies share the owner.
struct host_array {
    dtype type = dtype::f32;
    std::vector<std::size_t> shape;
    std::vector<std::ptrdiff_t> strides;
    const std::byte* data = nullptr;
    std::shared_ptr<void> owner;  ///< the Py_buffer or the DLPack managed tensor, released last

    [[nodiscard]] std::size_t rank() const { return shape.size(); }
    [[nodiscard]] std::size_t elements() const;  ///< throws qkv::invalid_argument when it overflows
};

/// Whether `a` lies row-major and contiguous in memory (dimensions of size 1 may have any stride).
[[nodiscard]] bool is_contiguous(const host_array& a);

/// The elements of an array the caller holds, as a span of T: over the caller's own memory where it
/// is already contiguous T (no copy: it stays alive while `owned` or the array does), else gathered
/// into `owned` (float16 and bfloat16 widened exactly). No GIL needed.
template <class T>
struct values {
    /// Memory the gather writes once: not zeroed first (a second pass over the pages).
    struct uninitialized : std::allocator<T> {
        template <class U>
        struct rebind {
            using other = typename values<U>::uninitialized;
        };
        template <class U>
        void construct(U* p) noexcept {
            ::new (static_cast<void*>(p)) U;
        }
        template <class U, class... A>
        void construct(U* p, A&&... args) {
            ::new (static_cast<void*>(p)) U(std::forward<A>(args)...);
        }
    };
    std::vector<T, uninitialized> owned;
    std::span<const T> view;
};

/// Reads `object` (`name` names it in messages): the buffer protocol first (NumPy), else
/// `__dlpack__` (torch). Throws qkv::invalid_argument for an unsupported element type, a device
/// other than the CPU, strides that are not whole elements; TypeError (py::type_error) for an
/// object that is neither. Needs the GIL.
[[nodiscard]] host_array read_array(py::handle object, const std::string& name);

/// The elements of `a` in row-major order of its shape, as float (float16 and bfloat16 widened
/// exactly; float64 refused: qkv::invalid_argument naming `name`) or double (every float type
/// widened). Runs without the GIL.
void gather(const host_array& a, std::span<float> out, const char* name);
void gather(const host_array& a, std::span<double> out, const char* name);
/// A boolean (or 0/1 integer) array as 0/1 bytes.
void gather(const host_array& a, std::span<std::uint8_t> out, const char* name);
/// An int32 or int64 array as int32 values; an int64 value outside int32's range is refused
/// (qkv::invalid_argument naming `name` and the value), never wrapped; any other type is refused.
void gather(const host_array& a, std::span<std::int32_t> out, const char* name);
/// A float16 array's elements as their bits, as they are (any other type is refused).
void gather(const host_array& a, std::span<std::uint16_t> out, const char* name);
/// The slices a[i] (along the first dimension) for each i of `which`, in that order, as gather
/// reads them: `out` holds which.size() slices. Every index must lie in [0, a.shape[0]).
void gather_slices(const host_array& a, std::span<const std::int32_t> which, std::span<float> out, const char* name);
void gather_slices(const host_array& a, std::span<const std::int32_t> which, std::span<std::uint16_t> out,
                   const char* name);

/// `a`'s elements as T (float or double), without a copy where they already are contiguous T.
void read_values(const host_array& a, values<float>& out, const char* name);
void read_values(const host_array& a, values<double>& out, const char* name);

/// A result: contiguous, row-major, owned; exposed through the buffer protocol (format "f", "d",
/// "e", "i" for int32, or "H" for bfloat16 bits, which the Python side views as torch.bfloat16).
class out_array {
public:
    using storage =
        std::variant<std::vector<float>, std::vector<double>, std::vector<std::uint16_t>, std::vector<std::int32_t>>;

    out_array(storage data, dtype type, std::vector<std::size_t> shape);

    [[nodiscard]] dtype type() const { return type_; }
    [[nodiscard]] const std::vector<std::size_t>& shape() const { return shape_; }
    [[nodiscard]] py::buffer_info buffer();

private:
    storage data_;
    dtype type_;
    std::vector<std::size_t> shape_;
};

/// `values` (row-major, of `shape` permuted by `perm`, i.e. element (i_0, ..., i_n) of the source is
/// at the row-major index of (i_perm[0], ...)) written as `type` in row-major order of the permuted
/// shape: float32 moved without a copy when nothing is permuted, float16 and bfloat16 rounded to
/// nearest even. A finite value that leaves the type's range throws numeric_overflow naming
/// `what`. `perm` empty: the identity. Runs without the GIL.
[[nodiscard]] out_array make_output(std::vector<float>&& values, dtype type, std::vector<std::size_t> shape,
                                    const std::vector<std::size_t>& perm, const char* what);
/// The same from float64 results (the float64 CPU reference): each value rounded once to `type`.
[[nodiscard]] out_array make_output(const std::vector<double>& values, dtype type, std::vector<std::size_t> shape,
                                    const std::vector<std::size_t>& perm, const char* what);

/// bfloat16 <-> float32: widening is exact; narrowing rounds to nearest, ties to even (NaN stays NaN).
[[nodiscard]] float from_bf16_bits(std::uint16_t bits);
[[nodiscard]] std::uint16_t to_bf16_bits(float value);

void bind_arrays(py::module_& m);

}  // namespace qkv::python
