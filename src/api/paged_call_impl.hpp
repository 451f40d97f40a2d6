// The inside of qkv::vulkan::paged_call (paged_call.cpp), for what records it (sequence.cpp,
// interop.cpp). Private to src/.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "api/kv_cache_impl.hpp"
#include "api/planned_call.hpp"
#include "qkv/vulkan/paged_call.hpp"
#include "run/run.hpp"

namespace qkv::vulkan {

namespace detail {
/// A step resolved (resolve_pages_without_data: the table's rows, the lengths after the append,
/// the new rows' pool rows) and planned.
struct paged_step {
    std::shared_ptr<const basic_resolved_pages<float>> resolved;  // shared: its problem views itself
    paged_layout layout;
};
}  // namespace detail

struct paged_call::impl : planned_call {
    paged_problem desc;  // its spans point into the vectors below
    std::vector<std::int32_t> block_table, cache_seqlens, cu_seqlens_q, cache_batch_idx, cache_leftpad;
    std::vector<float> sinks, alibi_slopes, rotary_cos, rotary_sin;  // the tables also in `constants`
    std::shared_ptr<kv_cache::impl> cache;                           // the pool
    /// The description's step, planned once (where it has one).
    std::optional<detail::paged_step> planned;

    /// Whether the call appends: its new rows are written into the pool when its commands run.
    [[nodiscard]] bool appends() const { return desc.new_rows != 0; }
    /// A step's placeholder entries for a block table on the device (its size; the lock held).
    mutable std::vector<std::int32_t> table_placeholder;
    /// A step's bounds for lengths on the device (each table row's keys less the new rows).
    mutable std::vector<std::int32_t> lengths_placeholder;

    /// A validated step resolved and planned (the lock held); `table_here` false: its block table
    /// is checked on the device (resolve_pages_without_data); `bounds`: its lengths are bounds, the
    /// real ones on the device (plan_paged_call).
    [[nodiscard]] detail::paged_step plan(const paged_problem& step, bool table_here = true, bool bounds = false) const;

    /// The step `t` asks for (its spans, or the description's), validated against the pool's pages
    /// as they are now, and the tensors checked against it (the lock held): before anything is
    /// recorded.
    [[nodiscard]] paged_problem check(const paged_tensors& t) const;
    /// Records the call over `t` into `rec`, its scratch in `r` (the lock held).
    void record(detail::recorder& rec, recording::impl& r, const paged_tensors& t);
};

struct paged_call_access {
    static paged_call::impl& of(paged_call& c) {
        if (!c.impl_) throw qkv::error("qkv::vulkan::paged_call used after move");
        return *c.impl_;
    }
};

}  // namespace qkv::vulkan
