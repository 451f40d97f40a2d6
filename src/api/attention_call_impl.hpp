// The inside of qkv::vulkan::attention_call (attention_call.cpp), for what records it
// (sequence.cpp, interop.cpp) and a recording's check (recording.cpp). Private to src/.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "api/planned_call.hpp"
#include "api/tensor_impl.hpp"
#include "plan/attention_plan.hpp"
#include "qkv/vulkan/attention_call.hpp"
#include "run/sdpa_guard.hpp"

namespace qkv::vulkan {

struct attention_call::impl : planned_call {
    attention_problem desc;  // shape, options; its masks' spans point into the vectors below
    std::vector<std::uint8_t> mask;
    std::vector<float> additive;
    detail::plan p;  // planned with the bias and bo regions present (absent ones are zeros); the constants
                     // hold the masks' bits and additive entries at its offsets within its inputs
    detail::additive_facts mask_facts;  // the overflow rule's view of `additive`

    /// The tensors, checked (present where they must be, of the description's shapes, float32,
    /// on this device, no output over another): before anything is recorded.
    struct checked_tensors {
        const tensor::impl *x, *wq, *wk, *wv, *bq, *bk, *bv, *wo, *bo, *out;
    };
    [[nodiscard]] checked_tensors check(const attention_tensors& t) const;
    void record(detail::recorder& rec, recording::impl& r, const attention_tensors& t);
};

struct attention_call_access {
    static attention_call::impl& of(attention_call& c) {
        if (!c.impl_) throw qkv::error("qkv::vulkan::attention_call used after move");
        return *c.impl_;
    }
};

}  // namespace qkv::vulkan
