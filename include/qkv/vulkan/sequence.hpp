// qkv::vulkan::sequence: several planned calls over device tensors (sdpa_call, attention_call, paged_call) and
// K/V cache appends recorded into one command buffer of qkv's and submitted once.
#pragma once

#include <cstddef>
#include <memory>

#include "qkv/vulkan/attention_call.hpp"
#include "qkv/vulkan/context.hpp"
#include "qkv/vulkan/export.hpp"
#include "qkv/vulkan/kv_cache.hpp"
#include "qkv/vulkan/paged_call.hpp"
#include "qkv/vulkan/sdpa_backward_call.hpp"
#include "qkv/vulkan/sdpa_call.hpp"
#include "qkv/vulkan/tensor.hpp"

namespace qkv::vulkan {

/// Several planned calls (and cache appends) in one command buffer of qkv's, submitted once
/// (Kompute's "sequence"): what a model does per token, without a Vulkan header of its own. Each
/// recorded call keeps its scratch until the sequence records again after a run, or is destroyed.
/// One sequence is used by one thread at a time (different sequences may run concurrently).
///
/// A record refused before it records anything (its arguments: every check comes first) leaves
/// the sequence as it was. One that fails part-way (out_of_memory while recording) cannot be
/// taken back: everything recorded since the last run is dropped, and the appends among it are
/// undone (recorded() is then 0). A sequence destroyed before its run undoes its appends too.
/// The calls and tensors recorded must live until run() returns (the caches are kept alive).
class QKV_VULKAN_API sequence {
public:
    explicit sequence(context& ctx);
    ~sequence();
    sequence(sequence&&) noexcept;
    sequence& operator=(sequence&&) noexcept;
    sequence(const sequence&) = delete;
    sequence& operator=(const sequence&) = delete;

    /// Records `call` over `tensors` after what is recorded already (in order: each waits for the
    /// ones before it where they share memory).
    void record(sdpa_call& call, const sdpa_tensors& tensors);
    void record(attention_call& call, const attention_tensors& tensors);
    void record(sdpa_backward_call& call, const sdpa_backward_tensors& tensors);
    /// A paged batch's step: its block table and lengths are read (copied) now.
    void record(paged_call& call, const paged_tensors& tensors);
    /// Records an append of device rows to `cache`. Its size grows now, so calls recorded after it
    /// in this sequence see the rows; until run(), every other use of the cache (its appends, the
    /// calls over it, other sequences) is refused with qkv::invalid_argument, since those rows are
    /// not written yet.
    void record_append(kv_cache& cache, const tensor& k, const tensor& v, std::size_t rows);
    /// Submits everything recorded, once, waits, then checks every call (numeric_overflow as the
    /// host path). The sequence is empty again afterwards.
    void run();
    /// The calls and appends recorded since the last run.
    [[nodiscard]] std::size_t recorded() const;

    struct impl;

private:
    std::unique_ptr<impl> impl_;
};

}  // namespace qkv::vulkan
