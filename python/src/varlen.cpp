// The ragged (varlen) calls of the Python package: FlashAttention's flash_attn_varlen_func over
// host arrays (qkv/flash_attn.py), forward and backward. The forward is one call of
// context::sdpa(varlen_problem) (or the float64 reference, qkv::cpu::sdpa), which batches the
// sequences itself; the backward runs each sequence's backward pass (context::sdpa_backward, or
// the reference), since the library's backward takes one (B, H, L, S) problem.
#include <pybind11/stl.h>

#include <tuple>
#include <type_traits>
#include <utility>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "calls.hpp"
#include "qkv/runtime/cpu.hpp"
#include "qkv/runtime/error.hpp"
#include "qkv/runtime/sdpa_backward.hpp"
#include "qkv/runtime/varlen.hpp"

namespace qkv::python {
namespace {

[[noreturn]] void refuse(const std::string& message) { throw qkv::invalid_argument(message); }

/// One ragged call as read from Python: q (total_q, Hq, E), k (total_k, Hkv, E), v (total_k, Hkv,
/// Ev) of one float dtype, the offsets, and ALiBi slopes (Hq,) or (B, Hq).
struct ragged_call {
    call_options opt;
    dtype type = dtype::f32;
    host_array q, k, v;
    std::optional<host_array> slopes;
    std::vector<std::int32_t> cu_q, cu_k;
    std::size_t max_q = 0, max_k = 0;
    std::size_t hq = 0, hkv = 0, e = 0, ev = 0, total_q = 0, total_k = 0;

    [[nodiscard]] std::size_t batch() const { return cu_q.size() - 1; }
};

ragged_call read_ragged(py::handle q, py::handle k, py::handle v, std::vector<std::int32_t> cu_q,
                        std::vector<std::int32_t> cu_k, std::size_t max_q, std::size_t max_k, py::handle alibi_slopes,
                        const py::dict& options) {
    ragged_call r;
    r.opt = read_options(options);
    r.q = read_array(q, "q"), r.k = read_array(k, "k"), r.v = read_array(v, "v");
    for (const auto& [a, name, what] :
         {std::tuple{&r.q, "q", "(total_q, nheads, headdim)"}, std::tuple{&r.k, "k", "(total_k, nheads_k, headdim)"},
          std::tuple{&r.v, "v", "(total_k, nheads_k, headdim_v)"}}) {
        if (a->rank() != 3)
            refuse(std::string(name) + " has shape " + dims(a->shape) + ": a ragged batch's is " + what);
        if (a->type != r.q.type)
            refuse(std::string("q is ") + to_string(r.q.type) + ", " + name + " is " + to_string(a->type) +
                   ": q, k and v must share one dtype");
    }
    if (!is_float(r.q.type))
        refuse(std::string("q, k and v are ") + to_string(r.q.type) + ": they must be floating point");
    r.type = r.q.type;
    r.total_q = r.q.shape[0], r.hq = r.q.shape[1], r.e = r.q.shape[2];
    r.total_k = r.k.shape[0], r.hkv = r.k.shape[1], r.ev = r.v.shape[2];
    if (r.k.shape[2] != r.e)
        refuse("q " + dims(r.q.shape) + " and k " + dims(r.k.shape) + " must have the same headdim");
    if (r.v.shape[0] != r.total_k || r.v.shape[1] != r.hkv)
        refuse("k " + dims(r.k.shape) + " and v " + dims(r.v.shape) + " must have the same total_k and nheads_k");
    if (cu_q.size() < 2 || cu_k.size() != cu_q.size())
        refuse("cu_seqlens_q has " + std::to_string(cu_q.size()) + " entries and cu_seqlens_k " +
               std::to_string(cu_k.size()) + ": both are batch + 1 offsets, batch >= 1");
    // The rows the offsets cover must be the arrays' rows: a last offset short of them (or past
    // them) is a caller's slip that would otherwise leave rows unread or read beyond the array.
    if (static_cast<std::size_t>(std::max(cu_q.back(), 0)) != r.total_q || cu_q.back() < 0)
        refuse("cu_seqlens_q ends at " + std::to_string(cu_q.back()) + " but q has " + std::to_string(r.total_q) +
               " rows (total_q)");
    if (static_cast<std::size_t>(std::max(cu_k.back(), 0)) != r.total_k || cu_k.back() < 0)
        refuse("cu_seqlens_k ends at " + std::to_string(cu_k.back()) + " but k has " + std::to_string(r.total_k) +
               " rows (total_k)");
    r.cu_q = std::move(cu_q), r.cu_k = std::move(cu_k);
    r.max_q = max_q, r.max_k = max_k;
    if (!alibi_slopes.is_none()) {
        r.slopes = read_array(alibi_slopes, "alibi_slopes");
        if (r.slopes->rank() != 1 && r.slopes->rank() != 2)
            refuse("alibi_slopes has shape " + dims(r.slopes->shape) + ": it must be (nheads,) or (batch, nheads)");
        if (r.slopes->rank() == 2 && (r.slopes->shape[0] != r.batch() || r.slopes->shape[1] != r.hq))
            refuse("alibi_slopes has shape " + dims(r.slopes->shape) + ": per sequence it must be (batch, nheads) = (" +
                   std::to_string(r.batch()) + ", " + std::to_string(r.hq) + ")");
    }
    return r;
}

/// The inputs as T (float, or double for float64 inputs), gathered without the GIL.
template <class T>
struct ragged_values {
    values<T> q, k, v, slopes;
};

template <class T>
ragged_values<T> read_all(const ragged_call& r) {
    ragged_values<T> x;
    read_values(r.q, x.q, "q"), read_values(r.k, x.k, "k"), read_values(r.v, x.v, "v");
    if (!r.slopes) return x;
    // Any float dtype (FlashAttention's are float32, a list reads as float64), as T: refused where
    // float32 cannot hold a finite slope.
    values<double> wide;
    read_values(*r.slopes, wide, "alibi_slopes");
    x.slopes.owned.resize(wide.view.size());
    for (std::size_t i = 0; i < wide.view.size(); ++i) {
        const double s = wide.view[i];
        if (std::isfinite(s) && std::abs(s) > static_cast<double>(std::numeric_limits<T>::max()))
            refuse("alibi_slopes[" + std::to_string(i) + "] is beyond float32's range");
        x.slopes.owned[i] = static_cast<T>(s);
    }
    x.slopes.view = x.slopes.owned;
    return x;
}

/// The slopes sequence b uses: all of (Hq,), row b of (B, Hq).
template <class T>
std::span<const T> slopes_of(const ragged_call& r, std::span<const T> slopes, std::size_t b) {
    if (!r.slopes || r.slopes->rank() == 1) return slopes;
    return slopes.subspan(b * r.hq, r.hq);
}

/// Whether (B, Hq) slopes differ between sequences (then each runs as its own call).
template <class T>
bool slopes_differ(const ragged_call& r, std::span<const T> slopes) {
    if (!r.slopes || r.slopes->rank() == 1) return false;
    for (std::size_t i = r.hq; i < slopes.size(); ++i)
        if (slopes[i] != slopes[i % r.hq]) return true;
    return false;
}

template <class T>
qkv::basic_varlen_problem<T> problem_of(const ragged_call& r, const ragged_values<T>& x) {
    qkv::basic_varlen_problem<T> p;
    p.q_heads = r.hq, p.kv_heads = r.hkv, p.d_qk = r.e, p.d_v = r.ev;
    p.cu_seqlens_q = r.cu_q, p.cu_seqlens_k = r.cu_k;
    p.max_seqlen_q = r.max_q, p.max_seqlen_k = r.max_k;
    p.q = x.q.view, p.k = x.k.view, p.v = x.v.view;
    p.options = r.opt.options;
    p.alibi_slopes = slopes_of<T>(r, x.slopes.view, 0);
    return p;
}

/// Result element type R of a problem over T on `ctx`: the device's float, the reference's double.
template <class R, class T>
qkv::basic_varlen_output<R> run_ragged(const qkv::basic_varlen_problem<T>& p, const context_ptr& ctx) {
    if constexpr (std::is_same_v<T, double>) {
        return qkv::cpu::sdpa(p);
    } else if constexpr (std::is_same_v<R, double>) {
        return qkv::cpu::sdpa_f64(p);
    } else {
        return ctx->sdpa(p);
    }
}

/// The whole batch on `ctx` (null: the float64 reference): one call, or one per sequence where the
/// (B, Hq) slopes differ between sequences (each its own one-sequence batch, its rows copied in).
template <class R, class T>
qkv::basic_varlen_output<R> forward(const ragged_call& r, const ragged_values<T>& x, const context_ptr& ctx) {
    qkv::basic_varlen_problem<T> p = problem_of(r, x);
    validate(p);
    if (!slopes_differ<T>(r, x.slopes.view)) return run_ragged<R>(p, ctx);
    qkv::basic_varlen_output<R> all;
    all.output.assign(r.total_q * r.hq * r.ev, R{0});
    if (r.opt.options.return_lse) all.lse.assign(r.hq * r.total_q, R{0});
    for (std::size_t b = 0; b < r.batch(); ++b) {
        const auto q0 = static_cast<std::size_t>(r.cu_q[b]), k0 = static_cast<std::size_t>(r.cu_k[b]);
        const auto L = static_cast<std::size_t>(r.cu_q[b + 1]) - q0, S = static_cast<std::size_t>(r.cu_k[b + 1]) - k0;
        if (L == 0) continue;
        const std::int32_t cq[2] = {0, static_cast<std::int32_t>(L)}, ck[2] = {0, static_cast<std::int32_t>(S)};
        qkv::basic_varlen_problem<T> one = p;
        one.cu_seqlens_q = cq, one.cu_seqlens_k = ck;
        one.max_seqlen_q = L, one.max_seqlen_k = S;
        one.q = p.q.subspan(q0 * r.hq * r.e, L * r.hq * r.e);
        one.k = p.k.subspan(k0 * r.hkv * r.e, S * r.hkv * r.e);
        one.v = p.v.subspan(k0 * r.hkv * r.ev, S * r.hkv * r.ev);
        one.alibi_slopes = slopes_of<T>(r, x.slopes.view, b);
        const qkv::basic_varlen_output<R> o = run_ragged<R>(one, ctx);
        std::copy(o.output.begin(), o.output.end(), all.output.begin() + static_cast<std::ptrdiff_t>(q0 * r.hq * r.ev));
        for (std::size_t h = 0; h < r.hq && r.opt.options.return_lse; ++h)
            std::copy_n(o.lse.begin() + static_cast<std::ptrdiff_t>(h * L), L,
                        all.lse.begin() + static_cast<std::ptrdiff_t>(h * r.total_q + q0));
    }
    return all;
}

void check_device(const ragged_call& r, const context_ptr& ctx) {
    if (ctx && r.type == dtype::f64)
        refuse(
            "q, k and v are float64: a Vulkan device computes float32 (convert them), the float64 reference "
            "computes float64 (device=\"cpu\")");
}

/// (output (total_q, Hq, Ev) of the inputs' dtype, lse (Hq, total_q) float32 or None).
py::tuple varlen(py::handle q, py::handle k, py::handle v, std::vector<std::int32_t> cu_q,
                 std::vector<std::int32_t> cu_k, std::size_t max_q, std::size_t max_k, py::handle alibi_slopes,
                 const py::dict& options, py::handle device) {
    const context_ptr ctx = context_of(device);
    ragged_call r = read_ragged(q, k, v, std::move(cu_q), std::move(cu_k), max_q, max_k, alibi_slopes, options);
    check_device(r, ctx);
    choose_precision(r.opt, r.type, ctx);
    std::optional<out_array> out, lse;
    {
        py::gil_scoped_release nogil;
        const std::vector<std::size_t> none, out_shape{r.total_q, r.hq, r.ev}, lse_shape{r.hq, r.total_q};
        const auto finish = [&](auto&& o) {
            out = make_output(std::move(o.output), r.type, out_shape, none, "output");
            if (r.opt.options.return_lse) lse = make_output(std::move(o.lse), dtype::f32, lse_shape, none, "lse");
        };
        if (r.type == dtype::f64)
            finish(forward<double>(r, read_all<double>(r), ctx));
        else if (!ctx)
            finish(forward<double>(r, read_all<float>(r), ctx));
        else
            finish(forward<float>(r, read_all<float>(r), ctx));
    }
    return py::make_tuple(py::cast(std::move(*out)), lse ? py::cast(std::move(*lse)) : py::none());
}

/// Rows [first, first + n) of a packed (total, H, D) array, in (H, n, D) order, and back.
template <class T>
std::vector<T> rows_of(std::span<const T> packed, std::size_t first, std::size_t n, std::size_t heads, std::size_t d) {
    std::vector<T> out(heads * n * d);
    for (std::size_t h = 0; h < heads; ++h)
        for (std::size_t i = 0; i < n; ++i)
            std::copy_n(packed.data() + ((first + i) * heads + h) * d, d, out.data() + (h * n + i) * d);
    return out;
}

template <class T>
void put_rows(const std::vector<T>& block, std::vector<T>& packed, std::size_t first, std::size_t n, std::size_t heads,
              std::size_t d) {
    for (std::size_t h = 0; h < heads; ++h)
        for (std::size_t i = 0; i < n; ++i)
            std::copy_n(block.data() + (h * n + i) * d, d, packed.data() + ((first + i) * heads + h) * d);
}

struct packed_grads_f32 {
    std::vector<float> dq, dk, dv;
};
struct packed_grads_f64 {
    std::vector<double> dq, dk, dv;
};

/// Each sequence's backward pass, its gradients written into the packed (total, H, ·) arrays; a
/// sequence without queries or without keys has none (its rows stay zero).
template <class R, class T>
auto backward(const ragged_call& r, const ragged_values<T>& x, std::span<const T> d_out, std::span<const T> out,
              std::span<const T> lse, const context_ptr& ctx) {
    std::conditional_t<std::is_same_v<R, double>, packed_grads_f64, packed_grads_f32> g;
    g.dq.assign(r.total_q * r.hq * r.e, R{0});
    g.dk.assign(r.total_k * r.hkv * r.e, R{0});
    g.dv.assign(r.total_k * r.hkv * r.ev, R{0});
    const qkv::basic_varlen_problem<T> p = problem_of(r, x);
    validate(p);
    for (std::size_t b = 0; b < r.batch(); ++b) {
        const qkv::sdpa_shape s = qkv::sequence_shape(p, b);
        if (s.q_len == 0 || s.kv_len == 0) continue;
        const auto q0 = static_cast<std::size_t>(r.cu_q[b]), k0 = static_cast<std::size_t>(r.cu_k[b]);
        qkv::basic_varlen_sequence<T> seq = qkv::sequence_of(p, b);
        seq.problem.alibi_slopes = slopes_of<T>(r, x.slopes.view, b);
        const std::vector<T> o = rows_of(out, q0, s.q_len, r.hq, r.ev), d = rows_of(d_out, q0, s.q_len, r.hq, r.ev);
        std::vector<T> l(r.hq * s.q_len);
        for (std::size_t h = 0; h < r.hq; ++h)
            std::copy_n(lse.data() + h * r.total_q + q0, s.q_len, l.data() + h * s.q_len);
        const qkv::basic_sdpa_backward_problem<T> bp{.forward = seq.problem, .out = o, .lse = l, .d_out = d};
        qkv::basic_sdpa_gradients<R> grads;
        if constexpr (std::is_same_v<T, double>)
            grads = qkv::cpu::sdpa_backward(bp);
        else if constexpr (std::is_same_v<R, double>)
            grads = qkv::cpu::sdpa_backward_f64(bp);
        else
            grads = ctx->sdpa_backward(bp);
        put_rows(grads.dq, g.dq, q0, s.q_len, r.hq, r.e);
        put_rows(grads.dk, g.dk, k0, s.kv_len, r.hkv, r.e);
        put_rows(grads.dv, g.dv, k0, s.kv_len, r.hkv, r.ev);
    }
    return g;
}

/// (dq, dk, dv) of the inputs' dtype and packed shapes, from d_out and the forward's out
/// (total_q, Hq, Ev) and lse (Hq, total_q).
py::tuple varlen_backward(py::handle q, py::handle k, py::handle v, std::vector<std::int32_t> cu_q,
                          std::vector<std::int32_t> cu_k, std::size_t max_q, std::size_t max_k, py::handle d_out,
                          py::handle out, py::handle lse, py::handle alibi_slopes, const py::dict& options,
                          py::handle device) {
    const context_ptr ctx = context_of(device);
    ragged_call r = read_ragged(q, k, v, std::move(cu_q), std::move(cu_k), max_q, max_k, alibi_slopes, options);
    check_device(r, ctx);
    choose_precision(r.opt, r.type, ctx);
    const host_array da = read_array(d_out, "grad_output"), oa = read_array(out, "output"), la = read_array(lse, "lse");
    if (da.elements() != r.total_q * r.hq * r.ev || oa.elements() != da.elements() || la.elements() != r.hq * r.total_q)
        refuse("grad_output " + dims(da.shape) + ", output " + dims(oa.shape) + " and lse " + dims(la.shape) +
               " do not fit the call: (total_q, nheads, headdim_v) and (nheads, total_q)");
    std::optional<out_array> dq, dk, dv;
    {
        py::gil_scoped_release nogil;
        const std::vector<std::size_t> none;
        const auto finish = [&](auto&& g) {
            dq = make_output(std::move(g.dq), r.type, r.q.shape, none, "dq");
            dk = make_output(std::move(g.dk), r.type, r.k.shape, none, "dk");
            dv = make_output(std::move(g.dv), r.type, r.v.shape, none, "dv");
        };
        const auto run = [&]<class R, class T>() {
            values<T> dd, od, ld;
            read_values(da, dd, "grad_output"), read_values(oa, od, "output"), read_values(la, ld, "lse");
            finish(backward<R>(r, read_all<T>(r), dd.view, od.view, ld.view, ctx));
        };
        if (r.type == dtype::f64)
            run.template operator()<double, double>();
        else if (!ctx)
            run.template operator()<double, float>();
        else
            run.template operator()<float, float>();
    }
    return py::make_tuple(py::cast(std::move(*dq)), py::cast(std::move(*dk)), py::cast(std::move(*dv)));
}

}  // namespace

void bind_varlen(py::module_& m) {
    m.def("_varlen", &varlen, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("cu_seqlens_q"),
          py::arg("cu_seqlens_k"), py::arg("max_seqlen_q"), py::arg("max_seqlen_k"), py::kw_only(),
          py::arg("alibi_slopes"), py::arg("options"), py::arg("context"),
          "Attention over a ragged batch of host arrays (qkv/flash_attn.py calls it). Returns (output, lse or None) "
          "as _Array buffers.");
    m.def("_varlen_backward", &varlen_backward, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("cu_seqlens_q"),
          py::arg("cu_seqlens_k"), py::arg("max_seqlen_q"), py::arg("max_seqlen_k"), py::arg("grad_output"),
          py::arg("output"), py::arg("lse"), py::kw_only(), py::arg("alibi_slopes"), py::arg("options"),
          py::arg("context"), "The backward pass of _varlen (qkv/_autograd.py calls it). Returns (dq, dk, dv).");
}

}  // namespace qkv::python
