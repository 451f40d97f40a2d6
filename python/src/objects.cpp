// The device objects of the Python package (objects.hpp).
#include "objects.hpp"

#include <pybind11/stl.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "arrays.hpp"
#include "calls.hpp"
#include "qkv/runtime/element_type.hpp"
#include "qkv/runtime/error.hpp"
#include "qkv/runtime/options.hpp"
#include "qkv/vulkan/error.hpp"
#include "qkv/vulkan/testing.hpp"

namespace qkv::python {
namespace {

namespace py = pybind11;
using qkv::vulkan::device_info;

std::string api_of(const device_info& d) { return d.api_version_string; }

std::string repr(const device_info& d) {
    return "qkv.Device(" + std::to_string(d.index) + ", '" + d.name + "', " + qkv::vulkan::to_string(d.type) +
           ", Vulkan " + d.api_version_string + ")";
}

/// A context for `device`: None (QKV_DEVICE, else the best device), an index, a name's part, or a
/// qkv.Device.
std::shared_ptr<qkv::vulkan::context> open(py::handle device, bool validation, std::uint64_t memory_limit,
                                           const py::dict& testing) {
    qkv::vulkan::context_options o;
    o.validation = validation;
    o.device_memory_limit = memory_limit;
    // Test hooks (qkv::vulkan::testing::hooks), for qkv's own tests: named, never silently ignored.
    qkv::vulkan::testing::hooks hooks;
    for (const auto& item : testing) {
        const std::string key = py::str(item.first);
        const auto count = [&] { return item.second.cast<std::uint32_t>(); };
        if (key == "simulate_device_lost_at_submit")
            hooks.simulate_device_lost_at_submit = count();
        else if (key == "max_decode_chunks")
            hooks.max_decode_chunks = count();
        else if (key == "max_fused_keys_per_dispatch")
            hooks.max_fused_keys_per_dispatch = count();
        else if (key == "force_staging")
            hooks.force_staging = item.second.cast<bool>();
        else
            throw qkv::invalid_argument("_testing: unknown hook " + key);
    }
    if (py::isinstance<device_info>(device))
        o.device = std::to_string(device.cast<const device_info&>().index);
    else if (py::isinstance<py::bool_>(device))
        throw py::type_error("device: a bool is not a device");
    else if (py::isinstance<py::int_>(device)) {
        const long long index = device.cast<long long>();
        if (index < 0) throw qkv::invalid_argument("device: index " + std::to_string(index) + " is negative");
        o.device = std::to_string(index);
    } else if (py::isinstance<py::str>(device))
        o.device = device.cast<std::string>();
    else if (!device.is_none())
        throw py::type_error("device: a " + std::string(py::str(py::type::of(device).attr("__name__"))) +
                             " is not a device (None, an index, a name or a qkv.Device)");
    py::gil_scoped_release nogil;  // creating a device compiles nothing, but the loader may take a while
    if (testing.empty()) return std::make_shared<qkv::vulkan::context>(o);
    return std::make_shared<qkv::vulkan::context>(qkv::vulkan::testing::make_context(o, hooks));
}

const char* type_name(qkv::element_type t) {
    return t == qkv::element_type::f16 ? "float16" : t == qkv::element_type::i32 ? "int32" : "float32";
}

py::object download(const py_tensor& t) {
    std::optional<out_array> a;
    {
        py::gil_scoped_release nogil;
        if (t.tensor.type() == qkv::element_type::i32) {
            a = out_array(t.tensor.download_int32(), dtype::i32, t.tensor.shape());
        } else {
            std::vector<float> values = t.tensor.download();
            const dtype type = t.tensor.type() == qkv::element_type::f16 ? dtype::f16 : dtype::f32;
            a = make_output(std::move(values), type, t.tensor.shape(), {}, "Tensor.numpy");
        }
    }
    return py::cast(std::move(*a));
}

/// The element type of a tensor made from an array of `given` type: the one `requested` where named, else
/// int32 for integer arrays, float16 for float16 ones, float32 for the other floats. Integers and
/// floating-point values do not mix (indices are not data).
qkv::element_type tensor_type(dtype given, const std::optional<std::string>& requested) {
    const bool ints = given == dtype::i32 || given == dtype::i64;
    if (given == dtype::boolean) throw qkv::invalid_argument("array: a bool array is not a tensor (float or int32)");
    qkv::element_type type = ints                  ? qkv::element_type::i32
                             : given == dtype::f16 ? qkv::element_type::f16
                                                   : qkv::element_type::f32;
    if (requested) {
        if (*requested == "float32")
            type = qkv::element_type::f32;
        else if (*requested == "float16")
            type = qkv::element_type::f16;
        else if (*requested == "int32")
            type = qkv::element_type::i32;
        else
            throw qkv::invalid_argument("dtype must be \"float32\", \"float16\" or \"int32\" (it is \"" + *requested +
                                        "\")");
    }
    if (ints != (type == qkv::element_type::i32))
        throw qkv::invalid_argument(std::string("array is ") + to_string(given) + " and the tensor " +
                                    (type == qkv::element_type::i32 ? "int32" : "floating point") +
                                    ": an int32 tensor takes int32 (or int64) arrays, a float tensor "
                                    "floating-point arrays");
    return type;
}

/// `a`'s elements written into `t` (of as many elements), as int32 or as float32 by its type.
void write_values(const host_array& a, qkv::vulkan::tensor& t) {
    if (t.type() == qkv::element_type::i32) {
        std::vector<std::int32_t> ints(a.elements());
        gather(a, std::span<std::int32_t>(ints), "array");  // int64 checked to fit: nothing is written otherwise
        t.upload(std::span<const std::int32_t>(ints));
        return;
    }
    values<float> data;
    read_values(a, data, "array");
    t.upload(data.view);
}

py_tensor make_tensor(py::handle array, const std::shared_ptr<qkv::vulkan::context>& ctx,
                      const std::optional<std::string>& requested) {
    const host_array a = read_array(array, "array");
    if (a.rank() == 0) throw qkv::invalid_argument("array: a 0-dimensional array is not a tensor");
    const qkv::element_type type = tensor_type(a.type, requested);
    py_tensor t{ctx, {}};
    py::gil_scoped_release nogil;
    t.tensor = qkv::vulkan::tensor(*ctx, a.shape, type);
    write_values(a, t.tensor);
    return t;
}

/// Tensor.upload: new values of the tensor's shape into its own memory (calls given the tensor
/// later read them; the tensor is not made again).
void upload(py_tensor& t, py::handle array) {
    const host_array a = read_array(array, "array");
    if (a.shape != t.tensor.shape())
        throw qkv::invalid_argument("array has shape " + dims(a.shape) + " and the tensor " + dims(t.tensor.shape()) +
                                    ": upload writes the tensor's own shape");
    static_cast<void>(tensor_type(a.type, std::string(type_name(t.tensor.type()))));
    py::gil_scoped_release nogil;
    write_values(a, t.tensor);
}

}  // namespace

void bind_objects(py::module_& m) {
    py::class_<device_info>(m, "Device", "A Vulkan device of this machine (qkv.devices()): what qkv knows of it.")
        .def_readonly("index", &device_info::index, "Its position in vkEnumeratePhysicalDevices order.")
        .def_readonly("name", &device_info::name)
        .def_property_readonly(
            "type", [](const device_info& d) { return std::string(qkv::vulkan::to_string(d.type)); },
            "\"discrete GPU\", \"integrated GPU\", \"virtual GPU\", \"CPU\" or \"other\".")
        .def_readonly("driver", &device_info::driver)
        .def_property_readonly("api_version", &api_of, "The Vulkan version the driver offers, e.g. \"1.3.230\".")
        .def_readonly("vendor_id", &device_info::vendor_id)
        .def_readonly("subgroup_size", &device_info::subgroup_size)
        .def_readonly("max_shared_memory", &device_info::max_shared_memory, "Bytes of shared memory per workgroup.")
        .def_readonly("device_local_memory", &device_info::device_local_memory,
                      "Bytes of the largest device-local heap.")
        .def_readonly("fp16_storage", &device_info::fp16_storage,
                      "Whether float16 storage (precision=\"fp16\", float16 Tensors) is available.")
        .def_readonly("fp16_arithmetic", &device_info::fp16_arithmetic)
        .def("__repr__", &repr)
        .def("__str__", &repr);

    m.def(
        "devices",
        []() -> std::vector<device_info> {
            try {
                py::gil_scoped_release nogil;
                return qkv::vulkan::list_devices();
            } catch (const qkv::vulkan::unavailable&) {
                return {};  // no Vulkan loader or no driver: no device
            }
        },
        "The Vulkan devices of this machine, in enumeration order; [] without Vulkan (device=\"cpu\" still works).");

    py::class_<qkv::vulkan::context, std::shared_ptr<qkv::vulkan::context>>(
        m, "Context",
        "A Vulkan device opened for qkv: its queue, pipelines and reusable buffers. Thread-safe; calls on one "
        "context are serialised. Context(device=None, validation=False): device None (the QKV_DEVICE environment "
        "variable, else the best device), an index, a case-insensitive part of a name, or a qkv.Device; "
        "validation turns on the Khronos validation layer with synchronisation validation (also QKV_VALIDATION=1); "
        "memory_limit caps the device memory it may hold, in bytes (0: the device's heap; beyond it qkv.OutOfMemory). "
        "Raises qkv.Unavailable without Vulkan, qkv.NoMatchingDevice when the device names none.")
        .def(py::init([](py::object device, bool validation, std::uint64_t memory_limit, py::dict testing) {
                 return open(device, validation, memory_limit, testing);
             }),
             py::arg("device") = py::none(), py::arg("validation") = false, py::kw_only(), py::arg("memory_limit") = 0,
             py::arg("_testing") = py::dict())
        .def_property_readonly(
            "device", [](const qkv::vulkan::context& c) { return c.device(); }, "The qkv.Device it runs on.")
        .def(
            "take_validation_messages",
            [](qkv::vulkan::context& c) {
                py::gil_scoped_release nogil;
                return c.take_validation_messages();
            },
            "The validation layer's messages since the last call (then cleared); [] unless validation is on.")
        .def(
            "last_call",
            [](const qkv::vulkan::context& c) {
                const qkv::vulkan::call_stats s = c.last_call();
                py::dict d;
                d["host_ms"] = s.host_ms;
                d["device_ms"] = s.device_ms;
                d["attention_ms"] = s.attention_ms;
                d["device_bytes"] = s.device_bytes;
                return d;
            },
            "Timings of the context's last call, as the C++ library measured them inside it: host_ms (the whole "
            "call, host clock), device_ms and attention_ms (GPU timestamps, 0 without them), device_bytes held.")
        .def_property_readonly("device_memory_allocated", &qkv::vulkan::context::device_memory_allocated,
                               "Bytes of device memory the context holds now.")
        .def(
            "trim",
            [](qkv::vulkan::context& c) {
                py::gil_scoped_release nogil;
                c.trim();
            },
            "Releases the cached buffers (they are made again when needed).")
        .def("__repr__", [](const qkv::vulkan::context& c) { return "qkv.Context(" + repr(c.device()) + ")"; });

    py::class_<py_tensor>(m, "Tensor",
                          "Data on a device (qkv.tensor(array, context)): row-major, float32, float16 or int32 "
                          "(indices: a block table). Calls given Tensors keep their data and results on the device; "
                          ".numpy() downloads, .upload(array) overwrites.")
        .def_property_readonly("shape",
                               [](const py_tensor& t) {
                                   const auto& s = t.tensor.shape();
                                   py::tuple out(s.size());
                                   for (std::size_t d = 0; d < s.size(); ++d) out[d] = s[d];
                                   return out;
                               })
        .def_property_readonly(
            "dtype", [](const py_tensor& t) { return type_name(t.tensor.type()); },
            "\"float32\", \"float16\" or \"int32\".")
        .def_property_readonly("nbytes", [](const py_tensor& t) { return t.tensor.bytes(); })
        .def_property_readonly("context", [](const py_tensor& t) { return t.context; })
        .def("_download", &download)
        .def("_upload", &upload, py::arg("array"))
        .def("__repr__", [](const py_tensor& t) {
            std::string s = "qkv.Tensor(shape=(";
            for (std::size_t d = 0; d < t.tensor.shape().size(); ++d)
                s += (d ? ", " : "") + std::to_string(t.tensor.shape()[d]);
            return s + "), dtype=" + type_name(t.tensor.type()) + ")";
        });
    m.def("_tensor", &make_tensor, py::arg("array"), py::arg("context"), py::arg("dtype") = py::none());

    py::class_<py_kv_cache>(m, "_KVCache")
        .def(py::init([](const std::shared_ptr<qkv::vulkan::context>& ctx, std::size_t batch, std::size_t kv_heads,
                         std::size_t capacity, std::size_t d_qk, std::size_t d_v, const std::string& kv_type) {
                 const auto type = qkv::parse_name<qkv::element_type>(kv_type);
                 if (!type)
                     throw qkv::invalid_argument("kv_type must be \"f32\", \"f16\", \"q8_0\" or \"q4_0\" (it is \"" +
                                                 kv_type + "\")");
                 py::gil_scoped_release nogil;
                 return py_kv_cache{ctx, qkv::vulkan::kv_cache(*ctx, {.batch = batch,
                                                                      .kv_heads = kv_heads,
                                                                      .capacity = capacity,
                                                                      .d_qk = d_qk,
                                                                      .d_v = d_v,
                                                                      .type = *type})};
             }),
             py::arg("context"), py::arg("batch"), py::arg("kv_heads"), py::arg("capacity"), py::arg("d_qk"),
             py::arg("d_v"), py::arg("kv_type"))
        .def_property_readonly("size", [](const py_kv_cache& c) { return c.cache.size(); })
        .def_property_readonly("capacity", [](const py_kv_cache& c) { return c.cache.capacity(); })
        .def_property_readonly("context", [](const py_kv_cache& c) { return c.context; })
        .def_property_readonly("kv_type",
                               [](const py_kv_cache& c) { return std::string(qkv::to_string(c.cache.layout().type)); })
        .def("clear", [](py_kv_cache& c) {
            py::gil_scoped_release nogil;
            c.cache.clear();
        });
}

}  // namespace qkv::python
