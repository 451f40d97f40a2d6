// qkv::kv_layout: how a K/V cache holds its keys and values, the one description of every cache:
// the single-device qkv::vulkan::kv_cache, a rank's shard and the sharded cache of qkv::mpi (where
// `capacity` is each rank's). And the one check of a problem that runs against a cache.
//
//   K of a cache: (batch, kv_heads, capacity, d_qk), V: (batch, kv_heads, capacity, d_v), rows
//   [0, size) appended; stored as `type` says (qkv/runtime/element_type.hpp: f32, f16, or ggml's
//   q8_0 / q4_0 blocks along each row, d_qk and d_v multiples of 32).
#pragma once

#include <cstddef>
#include <string_view>

#include "qkv/runtime/element_type.hpp"
#include "qkv/runtime/export.hpp"
#include "qkv/runtime/sdpa.hpp"

namespace qkv {

struct kv_layout {
    std::size_t batch = 1;                  ///< B
    std::size_t kv_heads = 1;               ///< Hkv
    std::size_t capacity = 0;               ///< the most rows (keys) per (batch, kv head); sharded: per rank
    std::size_t d_qk = 0;                   ///< E, width of the keys
    std::size_t d_v = 0;                    ///< Ev, width of the values
    element_type type = element_type::f32;  ///< how K and V are stored
    friend constexpr bool operator==(const kv_layout&, const kv_layout&) = default;
};

/// Throws qkv::invalid_argument ("<who>: capacity must be at least 1", ...) for a zero dimension,
/// an unknown type or one that holds no floats (i32), or a quantized type with d_qk or d_v not a
/// multiple of 32.
QKV_RUNTIME_API void validate(const kv_layout& layout, std::string_view who);

/// Throws qkv::invalid_argument naming `who` where a problem of `shape` and `options` cannot run
/// against a cache of `layout`: its (batch, kv_heads, d_qk, d_v) differ from the cache's, or
/// options.kv_type is set to another type than the cache's (unset takes the cache's).
QKV_RUNTIME_API void check_cache_fit(const sdpa_shape& shape, const sdpa_options& options, const kv_layout& layout,
                                     std::string_view who);

/// The queries of a call against a cache of `layout` that holds `rows` rows, as the call runs them
/// (kv_len = rows). Throws qkv::invalid_argument naming `who`: k or v given (K and V are the
/// cache's), an empty cache, a kv_len other than 0 (the cache's size) or `rows`, check_cache_fit's
/// refusals, and validate_queries' (q, the masks over `rows` keys, the options, the sinks), or
/// with `description` (a call over device tensors, q empty) validate_description's.
[[nodiscard]] QKV_RUNTIME_API sdpa_problem check_against_cache(const sdpa_problem& queries, const kv_layout& layout,
                                                               std::size_t rows, std::string_view who,
                                                               bool description = false);

}  // namespace qkv
