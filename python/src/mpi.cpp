// qkv.mpi's C++ side: context-parallel sdpa (qkv::mpi::sdpa) over an mpi4py communicator, and the
// slices each rank holds. Built where qkv::mpi is (QKV_PYTHON_WITH_MPI); the communicator arrives
// as its Fortran handle (mpi4py's Comm.py2f()), so no mpi4py header is needed to build.
#include "mpi.hpp"

#ifdef QKV_PYTHON_WITH_MPI
#include <mpi.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cmath>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "arrays.hpp"
#include "calls.hpp"
#include "qkv/mpi/sdpa.hpp"
#include "qkv/mpi/vulkan.hpp"
#include "qkv/runtime/error.hpp"
#endif

namespace qkv::python {

#ifdef QKV_PYTHON_WITH_MPI
namespace {

namespace py = pybind11;

qkv::mpi::layout layout_of(const std::string& name) {
    if (name == "zigzag") return qkv::mpi::layout::zigzag;
    if (name == "contiguous") return qkv::mpi::layout::contiguous;
    throw qkv::invalid_argument("layout must be \"zigzag\" or \"contiguous\" (it is \"" + name + "\")");
}

MPI_Comm comm_of(long long handle) {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (!initialized || finalized)
        throw qkv::invalid_argument("qkv.mpi: MPI is not running (import mpi4py.MPI first, and call before it ends)");
    return MPI_Comm_f2c(static_cast<MPI_Fint>(handle));
}

/// A slice's rows: (B, H, rows, width) host data as float, or empty for a rank without rows.
std::vector<float> slice_data(py::handle a, const char* name, std::vector<std::size_t>& shape) {
    const host_array h = read_array(a, name);
    if (h.rank() != 4)
        throw qkv::invalid_argument(std::string(name) + ": qkv.mpi.sdpa takes (B, H, rows, width) slices");
    shape = h.shape;
    std::vector<float> out(h.elements());
    py::gil_scoped_release nogil;
    gather(h, std::span<float>(out), name);
    return out;
}

py::tuple sdpa(long long comm, py::handle q, py::handle k, py::handle v, std::size_t q_len, std::size_t kv_len,
               py::handle mask, bool mask_is_bool, py::handle sinks, const py::dict& options, const std::string& mode,
               const std::string& layout, std::optional<double> timeout_s, py::handle device) {
    const call_options opt = read_options(options);
    std::vector<std::size_t> qs, ks, vs;
    const std::vector<float> qf = slice_data(q, "query", qs), kf = slice_data(k, "key", ks),
                             vf = slice_data(v, "value", vs);
    qkv::mpi::cp_problem p;
    p.shape = {.batch = qs[0],
               .q_heads = qs[1],
               .kv_heads = ks[1],
               .q_len = q_len,
               .kv_len = kv_len,
               .d_qk = qs[3],
               .d_v = vs[3]};
    p.q = qf, p.k = kf, p.v = vf;
    p.options = opt.options;
    std::vector<std::uint8_t> bits;
    std::vector<float> additive, sink_values;
    if (!mask.is_none()) {
        const host_array m = read_array(mask, "attn_mask");
        if (m.rank() > 4) throw qkv::invalid_argument("attn_mask: at most 4 dimensions, broadcasting to (B, Hq, L, S)");
        p.mask_shape = m.shape;
        if (mask_is_bool) {
            bits.resize(m.elements());
            gather(m, std::span<std::uint8_t>(bits), "attn_mask");
            p.mask = bits;
        } else {
            additive.resize(m.elements());
            gather(m, std::span<float>(additive), "attn_mask");
            p.additive_mask = additive;
        }
    }
    if (!sinks.is_none()) {
        const host_array s = read_array(sinks, "sinks");
        sink_values.resize(s.elements());
        gather(s, std::span<float>(sink_values), "sinks");
        p.sinks = sink_values;
    }
    qkv::mpi::cp_options o{.mode = mode == "allgather" ? qkv::mpi::cp_mode::allgather : qkv::mpi::cp_mode::ring,
                           .slicing = layout_of(layout)};
    if (mode != "ring" && mode != "allgather")
        throw qkv::invalid_argument("mode must be \"ring\" or \"allgather\" (it is \"" + mode + "\")");
    if (timeout_s) {
        if (!(*timeout_s > 0) || !std::isfinite(*timeout_s) || *timeout_s > 1e9)
            throw qkv::invalid_argument("timeout must be a positive number of seconds (it is " +
                                        std::to_string(*timeout_s) + ")");
        o.comm.timeout = std::chrono::milliseconds(static_cast<long long>(std::ceil(*timeout_s * 1000)));
    }
    const MPI_Comm c = comm_of(comm);
    std::optional<out_array> out, lse;
    {
        const context_ptr ctx = device.is_none() ? nullptr : device.cast<context_ptr>();
        py::gil_scoped_release nogil;
        qkv::mpi::cp_output r;
        if (ctx) {
            qkv::mpi::vulkan_backend compute(*ctx);
            r = qkv::mpi::sdpa(c, compute, p, o);
        } else {
            qkv::mpi::cpu_backend compute;
            r = qkv::mpi::sdpa(c, compute, p, o);
        }
        out = make_output(std::move(r.output), dtype::f32, {qs[0], qs[1], qs[2], vs[3]}, {}, "output");
        if (p.options.return_lse) lse = make_output(std::move(r.lse), dtype::f32, {qs[0], qs[1], qs[2]}, {}, "lse");
    }
    return py::make_tuple(py::cast(std::move(*out)), lse ? py::cast(std::move(*lse)) : py::none());
}

}  // namespace

void bind_mpi(py::module_& m) {
    m.attr("_has_mpi") = true;
    m.def("_mpi_sdpa", &sdpa, py::arg("comm"), py::arg("query"), py::arg("key"), py::arg("value"), py::kw_only(),
          py::arg("q_len"), py::arg("kv_len"), py::arg("mask"), py::arg("mask_is_bool"), py::arg("sinks"),
          py::arg("options"), py::arg("mode"), py::arg("layout"), py::arg("timeout"), py::arg("context"));
    m.def(
        "_mpi_slice",
        [](std::size_t length, int ranks, int rank, const std::string& layout) {
            if (ranks < 1 || rank < 0 || rank >= ranks)
                throw qkv::invalid_argument("rank " + std::to_string(rank) + " of " + std::to_string(ranks));
            std::vector<std::pair<std::size_t, std::size_t>> out;
            for (const qkv::mpi::row_range& r : qkv::mpi::slice_of(length, ranks, rank, layout_of(layout)).ranges)
                out.emplace_back(r.first, r.end);
            return out;
        },
        py::arg("length"), py::arg("ranks"), py::arg("rank"), py::arg("layout"));
    m.def("_mpi_timed_out", [] { return qkv::mpi::timed_out(); });
    m.def("_mpi_default_timeout", [] { return static_cast<double>(qkv::mpi::default_timeout().count()) / 1000.0; });
}
#else
void bind_mpi(pybind11::module_& m) { m.attr("_has_mpi") = false; }
#endif

}  // namespace qkv::python
