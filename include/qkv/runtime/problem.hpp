// An attention problem with run-time shapes, over host data: what the Vulkan backend
// (qkv::vulkan::context::attention) and the CPU reference backend (qkv::cpu::attention) take.
//
// Convention (the tutorial's): Q = X·Wq + bq, K = X·Wk + bk, V = X·Wv + bv, all row-major float32.
//   x       batch x seq x d_in
//   wq, wk  d_in x d_k            bq, bk  d_k (or empty: no bias)
//   wv      d_in x d_v            bv      d_v (or empty)
//   heads   divides d_k and d_v; head h uses columns [h·d_k/H, (h+1)·d_k/H) of Q and K, and the
//           matching slice of V; head outputs are concatenated (batch x seq x d_v)
//   wo, bo  optional output projection d_v x d_out, d_out (shape.d_out = 0: none)
//   mask           bool (uint8 0/1), seq x seq or batch x seq x seq, 1 = may attend
//   additive_mask  float, seq x seq or batch x seq x seq, added to the scaled scores (-inf masks)
//   causal         position i attends to j <= i; combines with both masks
// A row with no position it may attend to gets zero weights and a zero output.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "qkv/runtime/export.hpp"

namespace qkv {

struct attention_shape {
    std::size_t batch = 1;
    std::size_t seq = 0;   ///< N, the sequence length
    std::size_t d_in = 0;  ///< width of each input row
    std::size_t d_k = 0;   ///< width of queries and keys (all heads)
    std::size_t d_v = 0;   ///< width of values (all heads)
    std::size_t heads = 1;
    std::size_t d_out = 0;  ///< width of the output projection; 0 = no output projection

    /// Width of each output row: d_out if there is an output projection, else d_v.
    [[nodiscard]] constexpr std::size_t out_width() const { return d_out ? d_out : d_v; }
    friend constexpr bool operator==(const attention_shape&, const attention_shape&) = default;
};

enum class precision {
    fp32,  ///< everything in float32
    fp16,  ///< Q, K, V stored in float16; softmax statistics and accumulators in float32
};

enum class implementation {
    automatic,  ///< fused, unless the weights are requested (then staged)
    staged,     ///< project, scores, softmax, aggregate: four stages, N x N scores in memory
    fused,      ///< one flash-attention dispatch, no N x N matrix in memory; cannot return weights
};

/// Which family of the fused kernel (implementation::fused), of the split-S decode and of the
/// matrix products (the projections, and the staged scores and aggregation) runs. Each family is
/// named by the shape of its work; any family runs on any device, and they differ in speed, not in
/// results beyond rounding.
enum class kernel_family {
    /// row_tiles on CPU devices (VK_PHYSICAL_DEVICE_TYPE_CPU, e.g. lavapipe); coopmat for fp16 calls on
    /// GPUs offering VK_KHR_cooperative_matrix (unless a driver gate keeps it manual); block_tiles elsewhere
    automatic,
    row_tiles,    ///< one subgroup per workgroup, query rows on lanes, K/V through texel buffers, no barriers
    block_tiles,  ///< a large workgroup sharing K/V tiles through shared memory (shaders/flash.comp)
    /// Q·Kᵀ and P·V on the device's matrix units (VK_KHR_cooperative_matrix: tensor cores, WMMA, XMX),
    /// float16 operands with float32 accumulators (shaders/flash_coop.comp): fused and decode calls
    /// with precision fp16 and float16 K/V only; the matrix products of attention run block_tiles'.
    coopmat,
    /// The names of qkv 0.1: deprecated aliases, kept for one release.
    cpu [[deprecated("kernel_family::cpu is now kernel_family::row_tiles")]] = row_tiles,
    gpu [[deprecated("kernel_family::gpu is now kernel_family::block_tiles")]] = block_tiles,
};

struct run_options {
    std::optional<float> scale{};  ///< multiplies Q·Kᵀ; default 1/sqrt(d_k / heads)
    bool causal = false;           ///< position i attends to j <= i
    bool return_weights = false;   ///< also return the attention probabilities
    qkv::precision precision = precision::fp32;
    qkv::implementation implementation = implementation::automatic;
    qkv::kernel_family kernel = kernel_family::automatic;  ///< kernel family of the fused kernel and the products
};

struct attention_problem {
    attention_shape shape{};
    std::span<const float> x{};
    std::span<const float> wq{}, wk{}, wv{};
    std::span<const float> bq{}, bk{}, bv{};
    std::span<const float> wo{}, bo{};
    std::span<const std::uint8_t> mask{};
    std::span<const float> additive_mask{};
    run_options options{};
};

struct attention_output {
    std::vector<float> output;   ///< batch x seq x out_width()
    std::vector<float> weights;  ///< batch x heads x seq x seq, when options.return_weights
    attention_shape shape{};
    qkv::implementation implementation = implementation::staged;  ///< what actually ran
    qkv::kernel_family kernel = kernel_family::automatic;         ///< fused: the family that ran; staged: automatic
    std::string device;                                           ///< which device ran it
};

/// Throws qkv::invalid_argument naming the first problem found: a zero dimension, heads not
/// dividing d_k and d_v, a span whose size does not fit the shape, a mask value other than 0/1,
/// a non-finite scale, weights requested from the fused implementation, ...
QKV_RUNTIME_API void validate(const attention_problem& problem);

/// Every check of validate() but those of the data spans (x, the weights and the biases), which
/// must all be empty: the description of a call whose data lives on a device
/// (qkv::vulkan::attention_call), with its shape, options and masks. Every size the shape implies
/// is checked for overflow, as validate() checks it.
QKV_RUNTIME_API void validate_description(const attention_problem& problem);

/// The scale used when options.scale is not set: 1/sqrt(d_k / heads).
[[nodiscard]] QKV_RUNTIME_API float default_scale(const attention_shape& shape);

/// The implementation `automatic` resolves to for these options.
[[nodiscard]] QKV_RUNTIME_API implementation resolve_implementation(const run_options& options);

}  // namespace qkv
