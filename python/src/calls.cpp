// The attention calls of the Python package (calls.hpp).
#include "calls.hpp"

#include <pybind11/stl.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <string_view>
#include <utility>

#include "objects.hpp"
#include "qkv/runtime/cpu.hpp"
#include "qkv/runtime/element_type.hpp"
#include "qkv/runtime/error.hpp"
#include "qkv/runtime/options.hpp"
#include "qkv/vulkan/error.hpp"
#include "qkv/vulkan/kv_cache.hpp"
#include "qkv/vulkan/sdpa_call.hpp"
#include "qkv/vulkan/tensor.hpp"

namespace qkv::python {
namespace {

[[noreturn]] void refuse(const std::string& message) { throw qkv::invalid_argument(message); }

std::size_t product(const std::vector<std::size_t>& v, std::size_t first, std::size_t end) {
    std::size_t n = 1;
    for (std::size_t d = first; d < end; ++d) {
        if (v[d] != 0 && n > std::numeric_limits<std::size_t>::max() / v[d]) refuse("a shape whose size overflows");
        n *= v[d];
    }
    return n;
}

/// Refuses, before anything is allocated, a call whose host buffers would not fit this machine's
/// memory: an array that claims more than exists (a broadcast view) must be an error, never a
/// process the kernel kills for touching memory it promised.
void check_host_bytes(double bytes, const char* what) {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    if (pages <= 0 || page <= 0) return;
    const double physical = static_cast<double>(pages) * static_cast<double>(page);
    if (bytes > physical)
        throw qkv::vulkan::out_of_memory(std::string(what) + ": " + std::to_string(bytes / (1 << 30)) +
                                         " GiB of host memory for the inputs and results; this machine has " +
                                         std::to_string(physical / (1 << 30)) + " GiB");
}

template <class T>
T get(const py::dict& d, const char* key, T fallback) {
    if (!d.contains(key) || d[key].is_none()) return fallback;
    try {
        return d[key].cast<T>();
    } catch (const py::cast_error&) {
        throw py::type_error(std::string(key) + ": " + std::string(py::str(py::type::of(d[key]).attr("__name__"))) +
                             " is not the expected type");
    }
}

/// A float32 option from a Python float: refused where float32 would change it beyond rounding
/// (beyond its range, or a nonzero value that would become 0); NaN and inf go on to qkv::validate.
float get_float(const py::dict& d, const char* key, float fallback) {
    const double x = get<double>(d, key, static_cast<double>(fallback));
    if (std::isfinite(x) && (std::abs(x) > static_cast<double>(std::numeric_limits<float>::max()) ||
                             (x != 0 && static_cast<float>(x) == 0.0f)))
        refuse(std::string(key) + " = " + std::to_string(x) + " is beyond float32's range (qkv's options are float32)");
    return static_cast<float>(x);
}

template <class T>
struct is_optional : std::false_type {};
template <class T>
struct is_optional<std::optional<T>> : std::true_type {
    using value_type = T;
};

/// An option's value from Python: a bool exactly, an integer in range, a float that float32 holds
/// (to rounding), an enum by its name (qkv::parse_name: "top_left", "q8_0", "row_tiles", ...).
template <class T>
T from_python(py::handle value, const std::string& key) {
    const auto type_name = [&] { return std::string(py::str(py::type::of(value).attr("__name__"))); };
    if constexpr (is_optional<T>::value) {
        return from_python<typename is_optional<T>::value_type>(value, key);
    } else if constexpr (std::is_same_v<T, bool>) {
        if (!py::isinstance<py::bool_>(value))
            throw py::type_error(key + " must be a bool (it is a " + type_name() + ")");
        return value.cast<bool>();
    } else if constexpr (std::is_enum_v<T>) {
        if (!py::isinstance<py::str>(value)) throw py::type_error(key + " must be a str (it is a " + type_name() + ")");
        const std::string text = value.cast<std::string>();
        if (const auto v = qkv::parse_name<T>(text)) return *v;
        refuse(key + " must be one of " + qkv::names_joined<T>(", ") + " (it is \"" + text + "\")");
    } else if constexpr (std::is_same_v<T, float>) {
        if (py::isinstance<py::bool_>(value) || !(py::isinstance<py::float_>(value) || py::isinstance<py::int_>(value)))
            throw py::type_error(key + " must be a number (it is a " + type_name() + ")");
        py::dict one;
        one[key.c_str()] = value;
        return get_float(one, key.c_str(), 0.0f);
    } else {
        if (py::isinstance<py::bool_>(value) || !py::isinstance<py::int_>(value))
            throw py::type_error(key + " must be an int (it is a " + type_name() + ")");
        try {
            return value.cast<T>();
        } catch (const py::cast_error&) {
            refuse(key + " = " + std::string(py::str(value)) + " is beyond a 64-bit integer");
        }
    }
}

/// The shapes of q (..., Hq, L, E), k (..., Hkv, S, E), v (..., Hkv, S, Ev): the dimensions before
/// the last three are batch dimensions (flattened into B), the 2-D form is one head.
struct call_shape {
    std::vector<std::size_t> batch_dims;
    qkv::sdpa_shape shape;
};

struct qkv_dims {
    std::size_t batch = 1, heads = 1, len = 0, width = 0;
};

qkv_dims split(const host_array& a, const char* name, std::vector<std::size_t>* batch_dims) {
    if (a.rank() < 2)
        refuse(std::string(name) + " has shape " + dims(a.shape) + ": it needs at least 2 dimensions, (..., L, E)");
    const std::size_t r = a.rank();
    qkv_dims d;
    d.len = a.shape[r - 2];
    d.width = a.shape[r - 1];
    d.heads = r >= 3 ? a.shape[r - 3] : 1;
    d.batch = r >= 4 ? product(a.shape, 0, r - 3) : 1;
    if (batch_dims)
        batch_dims->assign(a.shape.begin(), a.shape.begin() + static_cast<std::ptrdiff_t>(r >= 3 ? r - 3 : 0));
    return d;
}

call_shape shape_of(const host_array& q, const host_array* k, const host_array* v) {
    call_shape c;
    const qkv_dims dq = split(q, "query", &c.batch_dims);
    c.shape.batch = dq.batch;
    c.shape.q_heads = dq.heads;
    c.shape.q_len = dq.len;
    c.shape.d_qk = dq.width;
    if (!k || !v) return c;
    std::vector<std::size_t> kb, vb;
    const qkv_dims dk = split(*k, "key", &kb), dv = split(*v, "value", &vb);
    if (k->rank() != q.rank() || v->rank() != q.rank())
        refuse("query " + dims(q.shape) + ", key " + dims(k->shape) + " and value " + dims(v->shape) +
               " must have the same number of dimensions");
    if (kb != c.batch_dims || vb != c.batch_dims)
        refuse("query " + dims(q.shape) + ", key " + dims(k->shape) + " and value " + dims(v->shape) +
               " must have the same batch dimensions (all but the last three)");
    c.shape.kv_heads = dk.heads;
    c.shape.kv_len = dk.len;
    c.shape.d_v = dv.width;
    if (dk.width != dq.width)
        refuse("query " + dims(q.shape) + " and key " + dims(k->shape) + " must have the same last dimension (E)");
    if (dv.len != dk.len || dv.heads != dk.heads)
        refuse("key " + dims(k->shape) + " and value " + dims(v->shape) +
               " must have the same heads and length (Hkv, S)");
    return c;
}

/// A mask over (batch..., Hq, L, S), read in the compact form qkv broadcasts from: each of the
/// four dimensions qkv knows (the batch dimensions together, Hq, L, S) is kept where the mask has
/// it and 1 where the mask broadcasts along it.
struct mask_view {
    host_array view;                      ///< the mask's elements in qkv's order (stride 0 where broadcast)
    std::vector<std::size_t> mask_shape;  ///< (b, h, l, s), each 1 or the whole
};

mask_view compact_mask(const host_array& m, const call_shape& c) {
    std::vector<std::size_t> target = c.batch_dims;
    const qkv::sdpa_shape& s = c.shape;
    target.insert(target.end(), {s.q_heads, s.q_len, s.kv_len});
    const std::size_t nb = c.batch_dims.size();
    // Batch dimensions of a 2- or 3-D call: none (B = 1; a 2-D call has no head dimension either:
    // the target is (1, L, S) then, with Hq = 1).
    if (m.rank() > target.size())
        refuse("attn_mask " + dims(m.shape) + " has more dimensions than the attention weights " + dims(target));
    mask_view out;
    out.view.type = m.type;
    out.view.data = m.data;
    out.view.owner = m.owner;
    const std::size_t pad = target.size() - m.rank();
    std::vector<std::size_t> size(target.size());
    std::vector<std::ptrdiff_t> stride(target.size());
    for (std::size_t d = 0; d < target.size(); ++d) {
        const std::size_t have = d < pad ? 1 : m.shape[d - pad];
        const std::ptrdiff_t st = d < pad ? 0 : m.strides[d - pad];
        if (have != target[d] && have != 1)
            refuse("attn_mask " + dims(m.shape) + " does not broadcast to the attention weights " + dims(target) +
                   " (dimension " + std::to_string(d) + ")");
        size[d] = have;
        stride[d] = have == 1 ? 0 : st;
    }
    // The batch group: kept whole if the mask has any batch dimension, else one.
    bool batch_kept = false;
    for (std::size_t d = 0; d < nb; ++d) batch_kept = batch_kept || size[d] != 1;
    for (std::size_t d = 0; d < nb; ++d) size[d] = batch_kept ? target[d] : 1;
    out.view.shape = size;
    out.view.strides = stride;
    const std::size_t b = batch_kept ? product(target, 0, nb) : 1;
    const std::size_t h = target.size() >= 3 ? size[nb] : 1;
    out.mask_shape = {b, h, size[target.size() - 2], size[target.size() - 1]};
    return out;
}

/// A (Hq,) vector (sinks, alibi_slopes), or (B, Hq) slopes: read as they are; qkv::validate checks
/// the counts.
host_array per_head(py::handle object, const char* name, std::size_t max_rank) {
    host_array a = read_array(object, name);
    if (a.rank() < 1 || a.rank() > max_rank)
        refuse(std::string(name) + " has shape " + dims(a.shape) +
               (max_rank == 1 ? ": it needs one value per query head, (Hq,)"
                              : ": it needs one value per query head, (Hq,), or per batch and head, (B, Hq)"));
    return a;
}

/// Everything of one host call, read from Python (with the GIL) and gathered (without it).
struct host_call {
    call_shape c;
    dtype type = dtype::f32;  ///< q's, k's and v's
    std::optional<host_array> q, k, v, mask, sinks, slopes;
    std::vector<std::size_t> mask_shape;
    bool bool_mask = false;
    std::vector<std::size_t> out_perm;
    call_options opt;

    // Read: over the caller's memory where it is contiguous already, else gathered.
    values<float> qf, kf, vf, additive_f, sinks_f, slopes_f;
    values<double> qd, kd, vd, additive_d, sinks_d, slopes_d;
    std::vector<std::uint8_t> mask_bits;
};

host_call read_call(py::handle q, py::handle k, py::handle v, py::handle mask, bool mask_is_bool, py::handle sinks,
                    py::handle alibi_slopes, const py::dict& options, const std::vector<std::size_t>& out_perm) {
    host_call h;
    h.opt = read_options(options);
    h.q = read_array(q, "query");
    if (!k.is_none() || !v.is_none()) {
        h.k = read_array(k, "key");
        h.v = read_array(v, "value");
        h.c = shape_of(*h.q, &*h.k, &*h.v);
    } else {
        h.c = shape_of(*h.q, nullptr, nullptr);
    }
    h.type = h.q->type;
    for (const host_array* a : {h.k ? &*h.k : nullptr, h.v ? &*h.v : nullptr})
        if (a && a->type != h.type)
            refuse(std::string("query is ") + to_string(h.type) + ", " + (a == &*h.k ? "key" : "value") + " is " +
                   to_string(a->type) + ": query, key and value must share one dtype");
    if (!is_float(h.type))
        refuse(std::string("query, key and value are ") + to_string(h.type) + ": they must be floating point");
    if (!out_perm.empty()) {
        std::vector<std::size_t> sorted = out_perm;
        std::sort(sorted.begin(), sorted.end());
        for (std::size_t d = 0; d < sorted.size(); ++d)
            if (sorted[d] != d || out_perm.size() != h.q->rank()) refuse("out_perm is not a permutation of the output");
    }
    h.out_perm = out_perm;
    if (!mask.is_none()) {
        h.mask = read_array(mask, "attn_mask");
        h.bool_mask = mask_is_bool;
        if (mask_is_bool != (h.mask->type == dtype::boolean))
            refuse(std::string("attn_mask is ") + to_string(h.mask->type) +
                   (mask_is_bool ? " but was passed as bool" : " but was passed as a float mask"));
    }
    if (!sinks.is_none()) h.sinks = per_head(sinks, "sinks", 1);
    if (!alibi_slopes.is_none()) h.slopes = per_head(alibi_slopes, "alibi_slopes", 2);
    return h;
}

/// Gathers every input (no GIL), into float or, for float64 inputs, double.
void gather_call(host_call& h, const char* what) {
    const qkv::sdpa_shape& s = h.c.shape;
    const bool f64 = h.type == dtype::f64;
    std::optional<mask_view> mv;
    if (h.mask) {
        mv = compact_mask(*h.mask, h.c);
        h.mask_shape = mv->mask_shape;
    }
    // Host memory for the gathered inputs and the results (output, weights, lse), in doubles on the
    // reference path (its results are float64).
    const double elem = f64 ? 8 : 4;
    double bytes = 0;
    for (const std::optional<host_array>* a : {&h.q, &h.k, &h.v})
        if (*a) bytes += elem * static_cast<double>((*a)->elements());
    if (mv) bytes += elem * static_cast<double>(mv->view.elements());
    const double rows = static_cast<double>(s.batch) * static_cast<double>(s.q_heads) * static_cast<double>(s.q_len);
    bytes += 8 * rows * (static_cast<double>(s.d_v) + 1);
    if (h.opt.options.return_weights) bytes += 8 * rows * static_cast<double>(s.kv_len);
    check_host_bytes(2 * bytes, what);  // the results are written once more as the caller's dtype

    const auto fill = [&](const std::optional<host_array>& a, values<float>& f, values<double>& d, const char* name) {
        if (!a) return;
        if (f64)
            read_values(*a, d, name);
        else
            read_values(*a, f, name);
    };
    fill(h.q, h.qf, h.qd, "query");
    fill(h.k, h.kf, h.kd, "key");
    fill(h.v, h.vf, h.vd, "value");
    if (mv) {
        if (h.bool_mask) {
            h.mask_bits.resize(mv->view.elements());
            gather(mv->view, std::span<std::uint8_t>(h.mask_bits), "attn_mask");
        } else if (f64) {
            read_values(mv->view, h.additive_d, "attn_mask");
        } else {
            read_values(mv->view, h.additive_f, "attn_mask");
        }
    }
    // Sinks and slopes are float32 data of qkv's problem whatever the inputs' dtype (float64 on
    // the float64 path).
    const auto small = [&](const std::optional<host_array>& a, values<float>& f, values<double>& d, const char* name) {
        if (!a) return;
        if (!is_float(a->type))
            refuse(std::string(name) + ": " + to_string(a->type) + " where floating-point values are needed");
        d.owned.resize(a->elements());
        gather(*a, std::span<double>(d.owned), name);
        d.view = d.owned;
        if (!f64) {
            f.owned.resize(d.owned.size());
            for (std::size_t i = 0; i < d.owned.size(); ++i) {
                // float64 sinks or slopes for a float32 call: rounded to float32, but never from
                // beyond its range to inf.
                const double x = d.owned[i];
                if (std::abs(x) > static_cast<double>(std::numeric_limits<float>::max()) && std::isfinite(x))
                    refuse(std::string(name) + "[" + std::to_string(i) + "] is beyond float32's range");
                f.owned[i] = static_cast<float>(x);
            }
            f.view = f.owned;
        }
    };
    small(h.sinks, h.sinks_f, h.sinks_d, "sinks");
    small(h.slopes, h.slopes_f, h.slopes_d, "alibi_slopes");
}

template <class T>
qkv::basic_sdpa_problem<T> problem_of(const host_call& h, std::span<const T> q, std::span<const T> k,
                                      std::span<const T> v, std::span<const T> additive, std::span<const T> sinks,
                                      std::span<const T> slopes) {
    qkv::basic_sdpa_problem<T> p;
    p.shape = h.c.shape;
    p.q = q, p.k = k, p.v = v;
    p.mask = h.mask_bits;
    p.additive_mask = additive;
    if (h.mask) p.mask_shape = h.mask_shape;
    p.options = h.opt.options;
    p.sinks = sinks;
    p.alibi_slopes = slopes;
    return p;
}

/// The ALiBi slopes of batch element b: all of them for (Hq,) slopes, row b of (B, Hq).
template <class T>
std::span<const T> slopes_of(const host_call& h, std::span<const T> slopes, std::size_t b) {
    if (!h.slopes || h.slopes->rank() == 1) return slopes;
    const std::size_t hq = h.c.shape.q_heads;
    if (h.slopes->shape[0] != h.c.shape.batch || h.slopes->shape[1] != hq)
        refuse("alibi_slopes has shape " + dims(h.slopes->shape) + "; per batch and head it must be (B, Hq) = (" +
               std::to_string(h.c.shape.batch) + ", " + std::to_string(hq) + ")");
    return slopes.subspan(b * hq, hq);
}

/// Whether (B, Hq) slopes differ between batch elements (then each runs as its own call).
template <class T>
bool slopes_differ(const host_call& h, std::span<const T> slopes) {
    if (!h.slopes || h.slopes->rank() == 1) return false;
    const std::size_t hq = h.c.shape.q_heads;
    (void)slopes_of(h, slopes, 0);  // checks the shape
    for (std::size_t i = hq; i < slopes.size(); ++i)
        if (slopes[i] != slopes[i % hq]) return true;
    return false;
}

/// The part of an input that batch element b reads (q, k, v: B equal blocks; a mask: its block of
/// b, or the whole where it broadcasts over the batch).
template <class T>
std::span<const T> block_of(std::span<const T> all, std::size_t blocks, std::size_t b) {
    if (all.empty() || blocks <= 1) return all;
    const std::size_t n = all.size() / blocks;
    return all.subspan(b * n, n);
}

struct results {
    std::vector<float> out, lse, weights;      // a Vulkan device
    std::vector<double> outd, lsed, weightsd;  // the float64 reference
    bool f64 = false;
};

void append(std::vector<float>& to, std::vector<float>&& from) { to.insert(to.end(), from.begin(), from.end()); }
void append(std::vector<double>& to, std::vector<double>&& from) { to.insert(to.end(), from.begin(), from.end()); }

/// Runs the gathered call on `ctx` (null: the float64 reference), batch element by batch element
/// where the ALiBi slopes differ between them. No GIL.
template <class T>
results run_gathered(host_call& h, const context_ptr& ctx, std::span<const T> q, std::span<const T> k,
                     std::span<const T> v, std::span<const T> additive, std::span<const T> sinks,
                     std::span<const T> slopes, const qkv::vulkan::kv_cache* cache) {
    results r;
    r.f64 = ctx == nullptr;
    const std::size_t B = h.c.shape.batch;
    const bool split = slopes_differ(h, slopes);
    const std::size_t calls = split ? B : 1;
    const std::size_t mask_blocks = h.mask && h.mask_shape[0] == B ? B : 1;
    for (std::size_t b = 0; b < calls; ++b) {
        qkv::basic_sdpa_problem<T> p = problem_of(h, q, k, v, additive, sinks, slopes_of(h, slopes, b));
        if (split) {  // batch element b alone, with its own slopes
            p.shape.batch = 1;
            p.q = block_of(q, B, b), p.k = block_of(k, B, b), p.v = block_of(v, B, b);
            p.additive_mask = block_of(additive, mask_blocks, b);
            p.mask = block_of(std::span<const std::uint8_t>(h.mask_bits), mask_blocks, b);
            if (h.mask) p.mask_shape[0] = 1;
        }
        if (cache) {
            p.k = {}, p.v = {};
            if (!h.mask) p.shape.kv_len = 0;  // the cache's size when the call runs
            if constexpr (std::is_same_v<T, float>) {
                qkv::sdpa_output o = ctx->sdpa(p, *cache);
                append(r.out, std::move(o.output));
                append(r.lse, std::move(o.lse));
            }
        } else if (ctx) {
            if constexpr (std::is_same_v<T, float>) {
                qkv::sdpa_output o = ctx->sdpa(p);
                append(r.out, std::move(o.output));
                append(r.lse, std::move(o.lse));
                append(r.weights, std::move(o.weights));
            }
        } else {
            qkv::sdpa_output_f64 o;
            if constexpr (std::is_same_v<T, float>)
                o = qkv::cpu::sdpa_f64(p);
            else
                o = qkv::cpu::sdpa(p);
            append(r.outd, std::move(o.output));
            append(r.lsed, std::move(o.lse));
            append(r.weightsd, std::move(o.weights));
        }
    }
    return r;
}

void choose_precision(host_call& h, const context_ptr& ctx) { choose_precision(h.opt, h.type, ctx); }

py::object wrap(out_array&& a) { return py::cast(std::move(a)); }

/// The results as arrays of the inputs' dtype (lse: float32), shaped like the call.
py::tuple finish(host_call& h, results&& r) {
    const qkv::sdpa_shape& s = h.c.shape;
    std::vector<std::size_t> lead = h.c.batch_dims;
    if (h.q->rank() >= 3) lead.push_back(s.q_heads);
    std::vector<std::size_t> out_shape = lead, lse_shape = lead, weight_shape = lead;
    out_shape.insert(out_shape.end(), {s.q_len, s.d_v});
    lse_shape.push_back(s.q_len);
    weight_shape.insert(weight_shape.end(), {s.q_len, s.kv_len});
    std::optional<out_array> out, lse, weights;
    {
        py::gil_scoped_release nogil;
        const std::vector<std::size_t> none;
        if (r.f64) {
            out = make_output(r.outd, h.type, out_shape, h.out_perm, "output");
            if (h.opt.options.return_lse) lse = make_output(r.lsed, dtype::f32, lse_shape, none, "lse");
            if (h.opt.options.return_weights)
                weights = make_output(r.weightsd, h.type, weight_shape, none, "attention weights");
        } else {
            out = make_output(std::move(r.out), h.type, out_shape, h.out_perm, "output");
            if (h.opt.options.return_lse) lse = make_output(std::move(r.lse), dtype::f32, lse_shape, none, "lse");
            if (h.opt.options.return_weights)
                weights = make_output(std::move(r.weights), h.type, weight_shape, none, "attention weights");
        }
    }
    return py::make_tuple(wrap(std::move(*out)), lse ? wrap(std::move(*lse)) : py::none(),
                          weights ? wrap(std::move(*weights)) : py::none());
}

py::tuple sdpa(py::handle q, py::handle k, py::handle v, py::handle mask, bool mask_is_bool, py::handle sinks,
               py::handle alibi_slopes, const py::dict& options, py::handle device,
               const std::vector<std::size_t>& out_perm) {
    const context_ptr ctx = context_of(device);
    host_call h = read_call(q, k, v, mask, mask_is_bool, sinks, alibi_slopes, options, out_perm);
    if (!h.k) refuse("key and value are needed");
    if (ctx && h.type == dtype::f64)
        refuse(
            "query, key and value are float64: a Vulkan device computes float32 (convert them), the float64 "
            "reference computes float64 (device=\"cpu\")");
    choose_precision(h, ctx);
    results r;
    {
        py::gil_scoped_release nogil;
        gather_call(h, "scaled_dot_product_attention");
        if (h.type == dtype::f64)
            r = run_gathered<double>(h, ctx, h.qd.view, h.kd.view, h.vd.view, h.additive_d.view, h.sinks_d.view,
                                     h.slopes_d.view, nullptr);
        else
            r = run_gathered<float>(h, ctx, h.qf.view, h.kf.view, h.vf.view, h.additive_f.view, h.sinks_f.view,
                                    h.slopes_f.view, nullptr);
    }
    return finish(h, std::move(r));
}

py::tuple decode(py_kv_cache& cache, py::handle q, py::handle mask, bool mask_is_bool, py::handle sinks,
                 py::handle alibi_slopes, const py::dict& options) {
    host_call h = read_call(q, py::none(), py::none(), mask, mask_is_bool, sinks, alibi_slopes, options, {});
    if (h.type == dtype::f64) refuse("query is float64: a K/V cache on a Vulkan device computes float32");
    choose_precision(h, cache.context);
    const qkv::kv_layout& cs = cache.cache.layout();
    h.c.shape.kv_heads = cs.kv_heads;
    h.c.shape.d_v = cs.d_v;
    h.c.shape.kv_len = cache.cache.size();
    if (h.c.shape.kv_len == 0) refuse("KVCache.decode: the cache is empty (append keys and values first)");
    results r;
    {
        py::gil_scoped_release nogil;
        gather_call(h, "KVCache.decode");
        r = run_gathered<float>(h, cache.context, h.qf.view, {}, {}, h.additive_f.view, h.sinks_f.view, h.slopes_f.view,
                                &cache.cache);
    }
    return finish(h, std::move(r));
}

/// Host rows for a cache append: (B, Hkv, rows, width), as float.
values<float> rows_of(const host_array& a, const char* name, const qkv::kv_layout& s, std::size_t width,
                      std::size_t& rows) {
    if (a.rank() != 4 || a.shape[0] != s.batch || a.shape[1] != s.kv_heads || a.shape[3] != width)
        refuse(std::string(name) + " has shape " + dims(a.shape) + "; the cache takes (B, Hkv, rows, " +
               std::string(name[0] == 'k' ? "E" : "Ev") + ") = (" + std::to_string(s.batch) + ", " +
               std::to_string(s.kv_heads) + ", rows, " + std::to_string(width) + ")");
    rows = a.shape[2];
    values<float> out;
    py::gil_scoped_release nogil;
    read_values(a, out, name);
    return out;
}

void cache_append(py_kv_cache& c, py::handle k, py::handle v) {
    const qkv::kv_layout& s = c.cache.layout();
    if (py::isinstance<py_tensor>(k) || py::isinstance<py_tensor>(v)) {
        const py_tensor& kt = k.cast<const py_tensor&>();
        const py_tensor& vt = v.cast<const py_tensor&>();
        const auto& shape = kt.tensor.shape();
        if (shape.size() != 4) refuse("key tensor has shape " + dims(shape) + "; the cache takes (B, Hkv, rows, E)");
        py::gil_scoped_release nogil;
        c.cache.append(kt.tensor, vt.tensor, shape[2]);
        return;
    }
    std::size_t k_rows = 0, v_rows = 0;
    const host_array ka = read_array(k, "key"), va = read_array(v, "value");
    const values<float> kf = rows_of(ka, "key", s, s.d_qk, k_rows);
    const values<float> vf = rows_of(va, "value", s, s.d_v, v_rows);
    if (k_rows != v_rows)
        refuse("key has " + std::to_string(k_rows) + " rows, value " + std::to_string(v_rows) + ": they must match");
    py::gil_scoped_release nogil;
    c.cache.append(kf.view, vf.view, k_rows);
}

/// Device tensors: q, k, v (B, H, L, E) f32 or f16 (one type, which sets the precision); the
/// results new f32 tensors: (output (B, Hq, L, Ev), lse (B, Hq, L) or None, weights (B, Hq, L, S) or
/// None); host masks, sinks and slopes are kept with the plan.
py::tuple sdpa_tensors(const py_tensor& q, const py_tensor& k, const py_tensor& v, py::handle mask, bool mask_is_bool,
                       py::handle sinks, py::handle alibi_slopes, const py::dict& options) {
    const context_ptr& ctx = q.context;
    if (k.context != ctx || v.context != ctx) refuse("query, key and value tensors must be made on the same Context");
    const auto four = [](const py_tensor& t, const char* name) {
        std::vector<std::size_t> s = t.tensor.shape();
        if (s.size() < 2 || s.size() > 4)
            refuse(std::string(name) + " tensor has shape " + dims(s) + ": it needs (B, H, L, E), (H, L, E) or (L, E)");
        while (s.size() < 4) s.insert(s.begin(), 1);
        return s;
    };
    const auto qs = four(q, "query"), ks = four(k, "key"), vs = four(v, "value");
    call_options opt = read_options(options);
    const qkv::element_type type = q.tensor.type();
    if (k.tensor.type() != type || v.tensor.type() != type)
        refuse("query, key and value tensors must share one element type (they are " +
               std::string(qkv::to_string(type)) + ", " + std::string(qkv::to_string(k.tensor.type())) + " and " +
               std::string(qkv::to_string(v.tensor.type())) + ")");
    opt.options.precision = type == qkv::element_type::f16 ? qkv::precision::fp16 : qkv::precision::fp32;
    host_call h;
    h.opt = opt;
    h.c.shape = {.batch = qs[0],
                 .q_heads = qs[1],
                 .kv_heads = ks[1],
                 .q_len = qs[2],
                 .kv_len = ks[2],
                 .d_qk = qs[3],
                 .d_v = vs[3]};
    if (ks[0] != qs[0] || vs[0] != qs[0] || ks[3] != qs[3] || vs[1] != ks[1] || vs[2] != ks[2])
        refuse("query " + dims(q.tensor.shape()) + ", key " + dims(k.tensor.shape()) + " and value " +
               dims(v.tensor.shape()) + " do not fit together: (B, Hq, L, E), (B, Hkv, S, E), (B, Hkv, S, Ev)");
    h.c.batch_dims = {qs[0]};
    if (!mask.is_none()) {
        h.mask = read_array(mask, "attn_mask");
        h.bool_mask = mask_is_bool;
        if (mask_is_bool != (h.mask->type == dtype::boolean)) refuse("attn_mask: bool and float masks differ");
    }
    if (!sinks.is_none()) h.sinks = per_head(sinks, "sinks", 1);
    if (!alibi_slopes.is_none()) h.slopes = per_head(alibi_slopes, "alibi_slopes", 1);
    h.type = dtype::f32;  // of the host data: masks, sinks, slopes
    py_tensor out{ctx, {}}, lse{ctx, {}}, weights{ctx, {}};
    {
        py::gil_scoped_release nogil;
        gather_call(h, "scaled_dot_product_attention over Tensors");  // no q, k, v: they are on the device
        const qkv::sdpa_problem desc =
            problem_of<float>(h, {}, {}, {}, h.additive_f.view, h.sinks_f.view, h.slopes_f.view);
        qkv::vulkan::sdpa_call call(*ctx, desc);
        out.tensor = qkv::vulkan::tensor(*ctx, {qs[0], qs[1], qs[2], vs[3]});
        if (opt.options.return_lse) lse.tensor = qkv::vulkan::tensor(*ctx, {qs[0], qs[1], qs[2]});
        if (opt.options.return_weights) weights.tensor = qkv::vulkan::tensor(*ctx, {qs[0], qs[1], qs[2], ks[2]});
        call.run({.q = &q.tensor,
                  .k = &k.tensor,
                  .v = &v.tensor,
                  .out = &out.tensor,
                  .lse = opt.options.return_lse ? &lse.tensor : nullptr,
                  .weights = opt.options.return_weights ? &weights.tensor : nullptr});
    }
    return py::make_tuple(std::move(out), opt.options.return_lse ? py::cast(std::move(lse)) : py::none(),
                          opt.options.return_weights ? py::cast(std::move(weights)) : py::none());
}

/// The backward pass over host arrays (qkv/_autograd.py): q, k and v as the forward read them, and
/// d_out, out (..., Hq, L, Ev) and lse (..., Hq, L) in qkv's order; (dq, dk, dv, d_sinks or None,
/// d_mask or None), dq, dk and dv of the inputs' dtype and of q's, k's and v's shapes, d_sinks (Hq,)
/// and, with return_d_mask, the additive mask's gradient in its compact shape (compact_mask: (b, h,
/// l, s), the mask's dimensions kept, 1 where it broadcasts), float32 (float64 on the reference
/// path). No GIL while it computes.
py::tuple sdpa_backward(py::handle q, py::handle k, py::handle v, py::handle d_out, py::handle out, py::handle lse,
                        py::handle mask, bool mask_is_bool, py::handle sinks, py::handle alibi_slopes,
                        const py::dict& options, py::handle device, bool return_d_mask) {
    const context_ptr ctx = context_of(device);
    host_call h = read_call(q, k, v, mask, mask_is_bool, sinks, alibi_slopes, options, {});
    if (!h.k) refuse("key and value are needed");
    if (return_d_mask && (!h.mask || h.bool_mask)) refuse("the mask's gradient needs an additive (float) attn_mask");
    if (ctx && h.type == dtype::f64)
        refuse(
            "query, key and value are float64: a Vulkan device computes float32, the float64 reference "
            "float64 (device=\"cpu\")");
    choose_precision(h, ctx);
    const qkv::sdpa_shape& s = h.c.shape;
    const host_array da = read_array(d_out, "grad_output"), oa = read_array(out, "output"), la = read_array(lse, "lse");
    const std::size_t rows = s.batch * s.q_heads * s.q_len;
    if (da.elements() != rows * s.d_v || oa.elements() != rows * s.d_v || la.elements() != rows)
        refuse("grad_output " + dims(da.shape) + ", output " + dims(oa.shape) + " and lse " + dims(la.shape) +
               " do not fit the call: (..., Hq, L, Ev) and (..., Hq, L)");
    const std::vector<std::size_t> q_shape = h.q->shape, k_shape = h.k->shape, v_shape = h.v->shape;
    const bool f64 = h.type == dtype::f64;
    std::optional<out_array> dq, dk, dv, ds, dm;
    {
        py::gil_scoped_release nogil;
        gather_call(h, "the backward pass of scaled_dot_product_attention");
        const std::vector<std::size_t> none;
        const auto finish_grads = [&](auto&& g) {
            dq = make_output(std::move(g.dq), h.type, q_shape, none, "dq");
            dk = make_output(std::move(g.dk), h.type, k_shape, none, "dk");
            dv = make_output(std::move(g.dv), h.type, v_shape, none, "dv");
            if (!g.d_sinks.empty())
                ds = make_output(std::move(g.d_sinks), f64 ? dtype::f64 : dtype::f32, {s.q_heads}, none, "d_sinks");
            if (return_d_mask)
                dm = make_output(std::move(g.d_additive_mask), f64 ? dtype::f64 : dtype::f32, h.mask_shape, none,
                                 "d_mask");
        };
        if (f64) {
            if (slopes_differ<double>(h, h.slopes_d.view))
                refuse("alibi_slopes differ between batch elements: the backward pass takes (Hq,) slopes");
            values<double> dd, od, ld;
            read_values(da, dd, "grad_output"), read_values(oa, od, "output"), read_values(la, ld, "lse");
            const qkv::sdpa_backward_problem_f64 b{
                .forward = problem_of<double>(h, h.qd.view, h.kd.view, h.vd.view, h.additive_d.view, h.sinks_d.view,
                                              slopes_of<double>(h, h.slopes_d.view, 0)),
                .out = od.view,
                .lse = ld.view,
                .d_out = dd.view,
                .return_d_additive_mask = return_d_mask};
            finish_grads(qkv::cpu::sdpa_backward(b));
        } else {
            if (slopes_differ<float>(h, h.slopes_f.view))
                refuse("alibi_slopes differ between batch elements: the backward pass takes (Hq,) slopes");
            values<float> dd, od, ld;
            read_values(da, dd, "grad_output"), read_values(oa, od, "output"), read_values(la, ld, "lse");
            const qkv::sdpa_backward_problem b{
                .forward = problem_of<float>(h, h.qf.view, h.kf.view, h.vf.view, h.additive_f.view, h.sinks_f.view,
                                             slopes_of<float>(h, h.slopes_f.view, 0)),
                .out = od.view,
                .lse = ld.view,
                .d_out = dd.view,
                .return_d_additive_mask = return_d_mask};
            if (ctx)
                finish_grads(ctx->sdpa_backward(b));
            else
                finish_grads(qkv::cpu::sdpa_backward_f64(b));
        }
    }
    return py::make_tuple(wrap(std::move(*dq)), wrap(std::move(*dk)), wrap(std::move(*dv)),
                          ds ? wrap(std::move(*ds)) : py::none(), dm ? wrap(std::move(*dm)) : py::none());
}

}  // namespace

std::string dims(const std::vector<std::size_t>& shape) {
    std::string s = "(";
    for (std::size_t d = 0; d < shape.size(); ++d) s += (d ? ", " : "") + std::to_string(shape[d]);
    return s + (shape.size() == 1 ? ",)" : ")");
}

context_ptr context_of(py::handle device) {
    if (device.is_none()) return nullptr;
    return device.cast<context_ptr>();
}

void choose_precision(call_options& opt, dtype type, const context_ptr& ctx) {
    if (opt.precision_given || !ctx) return;
    opt.options.precision =
        type == dtype::f16 && ctx->device().fp16_storage ? qkv::precision::fp16 : qkv::precision::fp32;
}

call_options read_options(const py::dict& d) {
    // The keys are the fields of the option list (qkv/runtime/sdpa_options.def), each converted
    // from its Python value by the field's type; what a value may be is qkv::validate's to say.
    call_options c;
    for (const auto& item : d) {
        const std::string key = py::str(item.first);
        const qkv::option_field* field = qkv::find_field(key);
        if (!field) refuse("unknown option " + key);
        const py::handle value = item.second;
        if (value.is_none()) continue;
        if (key == "precision") c.precision_given = true;
        qkv::visit_options(c.options, [&](const qkv::option_field& f, auto& member) {
            if (f.name != field->name) return;
            using M = std::remove_cvref_t<decltype(member)>;
            member = from_python<M>(value, key);
        });
    }
    return c;
}

void bind_calls(py::module_& m) {
    m.def("_sdpa", &sdpa, py::arg("query"), py::arg("key"), py::arg("value"), py::kw_only(), py::arg("mask"),
          py::arg("mask_is_bool"), py::arg("sinks"), py::arg("alibi_slopes"), py::arg("options"), py::arg("context"),
          py::arg("out_perm"),
          "scaled_dot_product_attention over host arrays; the Python layer (qkv/_sdpa.py) calls it. Returns "
          "(output, lse or None, weights or None) as _Array buffers.");
    m.def("_sdpa_backward", &sdpa_backward, py::arg("query"), py::arg("key"), py::arg("value"), py::arg("grad_output"),
          py::arg("output"), py::arg("lse"), py::kw_only(), py::arg("mask"), py::arg("mask_is_bool"), py::arg("sinks"),
          py::arg("alibi_slopes"), py::arg("options"), py::arg("context"), py::arg("return_d_mask") = false,
          "The backward pass of _sdpa over host arrays (qkv/_autograd.py calls it). Returns (dq, dk, dv, d_sinks or "
          "None, the additive mask's gradient in its compact (b, h, l, s) shape with return_d_mask, else None) as "
          "_Array buffers.");
    m.def("_decode", &decode, py::arg("cache"), py::arg("query"), py::kw_only(), py::arg("mask"),
          py::arg("mask_is_bool"), py::arg("sinks"), py::arg("alibi_slopes"), py::arg("options"));
    m.def("_cache_append", &cache_append, py::arg("cache"), py::arg("key"), py::arg("value"));
    m.def(
        "_alibi_slopes",
        [](std::size_t heads, float max_bias) {
            if (heads == 0) refuse("alibi_slopes: heads must be at least 1");
            std::vector<double> out(heads);
            for (std::size_t h = 0; h < heads; ++h) out[h] = qkv::alibi_slope(max_bias, heads, h);
            return out;
        },
        py::arg("heads"), py::arg("max_bias"));
    m.def("_sdpa_tensors", &sdpa_tensors, py::arg("query"), py::arg("key"), py::arg("value"), py::kw_only(),
          py::arg("mask"), py::arg("mask_is_bool"), py::arg("sinks"), py::arg("alibi_slopes"), py::arg("options"));
}

}  // namespace qkv::python
