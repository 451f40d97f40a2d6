// The run I/O every operation (run_attention, run_sdpa, run_decode) shares: the device buffers a
// context keeps between calls, by role (plan/buffers.hpp), under one reuse policy; where the host writes a
// call's inputs (the mapped inputs buffer, or upload staging) and how each kind of host tensor is
// packed there (float32, float16, mask bits, rows of whole texels); the upload and download
// commands; and reading the results back.
//
// A plan says what a call needs (a buffer_plan: bytes per role, and the regions to download); the
// run function packs its inputs at the plan's offsets, records its kernels between
// record_upload() and record_download(), submits, and reads each download.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kernels/range_guard.hpp"
#include "plan/buffers.hpp"
#include "vk/executor.hpp"
#include "vk/memory.hpp"

namespace qkv::vulkan::detail {

/// How the host reaches a call's buffers: through the mapped memory where it is mapped, else
/// through staging (automatic); always through staging (staged: settings::force_staging); or not
/// at all (none: a recording, whose inputs are copied from tensors on the device).
enum class host_io { automatic, staged, none };

/// The buffers a context keeps between calls.
class run_buffers {
public:
    /// Allocates or reuses every buffer `plan` asks for (allocator::ensure) and releases the rest;
    /// decides whether inputs and results go through staging buffers (`io`) and sizes those for
    /// `downloads`. An allocation failure releases every buffer, so a failed call keeps nothing,
    /// and rethrows out_of_memory.
    void prepare(allocator& alloc, const buffer_plan& plan, std::span<const download> downloads, host_io io);

    [[nodiscard]] buffer& operator[](role r) { return buffers_[static_cast<std::size_t>(r)]; }
    [[nodiscard]] const buffer& operator[](role r) const { return buffers_[static_cast<std::size_t>(r)]; }
    /// A binding of `bytes` of a role's buffer from `offset`.
    [[nodiscard]] binding bind(role r, std::uint64_t offset, std::uint64_t bytes) const {
        return {(*this)[r].handle(), offset, bytes};
    }
    [[nodiscard]] bool staged() const { return staged_; }

    /// Where the host writes the call's inputs (plan.of(role::inputs) bytes).
    [[nodiscard]] std::byte* inputs() const;
    /// Makes the host's writes visible to the device: flushes, and records the staging copy where
    /// there is one, then a barrier to compute reads.
    void record_upload(recorder& exec, std::uint64_t bytes) const;
    /// Records what makes `downloads` readable by the host (a barrier; the copies into staging).
    void record_download(recorder& exec, std::span<const download> downloads) const;
    /// After the submit: copies the bytes of downloads[i] to `to`.
    void read(std::span<const download> downloads, std::size_t i, void* to) const;

    /// Releases everything (context::trim, and after an allocation failure).
    void release();

    range_guard_buffers guard;  ///< the attention range guard's result (kernels/range_guard.hpp)

private:
    std::array<buffer, role_count> buffers_;
    buffer staging_in_, staging_out_;
    bool staged_ = false;
};

// ---- packing host tensors at a call's offsets -------------------------------------------------

/// float32 values, each multiplied by `scale` (a power of two: exact, see sdpa_guard.hpp).
void put_floats(std::byte* at, std::span<const float> values, float scale = 1.0f);
/// float16 values (nearest even); a finite value beyond float16's range throws numeric_overflow
/// naming `what` and the element, never stored as infinity; every value is checked before any
/// is written.
void put_halves(std::byte* at, std::span<const float> values, const char* what, float scale = 1.0f);
/// A bool mask (0/1 bytes) as bits: bit n of word n / 32.
void put_mask_bits(std::byte* at, std::span<const std::uint8_t> mask);
/// Whether put_texel_rows checks float16 stores for overflow: `on_store` (as it converts), or
/// `done` where the caller has checked the values already (with its own message).
enum class half_check { on_store, done };
/// `rows` rows of `width` values from `src`, each written as `texels` texels of 4 (zero-padded),
/// float32 or (`fp16`) float16. A float16 store checks each row as it converts it (one pass over
/// the values): a finite value beyond float16's range throws numeric_overflow naming `what` and the
/// element, as put_halves, but the rows before it are written by then. Its callers write a call's
/// inputs, or a cache's rows past its size, which nothing reads unless the write succeeds.
void put_texel_rows(std::byte* at, const float* src, std::size_t rows, std::size_t width, std::size_t texels, bool fp16,
                    const char* what, float scale = 1.0f, half_check check = half_check::on_store);

/// `rows` rows of `width` float16 values given as their bits, each written as `texels` texels of 4
/// (zero-padded) as they are, a signalling NaN made quiet (as put_texel_rows of their float32
/// values would store them, bit for bit).
void put_half_rows(std::byte* at, const std::uint16_t* src, std::size_t rows, std::size_t width, std::size_t texels);

}  // namespace qkv::vulkan::detail
