// The paged K/V calls of the Python package: flash_attn_with_kvcache with a block_table
// (qkv/flash_attn.py) on the library's paged path, and qkv.PagedKVCache's pool of pages kept on
// the device (a qkv::vulkan::kv_cache of batch 1 whose rows are the pages' rows, page after page,
// as context::sdpa(paged_problem, kv_cache&) takes it).
//
// One call, _paged, serves three pools: the caller's host arrays on a Vulkan context (the pages
// the batch reads or writes are uploaded into a device pool made for the call, the decode reads
// them through the block table, the new rows are returned for the Python layer to write into the
// caller's arrays), the same arrays on the float64 reference (qkv::cpu::sdpa of the paged
// problem), and a PagedKVCache (appended into in place on the device). FlashAttention's rotary
// embedding is applied here, before the call, by the library's own definition (qkv::rotate_rows at
// qkv::paged_rotary_position), and its results rounded to the inputs' dtype as FlashAttention's
// kernel stores them, so that the rows written into the caller's cache are the rows attended to.
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "calls.hpp"
#include "objects.hpp"
#include "qkv/runtime/cpu.hpp"
#include "qkv/runtime/element_type.hpp"
#include "qkv/runtime/error.hpp"
#include "qkv/runtime/half.hpp"
#include "qkv/runtime/paged.hpp"
#include "qkv/vulkan/error.hpp"
#include "qkv/vulkan/kv_cache.hpp"
#include "qkv/vulkan/paged_call.hpp"
#include "qkv/vulkan/tensor.hpp"

namespace qkv::python {
namespace {

[[noreturn]] void refuse(const std::string& message) { throw qkv::invalid_argument(message); }

/// qkv.PagedKVCache's pool: `num_pages` pages of `page_size` rows in one kv_cache of batch 1, of
/// which the first size() / page_size are held (appended).
struct py_paged_pool {
    context_ptr context;
    qkv::vulkan::kv_cache cache;
    std::size_t page_size = 0, num_pages = 0;

    [[nodiscard]] std::size_t pages_held() const { return cache.size() / page_size; }
};

void check_page_size(std::size_t page_size) {
    if (page_size == 0 || page_size > qkv::max_page_size || (page_size & (page_size - 1)) != 0)
        refuse("page_size is " + std::to_string(page_size) + ": it must be a power of two from 1 to " +
               std::to_string(qkv::max_page_size));
}

py_paged_pool make_pool(const context_ptr& ctx, std::size_t num_pages, std::size_t page_size, std::size_t kv_heads,
                        std::size_t d_qk, std::size_t d_v, const std::string& kv_type) {
    if (!ctx) refuse("a PagedKVCache lives on a Vulkan device, not on \"cpu\"");
    check_page_size(page_size);
    if (num_pages == 0) refuse("num_pages is 0: a pool has at least one page");
    if (num_pages > std::numeric_limits<std::size_t>::max() / page_size) refuse("num_pages x page_size overflows");
    const auto type = qkv::parse_name<qkv::element_type>(kv_type);
    if (!type) refuse("dtype must be \"float32\", \"float16\", \"q8_0\" or \"q4_0\" (it is \"" + kv_type + "\")");
    py::gil_scoped_release nogil;
    return py_paged_pool{ctx,
                         qkv::vulkan::kv_cache(*ctx, {.batch = 1,
                                                      .kv_heads = kv_heads,
                                                      .capacity = num_pages * page_size,
                                                      .d_qk = d_qk,
                                                      .d_v = d_v,
                                                      .type = *type}),
                         page_size, num_pages};
}

/// Pages (n, page_size, Hkv, width) as the rows of a kv_cache of batch 1: (Hkv, n·page_size, width).
template <class T>
std::vector<T> head_major(std::span<const T> pages, std::span<const std::int32_t> order, std::size_t page_size,
                          std::size_t heads, std::size_t width) {
    const std::size_t rows = order.size() * page_size;
    std::vector<T> out(heads * rows * width);
    for (std::size_t c = 0; c < order.size(); ++c)
        for (std::size_t r = 0; r < page_size; ++r)
            for (std::size_t h = 0; h < heads; ++h) {
                const T* from =
                    pages.data() + ((static_cast<std::size_t>(order[c]) * page_size + r) * heads + h) * width;
                std::copy_n(from, width, out.data() + (h * rows + c * page_size + r) * width);
            }
    return out;
}

host_array pages_array(py::handle x, const char* name, std::size_t width, const qkv::kv_layout& s,
                       std::size_t page_size) {
    host_array a = read_array(x, name);
    if (a.rank() != 4 || a.shape[1] != page_size || a.shape[2] != s.kv_heads || a.shape[3] != width)
        refuse(std::string(name) + " has shape " + dims(a.shape) + ": pages are (n, page_size, kv_heads, " +
               (name[0] == 'k' ? "head_dim" : "head_dim_v") + ") = (n, " + std::to_string(page_size) + ", " +
               std::to_string(s.kv_heads) + ", " + std::to_string(width) + ")");
    if (!is_float(a.type) || a.type == dtype::f64)
        refuse(std::string(name) + " is " + to_string(a.type) + ": pages are float32, float16 or bfloat16");
    return a;
}

/// Appends whole pages (n, page_size, Hkv, E) and (n, page_size, Hkv, Ev) after those held.
void append_pages(py_paged_pool& pool, py::handle k, py::handle v) {
    const qkv::kv_layout& s = pool.cache.layout();
    const host_array ka = pages_array(k, "k", s.d_qk, s, pool.page_size);
    const host_array va = pages_array(v, "v", s.d_v, s, pool.page_size);
    if (ka.shape[0] != va.shape[0])
        refuse("k has " + std::to_string(ka.shape[0]) + " pages and v " + std::to_string(va.shape[0]) +
               ": they must match");
    const std::size_t n = ka.shape[0];
    py::gil_scoped_release nogil;
    values<float> kf, vf;
    read_values(ka, kf, "k"), read_values(va, vf, "v");
    std::vector<std::int32_t> order(n);
    for (std::size_t i = 0; i < n; ++i) order[i] = static_cast<std::int32_t>(i);
    const std::vector<float> kt =
        head_major(kf.view, std::span<const std::int32_t>(order), pool.page_size, s.kv_heads, s.d_qk);
    const std::vector<float> vt =
        head_major(vf.view, std::span<const std::int32_t>(order), pool.page_size, s.kv_heads, s.d_v);
    pool.cache.append(kt, vt, n * pool.page_size);
}

/// Pages [first, first + count) as float32 arrays (count, page_size, Hkv, E) and (..., Ev), read
/// back from the device (f32 and f16 pools).
py::tuple read_pages(const py_paged_pool& pool, std::size_t first, std::size_t count) {
    const std::size_t held = pool.pages_held();
    if (first > held || count > held - first)
        refuse("pages " + std::to_string(first) + " to " + std::to_string(first + count) + ": the pool holds " +
               std::to_string(held) + " pages");
    const qkv::kv_layout& s = pool.cache.layout();
    std::optional<out_array> k, v;
    {
        py::gil_scoped_release nogil;
        const auto one = [&](const qkv::vulkan::tensor& t, std::size_t width) {
            const std::vector<float> all = t.download();  // (1, Hkv, capacity, 4·ceil(width / 4))
            const std::size_t w4 = (width + 3) / 4 * 4, cap = pool.cache.capacity(), p = pool.page_size;
            std::vector<float> out(count * p * s.kv_heads * width);
            for (std::size_t c = 0; c < count; ++c)
                for (std::size_t r = 0; r < p; ++r)
                    for (std::size_t h = 0; h < s.kv_heads; ++h)
                        std::copy_n(all.data() + (h * cap + (first + c) * p + r) * w4, width,
                                    out.data() + ((c * p + r) * s.kv_heads + h) * width);
            return make_output(std::move(out), dtype::f32, {count, p, s.kv_heads, width}, {}, "pages");
        };
        k = one(pool.cache.keys(), s.d_qk);
        v = one(pool.cache.values(), s.d_v);
    }
    return py::make_tuple(py::cast(std::move(*k)), py::cast(std::move(*v)));
}

/// A float array that is not bool, of `type`.
host_array same_type(py::handle x, const char* name, dtype type) {
    host_array a = read_array(x, name);
    if (a.type != type)
        refuse(std::string(name) + " is " + to_string(a.type) + " and q " + to_string(type) + ": one dtype");
    return a;
}

/// x rounded to `type` as its storage would hold it (float16, bfloat16; float32 and float64 as they are).
template <class T>
void round_to(std::vector<T>& x, dtype type) {
    if constexpr (std::is_same_v<T, float>) {
        if (type == dtype::f16) {
            std::vector<std::uint16_t> halves(x.size());
            qkv::to_half_bits(x, halves);
            qkv::from_half_bits(halves, x);
        } else if (type == dtype::bf16)
            for (float& f : x) f = from_bf16_bits(to_bf16_bits(f));
    }
}

/// One paged call as read from Python.
struct paged_inputs {
    call_options opt;
    dtype type = dtype::f32;
    host_array q;
    std::optional<host_array> k_pages, v_pages, k_new, v_new, cos, sin, slopes;
    std::vector<std::int32_t> cu_q;  ///< empty, or the ragged q's B + 1 offsets (flash_attn_varlen_func)
    std::size_t batch = 0, q_len = 0, hq = 0, hkv = 0, e = 0, ev = 0, page_size = 0, num_pages = 0, new_rows = 0;
};

template <class T>
struct paged_values {
    values<T> k_pages, v_pages, cos, sin, slopes;
    std::vector<T> q, k_new, v_new;
};

/// Everything the call reads, as T; the caller's pools too unless `pools` is false (the device
/// path reads only the pages the batch uses: used_pages).
template <class T>
paged_values<T> read_all(const paged_inputs& in, bool pools = true) {
    paged_values<T> x;
    values<T> q;
    read_values(in.q, q, "q");
    x.q.assign(q.view.begin(), q.view.end());
    if (in.k_pages && pools)
        read_values(*in.k_pages, x.k_pages, "k_cache"), read_values(*in.v_pages, x.v_pages, "v_cache");
    if (in.k_new) {
        values<T> k, v;
        read_values(*in.k_new, k, "k"), read_values(*in.v_new, v, "v");
        x.k_new.assign(k.view.begin(), k.view.end()), x.v_new.assign(v.view.begin(), v.view.end());
    }
    // The tables and slopes in any float dtype (a list of slopes reads as float64), as T: refused
    // where float32 cannot hold a finite value.
    const auto narrow = [](const host_array& a, values<T>& out, const char* name) {
        values<double> wide;
        read_values(a, wide, name);
        out.owned.resize(wide.view.size());
        for (std::size_t i = 0; i < wide.view.size(); ++i) {
            const double d = wide.view[i];
            if (std::isfinite(d) && std::abs(d) > static_cast<double>(std::numeric_limits<T>::max()))
                refuse(std::string(name) + "[" + std::to_string(i) + "] is beyond float32's range");
            out.owned[i] = static_cast<T>(d);
        }
        out.view = std::span<const T>(out.owned.data(), out.owned.size());
    };
    if (in.cos) narrow(*in.cos, x.cos, "rotary_cos"), narrow(*in.sin, x.sin, "rotary_sin");
    if (in.slopes) narrow(*in.slopes, x.slopes, "alibi_slopes");
    return x;
}

/// The problem of the call over values x (the pool's spans set by the caller), validated, with
/// the rotary embedding applied to q and the new keys (rounded to the inputs' dtype) and taken out;
/// `rotate` false: left in the problem, for the device to apply (lengths on the device, whose
/// positions the host does not know).
template <class T>
qkv::basic_paged_problem<T> problem_of(const paged_inputs& in, paged_values<T>& x, std::span<const std::int32_t> table,
                                       std::size_t max_pages, std::span<const std::int32_t> seqlens,
                                       std::span<const std::int32_t> batch_idx, std::span<const std::int32_t> leftpad,
                                       bool interleaved, bool with_pool, bool rotate = true) {
    qkv::basic_paged_problem<T> p;
    p.q_heads = in.hq, p.kv_heads = in.hkv, p.d_qk = in.e, p.d_v = in.ev;
    p.page_size = in.page_size, p.num_pages = in.num_pages;
    if (with_pool) p.k_pages = x.k_pages.view, p.v_pages = x.v_pages.view;
    p.max_pages = max_pages, p.block_table = table, p.cache_seqlens = seqlens;
    p.q_len = in.q_len, p.q = x.q, p.cu_seqlens_q = in.cu_q;
    p.options = in.opt.options;
    p.alibi_slopes = x.slopes.view.subspan(0, in.slopes ? in.hq : 0);
    p.new_rows = in.new_rows, p.k_new = x.k_new, p.v_new = x.v_new;
    p.rotary_dim = in.cos ? 2 * in.cos->shape[1] : 0;
    p.rotary_cos = x.cos.view, p.rotary_sin = x.sin.view, p.rotary_interleaved = interleaved;
    p.cache_batch_idx = batch_idx, p.cache_leftpad = leftpad;
    if constexpr (std::is_same_v<T, float>) {
        if (!with_pool) {
            qkv::validate_without_pool(p);
        } else {
            qkv::validate(p);
        }
    } else {
        qkv::validate(p);  // the float64 reference's pool is always the caller's
    }
    if (p.rotary_dim == 0 || !rotate) return p;
    std::vector<std::size_t> at(in.batch * std::max(in.new_rows, in.q_len));
    for (std::size_t b = 0; b < in.batch; ++b)
        for (std::size_t i = 0; i < in.new_rows; ++i)
            at[b * in.new_rows + i] = qkv::paged_rotary_position(p, b, i, false);
    qkv::rotate_rows(p, std::span<T>(x.k_new), in.batch * in.new_rows, in.hkv, in.e, at);
    for (std::size_t b = 0; b < in.batch; ++b)
        for (std::size_t i = 0; i < in.q_len; ++i) at[b * in.q_len + i] = qkv::paged_rotary_position(p, b, i, true);
    qkv::rotate_rows(p, std::span<T>(x.q), in.batch * in.q_len, in.hq, in.e, at);
    round_to(x.k_new, in.type), round_to(x.q, in.type);
    p.rotary_dim = 0, p.rotary_cos = {}, p.rotary_sin = {};
    return p;
}

/// The call `p` (validated against placeholders of the device tensors' sizes) against a
/// PagedKVCache's pool with the block table (`table`) or the lengths (`lengths`) on the device, or
/// both: one paged_call over tensors (q and the new rows uploaded, the output and lse downloaded).
/// A tensor is never read back: the device checks the table's entries and the lengths, and a bad
/// one is the run's qkv::invalid_argument. A host table (`host_table`, with device lengths) is
/// checked there too, for the keys the lengths reach. Shared prefixes are found from a host table
/// and host lengths, so the call attends each sequence over all its keys (cascade off; the same
/// result up to rounding). With device lengths the rotary embedding (left in `p`) is applied on
/// the device, at the positions the lengths give, in float32 (q not rounded to the inputs' dtype).
qkv::varlen_output run_device_tensors(qkv::vulkan::context& ctx, const qkv::paged_problem& p,
                                      qkv::vulkan::kv_cache& pool, const qkv::vulkan::tensor* table,
                                      std::span<const std::int32_t> host_table, const qkv::vulkan::tensor* lengths) {
    qkv::paged_problem desc = p;
    desc.q = {}, desc.k_new = {}, desc.v_new = {};
    desc.block_table = {}, desc.cache_seqlens = {}, desc.cu_seqlens_q = {};
    desc.cache_batch_idx = {}, desc.cache_leftpad = {};
    desc.num_pages = 0;  // the pages the pool holds when it runs
    desc.cascade = false;
    qkv::vulkan::paged_call call(ctx, desc, pool);
    const std::size_t B = p.cache_seqlens.size(), Hq = p.q_heads;
    const bool ragged = !p.cu_seqlens_q.empty();
    const std::size_t total_q = ragged ? static_cast<std::size_t>(p.cu_seqlens_q.back()) : B * p.q_len;
    const auto rows = [&](std::size_t width) {
        return ragged ? std::vector<std::size_t>{total_q, Hq, width} : std::vector<std::size_t>{B, p.q_len, Hq, width};
    };
    qkv::vulkan::tensor q(ctx, rows(p.d_qk)), out(ctx, rows(p.d_v)), lse, k_new, v_new;
    q.upload(p.q);
    qkv::vulkan::paged_tensors t{.q = &q, .out = &out};
    if (table)
        t.block_table_tensor = table;
    else
        t.block_table = host_table;
    if (lengths)
        t.cache_seqlens_tensor = lengths;
    else
        t.cache_seqlens = p.cache_seqlens;
    t.cu_seqlens_q = p.cu_seqlens_q, t.cache_batch_idx = p.cache_batch_idx, t.cache_leftpad = p.cache_leftpad;
    if (p.options.return_lse) lse = qkv::vulkan::tensor(ctx, {Hq, total_q}), t.lse = &lse;
    if (p.new_rows != 0) {
        const qkv::element_type type = pool.layout().type;
        k_new = qkv::vulkan::tensor(ctx, {B, p.new_rows, p.kv_heads, p.d_qk}, type);
        v_new = qkv::vulkan::tensor(ctx, {B, p.new_rows, p.kv_heads, p.d_v}, type);
        k_new.upload(p.k_new), v_new.upload(p.v_new);
        t.k_new = &k_new, t.v_new = &v_new;
    }
    call.run(t);
    qkv::varlen_output o;
    o.output = out.download();
    if (p.options.return_lse) o.lse = lse.download();
    return o;
}

/// (output (B, L, Hq, Ev) of the inputs' dtype, lse (Hq, B·L) float32 or None, the new keys as
/// written (B, new, Hkv, E) of the inputs' dtype or None, the new values likewise). With
/// cu_seqlens_q (B + 1 offsets; flash_attn_varlen_func's paged form) q is ragged, (total_q, Hq, E),
/// the output (total_q, Hq, Ev) and lse (Hq, total_q); it takes no new rows. With
/// `block_table_tensor` (an int32 qkv.Tensor (rows, max_pages), against a PagedKVCache only) the
/// table is on the device: `table` is then empty and `max_pages` ignored; with
/// `cache_seqlens_tensor` (an int32 qkv.Tensor (B), against a PagedKVCache only) the lengths are:
/// `seqlens` is then empty (run_device_tensors).
py::tuple paged(py::handle q, py::handle k_cache, py::handle v_cache, py::object pool_object,
                const std::vector<std::int32_t>& table, std::size_t max_pages, const std::vector<std::int32_t>& seqlens,
                py::handle k_new, py::handle v_new, py::handle rotary_cos, py::handle rotary_sin, bool interleaved,
                const std::vector<std::int32_t>& batch_idx, const std::vector<std::int32_t>& leftpad,
                const std::vector<std::int32_t>& cu_seqlens_q, py::handle alibi_slopes, const py::dict& options,
                py::handle device, py::handle block_table_tensor, py::handle cache_seqlens_tensor) {
    paged_inputs in;
    in.opt = read_options(options);
    in.q = read_array(q, "q");
    in.cu_q = cu_seqlens_q;
    const bool ragged = !in.cu_q.empty();
    if (!ragged && in.q.rank() != 4)
        refuse("q has shape " + dims(in.q.shape) + ": it must be (batch, seqlen_q, nheads, headdim)");
    if (ragged && in.q.rank() != 3)
        refuse("q has shape " + dims(in.q.shape) + ": it must be (total_q, nheads, headdim)");
    if (ragged && (!k_new.is_none() || !rotary_cos.is_none()))
        refuse("a ragged q (cu_seqlens_q) takes no new k and v and no rotary embedding");
    in.type = in.q.type;
    if (!is_float(in.type)) refuse(std::string("q is ") + to_string(in.type) + ": it must be floating point");
    if (ragged) {
        in.batch = seqlens.size(), in.q_len = 0, in.hq = in.q.shape[1], in.e = in.q.shape[2];
    } else {
        in.batch = in.q.shape[0], in.q_len = in.q.shape[1], in.hq = in.q.shape[2], in.e = in.q.shape[3];
    }
    py_paged_pool* pool = pool_object.is_none() ? nullptr : &pool_object.cast<py_paged_pool&>();
    const context_ptr ctx = pool ? pool->context : context_of(device);
    if (pool) {
        const qkv::kv_layout& s = pool->cache.layout();
        in.hkv = s.kv_heads, in.ev = s.d_v, in.page_size = pool->page_size, in.num_pages = pool->pages_held();
        if (s.d_qk != in.e)
            refuse("q has headdim " + std::to_string(in.e) + " and the PagedKVCache " + std::to_string(s.d_qk) +
                   ": they must match");
        if (in.num_pages == 0) refuse("the PagedKVCache holds no pages (append_pages first)");
    } else {
        in.k_pages = same_type(k_cache, "k_cache", in.type), in.v_pages = same_type(v_cache, "v_cache", in.type);
        const auto& ks = in.k_pages->shape;
        const auto& vs = in.v_pages->shape;
        if (ks.size() != 4 || vs.size() != 4 || ks[0] != vs[0] || ks[1] != vs[1] || ks[2] != vs[2] || ks[3] != in.e)
            refuse("k_cache " + dims(ks) + " and v_cache " + dims(vs) +
                   ": they must be pages (num_blocks, page_block_size, nheads_k, headdim) alike, headdim " +
                   std::to_string(in.e));
        in.num_pages = ks[0], in.page_size = ks[1], in.hkv = ks[2], in.ev = vs[3];
    }
    if (!k_new.is_none()) {
        in.k_new = same_type(k_new, "k", in.type), in.v_new = same_type(v_new, "v", in.type);
        in.new_rows = in.k_new->rank() == 4 ? in.k_new->shape[1] : 0;
        const std::vector<std::size_t> want_k{in.batch, in.new_rows, in.hkv, in.e},
            want_v{in.batch, in.new_rows, in.hkv, in.ev};
        if (in.k_new->shape != want_k || in.v_new->shape != want_v)
            refuse("k " + dims(in.k_new->shape) + " and v " + dims(in.v_new->shape) + ": they must be " + dims(want_k) +
                   " and " + dims(want_v) + " (batch, seqlen_new, nheads_k, headdim)");
    }
    if (!rotary_cos.is_none()) {
        in.cos = read_array(rotary_cos, "rotary_cos"), in.sin = read_array(rotary_sin, "rotary_sin");
        if (in.cos->rank() != 2 || in.sin->shape != in.cos->shape || !is_float(in.cos->type) || !is_float(in.sin->type))
            refuse("rotary_cos " + dims(in.cos->shape) + " and rotary_sin " + dims(in.sin->shape) +
                   ": they must be floating point (seqlen_ro, rotary_dim / 2) alike");
    }
    if (!alibi_slopes.is_none()) {
        in.slopes = read_array(alibi_slopes, "alibi_slopes");
        if (in.slopes->rank() != 1 || in.slopes->shape[0] != in.hq || !is_float(in.slopes->type))
            refuse("alibi_slopes has shape " + dims(in.slopes->shape) + ": the paged call takes (nheads,) = (" +
                   std::to_string(in.hq) + ",)");
    }
    if (ctx && in.type == dtype::f64)
        refuse(
            "q and the caches are float64: a Vulkan device computes float32 (convert them), the float64 "
            "reference computes float64 (device=\"cpu\")");
    // A block table on the device: its size here, its entries read (and checked) on the device.
    const py_tensor* device_table = nullptr;
    std::vector<std::int32_t> placeholder;
    if (!block_table_tensor.is_none()) {
        if (!py::isinstance<py_tensor>(block_table_tensor))
            throw py::type_error("block_table_tensor: a qkv.Tensor is needed");
        device_table = &block_table_tensor.cast<const py_tensor&>();
        if (!pool)
            refuse(
                "block_table is a qkv.Tensor: a table on the device is read there, with the pages it names; pass "
                "the pool as a qkv.PagedKVCache (or the table as an int32 array)");
        if (!table.empty()) refuse("block_table: a host table and a qkv.Tensor; give the table one way");
        if (device_table->context != pool->context)
            refuse("block_table: the qkv.Tensor was made on another Context than the PagedKVCache's");
        const auto& shape = device_table->tensor.shape();
        if (shape.size() != 2)
            refuse("block_table is a qkv.Tensor of shape " + dims(shape) + ": it must be int32 (batch, " +
                   "max_num_blocks_per_seq), or (rows, max_num_blocks_per_seq) with cache_batch_idx");
        max_pages = shape[1];
        placeholder.assign(shape[0] * shape[1], 0);  // shapes checked here; the entries on the device
    }
    // Lengths on the device: their size here, their values read (and checked) on the device. The
    // host checks the call at each sequence's bound (its table row's keys less the new rows), the
    // table's entries left to the device (placeholders), as paged_call plans it.
    const py_tensor* device_lengths = nullptr;
    std::vector<std::int32_t> bounds;
    if (!cache_seqlens_tensor.is_none()) {
        if (!py::isinstance<py_tensor>(cache_seqlens_tensor))
            throw py::type_error("cache_seqlens_tensor: a qkv.Tensor is needed");
        device_lengths = &cache_seqlens_tensor.cast<const py_tensor&>();
        if (!pool || ragged)
            refuse(
                "cache_seqlens is a qkv.Tensor: lengths on the device are read there, by the paged call against a "
                "qkv.PagedKVCache (pass the lengths as an int32 array otherwise)");
        if (!seqlens.empty()) refuse("cache_seqlens: host lengths and a qkv.Tensor; give the lengths one way");
        if (device_lengths->context != pool->context)
            refuse("cache_seqlens: the qkv.Tensor was made on another Context than the PagedKVCache's");
        const auto& shape = device_lengths->tensor.shape();
        if (device_lengths->tensor.type() != qkv::element_type::i32 || shape.size() != 1 || shape[0] != in.batch)
            refuse("cache_seqlens is a qkv.Tensor of shape " + dims(shape) + ": it must be int32 (batch,) = (" +
                   std::to_string(in.batch) + ",)");
        if (in.new_rows != 0 && pool->cache.layout().type != qkv::element_type::f32 &&
            pool->cache.layout().type != qkv::element_type::f16)
            refuse("cache_seqlens is a qkv.Tensor with k and v into a " +
                   std::string(qkv::to_string(pool->cache.layout().type)) +
                   " PagedKVCache: its rows are quantized on the host at the positions the lengths give; pass the "
                   "lengths as an int32 array");
        if (in.new_rows != 0) {
            std::vector<std::int32_t> rows(batch_idx);
            std::sort(rows.begin(), rows.end());
            if (std::adjacent_find(rows.begin(), rows.end()) != rows.end())
                refuse(
                    "cache_seqlens is a qkv.Tensor with k and v and a cache_batch_idx naming one block_table row "
                    "twice: where their rows go depends on lengths read on the device; pass the lengths as an int32 "
                    "array");
        }
        const std::size_t capacity = max_pages * in.page_size;
        if (in.new_rows > capacity)
            refuse("k and v have " + std::to_string(in.new_rows) + " new rows per sequence, and a block_table row " +
                   "holds " + std::to_string(capacity) + " keys (max_num_blocks_per_seq x page_size)");
        bounds.assign(in.batch, static_cast<std::int32_t>(std::min<std::size_t>(
                                    capacity - in.new_rows, std::numeric_limits<std::int32_t>::max())));
        if (!device_table) placeholder.assign(table.size(), 0);  // a host table: checked on the device
    }
    const std::span<const std::int32_t> host_table = device_table || device_lengths
                                                         ? std::span<const std::int32_t>(placeholder)
                                                         : std::span<const std::int32_t>(table);
    const std::span<const std::int32_t> host_lengths =
        device_lengths ? std::span<const std::int32_t>(bounds) : std::span<const std::int32_t>(seqlens);

    std::optional<out_array> out, lse, k_rows, v_rows;
    {
        py::gil_scoped_release nogil;
        const std::size_t total_q = ragged ? in.q.shape[0] : in.batch * in.q_len;
        const std::vector<std::size_t> none,
            out_shape = ragged ? std::vector<std::size_t>{total_q, in.hq, in.ev}
                               : std::vector<std::size_t>{in.batch, in.q_len, in.hq, in.ev},
            lse_shape{in.hq, total_q}, new_k{in.batch, in.new_rows, in.hkv, in.e},
            new_v{in.batch, in.new_rows, in.hkv, in.ev};
        const auto finish = [&](auto&& o, auto& x) {
            out = make_output(std::move(o.output), in.type, out_shape, none, "output");
            if (in.opt.options.return_lse) lse = make_output(std::move(o.lse), dtype::f32, lse_shape, none, "lse");
            if (in.new_rows == 0 || pool) return;
            using X = std::remove_cvref_t<decltype(x.k_new)>;
            if constexpr (std::is_same_v<X, std::vector<double>>) {
                k_rows = make_output(x.k_new, in.type, new_k, none, "k");
                v_rows = make_output(x.v_new, in.type, new_v, none, "v");
            } else {
                k_rows = make_output(std::move(x.k_new), in.type, new_k, none, "k");
                v_rows = make_output(std::move(x.v_new), in.type, new_v, none, "v");
            }
        };
        if (!ctx && in.type == dtype::f64) {
            paged_values<double> x = read_all<double>(in);
            const auto p = problem_of(in, x, table, max_pages, seqlens, batch_idx, leftpad, interleaved, true);
            finish(qkv::cpu::sdpa(p), x);
        } else if (!ctx) {
            paged_values<float> x = read_all<float>(in);
            const auto p = problem_of(in, x, table, max_pages, seqlens, batch_idx, leftpad, interleaved, true);
            finish(qkv::cpu::sdpa_f64(p), x);
        } else if (pool) {
            paged_values<float> x = read_all<float>(in);
            const auto p = problem_of(in, x, host_table, max_pages, host_lengths, batch_idx, leftpad, interleaved,
                                      false, !device_lengths);
            if (device_table || device_lengths)
                finish(run_device_tensors(*ctx, p, pool->cache, device_table ? &device_table->tensor : nullptr, table,
                                          device_lengths ? &device_lengths->tensor : nullptr),
                       x);
            else
                finish(p.new_rows ? ctx->sdpa(p, pool->cache) : ctx->sdpa(p, std::as_const(pool->cache)), x);
        } else {
            paged_values<float> x = read_all<float>(in, false);
            qkv::paged_problem p = problem_of(in, x, table, max_pages, seqlens, batch_idx, leftpad, interleaved, false);
            // Two new rows bound for one row of the caller's pool are refused here, in its page
            // numbers (the library's check, before the pages are renumbered below).
            if (p.new_rows) {
                const qkv::basic_resolved_pages<float> checked = qkv::resolve_pages(p, false);
                static_cast<void>(checked);
            }
            // The device pool of the call: the pages the batch reads or writes, each once (a shared
            // page stays shared), in the order of first use; the table renumbered to them.
            std::vector<std::int32_t> compact(in.num_pages, -1), order, renumbered(table.size(), 0);
            for (std::size_t b = 0; b < in.batch; ++b) {
                const std::size_t row = qkv::paged_table_row(p, b);
                const std::size_t pages = (qkv::paged_end_key(p, b) + in.page_size - 1) / in.page_size;
                for (std::size_t j = qkv::paged_first_key(p, b) / in.page_size; j < pages; ++j) {
                    const std::int32_t page = table[row * max_pages + j];  // validated: in the pool
                    if (page < 0 || static_cast<std::size_t>(page) >= in.num_pages) continue;
                    auto& c = compact[static_cast<std::size_t>(page)];
                    if (c < 0) c = static_cast<std::int32_t>(order.size()), order.push_back(page);
                    renumbered[row * max_pages + j] = c;
                }
            }
            if (order.empty()) order.push_back(0);  // a batch that reads no key still needs a pool
            const qkv::element_type kind =
                in.type == dtype::f16 && ctx->device().fp16_storage ? qkv::element_type::f16 : qkv::element_type::f32;
            qkv::vulkan::kv_cache device_pool(*ctx, {.batch = 1,
                                                     .kv_heads = in.hkv,
                                                     .capacity = order.size() * in.page_size,
                                                     .d_qk = in.e,
                                                     .d_v = in.ev,
                                                     .type = kind});
            // Only the pages used are read from the caller's pools, in order: float16 pages into a
            // float16 pool as their bits (nothing to round, nothing that can overflow), any other
            // widened to float32.
            std::vector<std::int32_t> compact_order(order.size());
            for (std::size_t c = 0; c < order.size(); ++c) compact_order[c] = static_cast<std::int32_t>(c);
            const auto used_pages = [&]<class T>(const host_array& pool_array, std::size_t width, const char* name, T) {
                std::vector<T> pages(order.size() * in.page_size * in.hkv * width);
                gather_slices(pool_array, order, std::span<T>(pages), name);
                return head_major(std::span<const T>(pages), std::span<const std::int32_t>(compact_order), in.page_size,
                                  in.hkv, width);
            };
            const std::size_t used_rows = order.size() * in.page_size;
            if (kind == qkv::element_type::f16 && in.type == dtype::f16)
                device_pool.append_f16(used_pages(*in.k_pages, in.e, "k_cache", std::uint16_t{}),
                                       used_pages(*in.v_pages, in.ev, "v_cache", std::uint16_t{}), used_rows);
            else
                device_pool.append(used_pages(*in.k_pages, in.e, "k_cache", 0.0f),
                                   used_pages(*in.v_pages, in.ev, "v_cache", 0.0f), used_rows);
            qkv::paged_problem on_device = p;
            on_device.num_pages = order.size();
            on_device.block_table = renumbered;
            std::optional<qkv::varlen_output> o;
            try {
                o = p.new_rows ? ctx->sdpa(on_device, device_pool) : ctx->sdpa(on_device, std::as_const(device_pool));
            } catch (const qkv::vulkan::limit_exceeded&) {
                // Shapes the batched paged decode does not take (head widths past its kernels'):
                // the library's host-pool call, which runs each sequence's own route.
                read_values(*in.k_pages, x.k_pages, "k_cache"), read_values(*in.v_pages, x.v_pages, "v_cache");
                qkv::paged_problem on_host = p;
                on_host.k_pages = x.k_pages.view, on_host.v_pages = x.v_pages.view;
                o = ctx->sdpa(on_host);
            }
            finish(std::move(*o), x);
        }
    }
    const auto opt = [](std::optional<out_array>& a) { return a ? py::cast(std::move(*a)) : py::none(); };
    return py::make_tuple(opt(out), opt(lse), opt(k_rows), opt(v_rows));
}

}  // namespace

void bind_paged(py::module_& m) {
    py::class_<py_paged_pool>(m, "_PagedPool")
        .def(py::init(&make_pool), py::arg("context"), py::arg("num_pages"), py::arg("page_size"), py::arg("kv_heads"),
             py::arg("d_qk"), py::arg("d_v"), py::arg("kv_type"))
        .def_readonly("num_pages", &py_paged_pool::num_pages)
        .def_readonly("page_size", &py_paged_pool::page_size)
        .def_property_readonly("pages_held", &py_paged_pool::pages_held)
        .def_property_readonly("kv_heads", [](const py_paged_pool& p) { return p.cache.layout().kv_heads; })
        .def_property_readonly("d_qk", [](const py_paged_pool& p) { return p.cache.layout().d_qk; })
        .def_property_readonly("d_v", [](const py_paged_pool& p) { return p.cache.layout().d_v; })
        .def_property_readonly(
            "kv_type", [](const py_paged_pool& p) { return std::string(qkv::to_string(p.cache.layout().type)); })
        .def_readonly("context", &py_paged_pool::context)
        .def("append_pages", &append_pages, py::arg("k"), py::arg("v"))
        .def("read_pages", &read_pages, py::arg("first"), py::arg("count"))
        .def("clear", [](py_paged_pool& p) {
            py::gil_scoped_release nogil;
            p.cache.clear();
        });
    m.def("_paged", &paged, py::arg("q"), py::arg("k_cache"), py::arg("v_cache"), py::arg("pool"),
          py::arg("block_table"), py::arg("max_pages"), py::arg("cache_seqlens"), py::arg("k"), py::arg("v"),
          py::arg("rotary_cos"), py::arg("rotary_sin"), py::arg("rotary_interleaved"), py::arg("cache_batch_idx"),
          py::arg("cache_leftpad"), py::kw_only(), py::arg("cu_seqlens_q") = std::vector<std::int32_t>{},
          py::arg("alibi_slopes"), py::arg("options"), py::arg("context"), py::arg("block_table_tensor") = py::none(),
          py::arg("cache_seqlens_tensor") = py::none(),
          "flash_attn_with_kvcache and flash_attn_varlen_func (cu_seqlens_q) with a block_table "
          "(qkv/flash_attn.py calls it; block_table_tensor, cache_seqlens_tensor: the table, the lengths as int32 "
          "qkv.Tensors, with a pool). "
          "Returns (output, lse or None, "
          "the new keys as written or None, the new values or None) as _Array buffers.");
}

}  // namespace qkv::python
