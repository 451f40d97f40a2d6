// The attention calls of the Python package: the options as the Python layer passes them, the
// host inputs gathered into a qkv::sdpa_problem, and the calls on the float64 reference, a Vulkan
// context, a K/V cache and device tensors. The Python layer (qkv/_sdpa.py) turns PyTorch's and
// FlashAttention's arguments into these; everything here is checked again (qkv::validate and the
// reads), so that no input reaches qkv unchecked.
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "arrays.hpp"
#include "qkv/runtime/sdpa.hpp"
#include "qkv/vulkan/context.hpp"

namespace qkv::python {

namespace py = pybind11;

/// The options of one call, read from the dict the Python layer builds (keys: scale, causal,
/// alignment, window_left, window_right, softcap, return_lse, return_weights, kv_type, precision,
/// kernel). Unknown keys and values are refused (qkv::invalid_argument naming them).
struct call_options {
    qkv::sdpa_options options{};
    bool precision_given = false;  ///< false: chosen from the inputs' dtype and the device
};
[[nodiscard]] call_options read_options(const py::dict& options);

/// Python-side handles: a context shared by the Context object, its tensors and caches.
using context_ptr = std::shared_ptr<qkv::vulkan::context>;

/// The context a call's `device` argument names (a Context), or null for None (the float64
/// reference).
[[nodiscard]] context_ptr context_of(py::handle device);

/// The precision a call runs in when the caller did not say: float16 storage for float16 inputs
/// on a device that has it (exact: the values are float16 already), float32 otherwise.
void choose_precision(call_options& opt, dtype type, const context_ptr& ctx);

/// A shape as Python prints a tuple: "(3, 4)", "(5,)".
[[nodiscard]] std::string dims(const std::vector<std::size_t>& shape);

void bind_calls(py::module_& m);
/// The ragged (varlen) calls: _varlen and _varlen_backward (varlen.cpp).
void bind_varlen(py::module_& m);
/// The paged calls: _paged and the pool of qkv.PagedKVCache, _PagedPool (paged.cpp).
void bind_paged(py::module_& m);

}  // namespace qkv::python
