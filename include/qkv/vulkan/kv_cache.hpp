// qkv::vulkan::kv_cache: keys and values kept on the device across calls, for decoding.
//
//   qkv::vulkan::context ctx;
//   qkv::vulkan::kv_cache cache(ctx, {.batch = 1, .kv_heads = 2, .capacity = 65536, .d_qk = 64, .d_v = 64});
//                                     // a qkv::kv_layout (qkv/runtime/kv_layout.hpp); .type = f16, q8_0, ...
//   cache.append(k_rows, v_rows, n);          // (B, Hkv, n, E) and (B, Hkv, n, Ev), host data
//   qkv::sdpa_output o = ctx.sdpa(problem, cache);  // q from the host, K/V from the cache
//
// append() writes only the new rows to the device; earlier rows stay where they are. The cache
// stores K and V as its layout's type says (kv_layout::type): f32 or f16 as texels of 4 values
// (RGBA32F or RGBA16F), read through texel buffers, or ggml's q8_0 / q4_0 blocks (quantized on
// append, on the host, by qkv::quantize: appending then dequantizing gives exactly the values
// qkv::round_trip gives), which the decode kernel dequantizes in float32; one run of `capacity`
// rows per (batch, kv head).
//
// A cache shares the device of the context it was created from and keeps it alive: destroying,
// moving or move-assigning over that context first is safe, and the cache keeps working (append,
// clear, size; and context::sdpa on the context it was moved to). Every member function is
// thread-safe: checks and writes happen under the device's lock, so concurrent appends either
// both fit or one throws limit_exceeded with nothing appended. A moved-from cache throws
// qkv::error ("used after move") on every call and is safe to destroy. The storage is allocated
// once, at creation; where the host cannot write it in place (memory it cannot map, a caller's
// buffer), a host append also uses an upload staging buffer the size of its rows, kept for the
// next append only up to 1 MiB. Both count towards context_options::device_memory_limit, so a
// host append may throw out_of_memory (nothing appended). While a sequence holds a recorded append
// to the cache that has not run, every other use of it throws qkv::invalid_argument
// (sequence::record_append).
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>

#include "qkv/runtime/element_type.hpp"
#include "qkv/runtime/kv_layout.hpp"
#include "qkv/vulkan/context.hpp"
#include "qkv/vulkan/export.hpp"
#include "qkv/vulkan/tensor.hpp"

namespace qkv::vulkan {

class QKV_VULKAN_API kv_cache {
public:
    /// Allocates K and V for `layout.capacity` rows on the context's device, stored as
    /// `layout.type` says. An f32 / f16 cache whose K or V passes maxStorageBufferRange is kept
    /// all the same where maxTexelBufferElements reaches it (a paged decode's pool): the decode
    /// calls read it through texel views, while keys(), values() and the append of device tensors,
    /// which bind it as a storage buffer, throw limit_exceeded. Throws qkv::invalid_argument for a
    /// zero dimension (qkv::validate of the layout), limit_exceeded beyond the device's
    /// texel-buffer limits (and, for q8_0 / q4_0 blocks, its storage-buffer range),
    /// out_of_memory when the memory cannot be had (nothing is kept), unavailable for an f16 cache
    /// on a device without 16-bit storage.
    kv_cache(context& ctx, const kv_layout& layout);
    /// A cache over the caller's storage (tensors made with interop.hpp's wrap, or qkv's own):
    /// k of shape (B, Hkv, capacity, 4·ceil(E/4)) and v of (B, Hkv, capacity, 4·ceil(Ev/4)), f32
    /// (f16 for type f16), each starting at a multiple of minTexelBufferOffsetAlignment and,
    /// for a caller's buffer, with VK_BUFFER_USAGE_UNIFORM_TEXEL_BUFFER_BIT. Empty at first; the
    /// cache owns the tensors (a caller's memory is still never freed). Only for f32 and f16 caches
    /// (qkv::invalid_argument for a q8_0 / q4_0 layout).
    kv_cache(context& ctx, const kv_layout& layout, tensor k, tensor v);
    ~kv_cache();
    kv_cache(kv_cache&&) noexcept;
    kv_cache& operator=(kv_cache&&) noexcept;
    kv_cache(const kv_cache&) = delete;
    kv_cache& operator=(const kv_cache&) = delete;

    /// Appends `rows` keys and values to every (batch, kv head): k is (B, Hkv, rows, E) and v is
    /// (B, Hkv, rows, Ev), row-major. Throws qkv::invalid_argument when a span's size does not fit
    /// and limit_exceeded when size() + rows would pass capacity(); an f16 cache throws
    /// numeric_overflow for a finite value beyond float16's range; a q8_0 / q4_0 cache throws
    /// qkv::invalid_argument for a value qkv::quantize refuses (NaN, infinite, a block whose scale
    /// does not fit float16). In every case nothing is appended.
    void append(std::span<const float> k, std::span<const float> v, std::size_t rows);
    /// The same, for braced lists: `append({}, {}, 0)` and `append({k0, k1}, {v0, v1}, 1)` call the
    /// host append (not the tensor one), as they did before it existed.
    void append(std::initializer_list<float> k, std::initializer_list<float> v, std::size_t rows) {
        append(std::span<const float>(k.begin(), k.size()), std::span<const float>(v.begin(), v.size()), rows);
    }

    /// The same from float16 values given as their bits (qkv::to_half_bits' form): an f16 cache
    /// stores them as they are (a signalling NaN made quiet, as a float32 round trip would), with no
    /// conversion and no overflow to check; a cache of another type stores them as append() stores
    /// their float32 values (exact), with its refusals. Nothing is appended when one is refused.
    void append_f16(std::span<const std::uint16_t> k, std::span<const std::uint16_t> v, std::size_t rows);

    /// Rows held per (batch, kv head): at most capacity(), whatever other threads do.
    [[nodiscard]] std::size_t size() const;
    [[nodiscard]] std::size_t capacity() const;
    /// The layout it was created with (it never changes).
    [[nodiscard]] const kv_layout& layout() const;
    /// Forgets every row (the memory is kept for the next appends).
    void clear();

    /// Appends `rows` rows from device tensors k (B, Hkv, rows, E) and v (B, Hkv, rows, Ev), of the
    /// cache's storage type (f32, f16, or q8_0 / q4_0 blocks, copied as they are), on the device:
    /// nothing crosses to the host. Waits until they are in. Throws as append() does
    /// (numeric_overflow is not checked here: a finite value beyond float16's range cannot be in an
    /// f16 tensor); a q8_0 / q4_0 append needs 16-bit storage buffers (unavailable without).
    void append(const tensor& k, const tensor& v, std::size_t rows);

    /// The cache's storage: K as (B, Hkv, capacity, 4·ceil(E/4)) and V as (B, Hkv, capacity,
    /// 4·ceil(Ev/4)) tensors of f32 (f16 for an fp16 cache), each row zero-padded to whole texels of
    /// 4 values. Rows [0, size()) hold the keys and values appended. A q8_0 / q4_0 cache stores
    /// ggml's blocks, which are no tensor: unavailable.
    [[nodiscard]] const tensor& keys() const;
    [[nodiscard]] const tensor& values() const;

    struct impl;

private:
    friend class context;
    friend struct kv_cache_access;
    std::shared_ptr<impl> impl_;
};

}  // namespace qkv::vulkan
