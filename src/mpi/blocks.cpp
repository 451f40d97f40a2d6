// The arithmetic of context parallelism (blocks.hpp).
#include "mpi/blocks.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "qkv/mpi/error.hpp"
#include "qkv/runtime/error.hpp"

namespace qkv::mpi::detail {
namespace {

constexpr std::int64_t i64(std::size_t v) { return static_cast<std::int64_t>(v); }

/// Rows before range `index` of `slice`.
std::size_t rows_before(const sequence_slice& slice, std::size_t index) {
    std::size_t n = 0;
    for (std::size_t r = 0; r < index; ++r) n += slice.ranges[r].size();
    return n;
}

/// The block (B, Hq, L', S') of a mask broadcast from dims (B, Hq, L, S): rows q and columns k,
/// keeping every broadcast dimension broadcast.
template <class T>
std::vector<T> mask_block(std::span<const T> mask, const std::array<std::size_t, 4>& d, std::size_t first_key,
                          row_range q, row_range k, std::vector<std::size_t>& block_dims) {
    const std::size_t rows = d[2] == 1 ? 1 : q.size(), cols = d[3] == 1 ? 1 : k.size();
    const std::size_t q0 = d[2] == 1 ? 0 : q.first, k0 = d[3] == 1 ? 0 : k.first - first_key;
    block_dims = {d[0], d[1], rows, cols};
    std::vector<T> out(d[0] * d[1] * rows * cols);
    T* to = out.data();
    for (std::size_t bh = 0; bh < d[0] * d[1]; ++bh)
        for (std::size_t i = 0; i < rows; ++i) {
            const T* from = mask.data() + (bh * d[2] + q0 + i) * d[3] + k0;
            to = std::copy(from, from + cols, to);
        }
    return out;
}

}  // namespace

void complete(whole& w, const std::vector<std::size_t>& mask_shape) {
    w.off = causal_offset(w.shape, w.options);
    if (!w.has_mask()) return;
    if (mask_shape.empty()) {
        w.mask_dims = {1, 1, w.shape.q_len, w.shape.kv_len};
        return;
    }
    w.mask_dims = {1, 1, 1, 1};
    std::copy(mask_shape.begin(), mask_shape.end(), w.mask_dims.end() - static_cast<std::ptrdiff_t>(mask_shape.size()));
}

bool visible(const whole& w, row_range q, row_range k) {
    if (q.size() == 0 || k.size() == 0) return false;
    // The block as a problem of its own: q.size() rows against k.size() keys, placed by its offset.
    sdpa_shape block = w.shape;
    block.q_len = q.size();
    block.kv_len = k.size();
    sdpa_options placed = w.options;
    placed.position_offset = i64(q.first) + w.off - i64(k.first);
    const key_range seen = visible_keys(block, placed, 0, q.size());
    return seen.end > seen.first;
}

bool visible(const whole& w, const sequence_slice& queries, const sequence_slice& keys) {
    for (const row_range& q : queries.ranges)
        for (const row_range& k : keys.ranges)
            if (visible(w, q, k)) return true;
    return false;
}

std::size_t kv_bytes(const whole& w, const sequence_slice& keys) {
    std::size_t n = 0;
    const std::size_t bh = w.shape.batch * w.shape.kv_heads;
    for (const row_range& r : keys.ranges)
        n += bytes_for(w.wire, bh * r.size() * w.shape.d_qk) + bytes_for(w.wire, bh * r.size() * w.shape.d_v);
    return n;
}

shared_bytes encode_kv(const whole& w, std::span<const float> k, std::span<const float> v, const sequence_slice& keys) {
    auto out = std::make_shared<bytes>(kv_bytes(w, keys));
    const std::size_t bh = w.shape.batch * w.shape.kv_heads;
    std::size_t at = 0;
    for (std::size_t r = 0; r < keys.ranges.size(); ++r)
        for (const auto& [data, width] : {std::pair{k, w.shape.d_qk}, std::pair{v, w.shape.d_v}}) {
            const std::vector<float> rows = range_rows(data, bh, width, keys, r);
            const std::size_t n = bytes_for(w.wire, rows.size());
            quantize(w.wire, rows, std::span<std::byte>(out->data() + at, n));
            at += n;
        }
    return out;
}

std::vector<kv_values> decode_kv(const whole& w, const bytes& stored, const sequence_slice& keys) {
    std::vector<kv_values> out;
    const std::size_t bh = w.shape.batch * w.shape.kv_heads;
    std::size_t at = 0;
    for (const row_range& r : keys.ranges) {
        kv_values kv{.rows = r,
                     .k = std::vector<float>(bh * r.size() * w.shape.d_qk),
                     .v = std::vector<float>(bh * r.size() * w.shape.d_v)};
        for (std::vector<float>* values : {&kv.k, &kv.v}) {
            const std::size_t n = bytes_for(w.wire, values->size());
            if (at + n > stored.size()) throw qkv::mpi::error("a K/V block is shorter than its shape");
            dequantize(w.wire, std::span<const std::byte>(stored.data() + at, n), *values);
            at += n;
        }
        out.push_back(std::move(kv));
    }
    return out;
}

std::vector<float> range_rows(std::span<const float> local, std::size_t outer, std::size_t width,
                              const sequence_slice& slice, std::size_t index) {
    const std::size_t rows = slice.rows(), first = rows_before(slice, index), n = slice.ranges[index].size();
    std::vector<float> out(outer * n * width);
    for (std::size_t o = 0; o < outer; ++o) {
        const float* from = local.data() + (o * rows + first) * width;
        std::copy(from, from + n * width, out.data() + o * n * width);
    }
    return out;
}

block_problem::block_problem(const whole& w, row_range q, std::span<const float> q_rows, row_range k,
                             std::span<const float> k_rows, std::span<const float> v_rows) {
    p_.shape = w.shape;
    p_.shape.q_len = q.size();
    p_.shape.kv_len = k.size();
    p_.q = q_rows;
    p_.k = k_rows;
    p_.v = v_rows;
    p_.options = w.options;
    p_.options.return_lse = true;
    p_.options.return_weights = false;
    p_.options.position_offset = i64(q.first) + w.off - i64(k.first);
    if (!w.mask.empty()) {
        mask_ = mask_block(w.mask, w.mask_dims, w.mask_first_key, q, k, p_.mask_shape);
        p_.mask = mask_;
    }
    if (!w.additive.empty()) {
        additive_ = mask_block(w.additive, w.mask_dims, w.mask_first_key, q, k, p_.mask_shape);
        p_.additive_mask = additive_;
    }
}

merged_rows::merged_rows(const whole& w, std::size_t rows)
    : shape_{.batch = w.shape.batch, .q_heads = w.shape.q_heads, .q_len = rows, .d_v = w.shape.d_v},
      rows_(rows),
      out_(w.shape.batch * w.shape.q_heads * rows * w.shape.d_v, 0.0),
      lse_(w.shape.batch * w.shape.q_heads * rows, -std::numeric_limits<double>::infinity()),
      sinks_(w.sinks.begin(), w.sinks.end()) {}

void merged_rows::merge(std::span<const double> out, std::span<const double> lse) {
    const attention_part_f64 parts[] = {{.out = out_, .lse = lse_}, {.out = out, .lse = lse}};
    merged_attention_f64 m = merge_attention(std::span<const attention_part_f64>(parts), shape_);
    out_ = std::move(m.out);
    lse_ = std::move(m.lse);
}

void merged_rows::finish(std::size_t local_rows, std::size_t at, std::vector<float>& out,
                         std::vector<float>& lse) const {
    const attention_part_f64 part{.out = out_, .lse = lse_};
    const merged_attention_f64 m =
        merge_attention(std::span<const attention_part_f64>(&part, 1), shape_, std::span<const double>(sinks_));
    const std::size_t heads = shape_.batch * shape_.q_heads, ev = shape_.d_v;
    for (std::size_t bh = 0; bh < heads; ++bh)
        for (std::size_t i = 0; i < rows_; ++i) {
            const double* from = m.out.data() + (bh * rows_ + i) * ev;
            float* to = out.data() + (bh * local_rows + at + i) * ev;
            for (std::size_t c = 0; c < ev; ++c) to[c] = static_cast<float>(from[c]);
            if (!lse.empty()) lse[bh * local_rows + at + i] = static_cast<float>(m.lse[bh * rows_ + i]);
        }
}

void put_le(bytes& out, std::uint64_t v, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) out.push_back(static_cast<std::byte>(v >> (8 * i)));
}

std::uint64_t get_le(const bytes& in, std::size_t& at, std::size_t n) {
    if (at + n > in.size()) throw qkv::mpi::error("a message is shorter than its fields");
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < n; ++i)
        v |= static_cast<std::uint64_t>(std::to_integer<unsigned char>(in[at + i])) << (8 * i);
    at += n;
    return v;
}

bytes problem_bytes(const sdpa_shape& shape, const sdpa_options& options) {
    bytes out;
    visit_shape(shape, [&](const char*, std::size_t d) { put_le(out, d, 8); });
    const std::vector<std::byte> o = to_bytes(options);
    out.insert(out.end(), o.begin(), o.end());
    return out;
}

std::size_t problem_bytes_size() { return problem_bytes({}, {}).size(); }

void problem_from_bytes(const bytes& in, std::size_t& at, sdpa_shape& shape, sdpa_options& options) {
    const std::size_t dims = problem_bytes_size() - options_bytes();
    if (at + dims + options_bytes() > in.size())
        throw qkv::mpi::error("a problem's description is shorter than its fields");
    visit_shape(shape, [&](const char*, std::size_t& d) { d = static_cast<std::size_t>(get_le(in, at, 8)); });
    options = options_from_bytes(std::span<const std::byte>(in.data() + at, options_bytes()));
    at += options_bytes();
}

void add_problem(fingerprint& fp, const sdpa_shape& s, const sdpa_options& o,
                 const std::vector<std::size_t>& mask_shape, std::span<const std::uint8_t> mask,
                 std::span<const float> additive, std::span<const float> sinks) {
    const bytes described = problem_bytes(s, o);
    fp.add(described.data(), described.size());
    fp.add_value(mask_shape.size());
    for (const std::size_t d : mask_shape) fp.add_value(d);
    for (const std::size_t n : {mask.size(), additive.size(), sinks.size()}) fp.add_value(n);
    fp.add(mask.data(), mask.size());
    fp.add(additive.data(), additive.size_bytes());
    fp.add(sinks.data(), sinks.size_bytes());
}

shared_bytes to_bytes(std::span<const double> a, std::span<const double> b) {
    auto out = std::make_shared<bytes>(a.size_bytes() + b.size_bytes());
    if (!a.empty()) std::memcpy(out->data(), a.data(), a.size_bytes());
    if (!b.empty()) std::memcpy(out->data() + a.size_bytes(), b.data(), b.size_bytes());
    return out;
}

shared_bytes to_bytes(std::span<const float> a) {
    auto out = std::make_shared<bytes>(a.size_bytes());
    if (!a.empty()) std::memcpy(out->data(), a.data(), a.size_bytes());
    return out;
}

void from_bytes(const bytes& in, std::size_t at, std::span<double> out) {
    if (at + out.size_bytes() > in.size()) throw qkv::mpi::error("a message is shorter than its shape");
    if (!out.empty()) std::memcpy(out.data(), in.data() + at, out.size_bytes());
}

void from_bytes(const bytes& in, std::size_t at, std::span<float> out) {
    if (at + out.size_bytes() > in.size()) throw qkv::mpi::error("a message is shorter than its shape");
    if (!out.empty()) std::memcpy(out.data(), in.data() + at, out.size_bytes());
}

}  // namespace qkv::mpi::detail
