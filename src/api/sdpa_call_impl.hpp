// The inside of qkv::vulkan::sdpa_call (sdpa_call.cpp), for what records it (sequence.cpp,
// interop.cpp). Private to src/.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "api/kv_cache_impl.hpp"
#include "api/planned_call.hpp"
#include "plan/sdpa_plan.hpp"
#include "qkv/vulkan/sdpa_call.hpp"
#include "run/run.hpp"
#include "run/sdpa_guard.hpp"

namespace qkv::vulkan {

struct sdpa_call::impl : planned_call {
    sdpa_problem desc;  // its masks' spans point into the vectors below
    std::vector<std::uint8_t> mask;
    std::vector<float> additive;
    detail::additive_facts mask_facts;  // the overflow rule's view of `additive`, for every check
    std::vector<float> sinks, alibi_slopes;
    std::shared_ptr<kv_cache::impl> cache;
    detail::sdpa_plan plan;       // Q, K and V from tensors: made once; against a cache: made per call
    detail::mask_bindings masks;  // where the constants hold the masks (bits, then the additive entries)
    /// Without a cache, where the tensors read as float32 go (role::widened), when they are
    /// (widen()): q, k and v in turn, in floats.
    std::uint64_t widened_q = 0, widened_k = 0, widened_v = 0;
    /// While the call is made over a cache: the decode kernel its dry recordings take, whatever
    /// the cache holds, so that both kernels a record may take are built then.
    std::optional<detail::decode_values> planning;

    /// The problem as it runs now: against a cache, kv_len is the cache's size.
    [[nodiscard]] sdpa_problem current() const {
        sdpa_problem p = desc;
        if (cache && desc.shape.kv_len == 0) p.shape.kv_len = cache->size;
        return p;
    }
    /// The element type of q (precision's) and of k and v (stored_kv_type: f32, f16, q8_0, q4_0).
    [[nodiscard]] element_type q_type() const {
        return desc.options.precision == precision::fp16 ? element_type::f16 : element_type::f32;
    }
    [[nodiscard]] element_type kv_type() const { return stored_kv_type(desc.options); }
    /// Whether the tensors are read as float32 first (role::widened): where q, k and v differ in
    /// type, or K and V are quantized. Otherwise they are all f32, or all f16, and read in place.
    [[nodiscard]] bool widen() const { return !cache && (q_type() != kv_type() || is_quantized(kv_type())); }

    /// The problem as it runs now, and the tensors checked against it (the lock held): before
    /// anything is recorded.
    [[nodiscard]] sdpa_problem check(const sdpa_tensors& t) const;
    /// Records the call over `t` into `rec`, its scratch in `r` (the lock held).
    void record(detail::recorder& rec, recording::impl& r, const sdpa_tensors& t);
};

struct sdpa_call_access {
    static sdpa_call::impl& of(sdpa_call& c) {
        if (!c.impl_) throw qkv::error("qkv::vulkan::sdpa_call used after move");
        return *c.impl_;
    }
};

}  // namespace qkv::vulkan
