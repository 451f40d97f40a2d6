#include "run/io.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "qkv/runtime/element_type.hpp"
#include "qkv/runtime/half.hpp"
#include "qkv/vulkan/error.hpp"

namespace qkv::vulkan::detail {

const char* role_name(role r) {
    switch (r) {
        case role::inputs:
            return "inputs";
        case role::qkv:
            return "Q|K|V";
        case role::scores:
            return "scores";
        case role::concat:
            return "concatenated heads";
        case role::out:
            return "output";
        case role::state:
            return "fused-attention state";
        case role::texels:
            return "fused-attention texels";
        case role::partial_stats:
            return "decode partial statistics";
        case role::partial_acc:
            return "decode partial accumulators";
        case role::widened:
            return "tensors read as float32";
    }
    return "buffer";
}

void run_buffers::prepare(allocator& alloc, const buffer_plan& plan, std::span<const download> downloads, host_io io) {
    try {
        for (std::size_t i = 0; i < role_count; ++i) {
            const auto r = static_cast<role>(i);
            if (plan.bytes[i] == 0) {
                buffers_[i].reset();
                continue;
            }
            // Texel usage too: the texel variants and the decode kernels read these through views.
            alloc.ensure(buffers_[i], plan.bytes[i], memory_use::device, role_name(r),
                         VK_BUFFER_USAGE_UNIFORM_TEXEL_BUFFER_BIT);
        }
        std::uint64_t readback = 0;
        bool mapped = (*this)[role::inputs].mapped() != nullptr || plan.of(role::inputs) == 0;
        for (const download& d : downloads) {
            readback += d.bytes;
            mapped = mapped && (*this)[d.from].mapped() != nullptr;
        }
        staged_ = io == host_io::staged || (io == host_io::automatic && !mapped);
        if (staged_) {
            alloc.ensure(staging_in_, plan.of(role::inputs), memory_use::upload, "upload staging");
            alloc.ensure(staging_out_, readback, memory_use::readback, "readback staging");
        } else {
            staging_in_.reset();
            staging_out_.reset();
        }
    } catch (const out_of_memory&) {
        release();
        throw;
    }
}

void run_buffers::release() {
    for (buffer& b : buffers_) b.reset();
    staging_in_.reset();
    staging_out_.reset();
    guard = {};
    staged_ = false;
}

std::byte* run_buffers::inputs() const { return staged_ ? staging_in_.mapped() : (*this)[role::inputs].mapped(); }

void run_buffers::record_upload(recorder& exec, std::uint64_t bytes) const {
    if (bytes == 0) return;
    (staged_ ? staging_in_ : (*this)[role::inputs]).flush();
    if (!staged_) return;  // host-visible device memory: the submit makes the writes visible
    exec.copy(staging_in_.handle(), 0, (*this)[role::inputs].handle(), 0, bytes);
    exec.barrier(VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                 VK_ACCESS_SHADER_READ_BIT);
}

void run_buffers::record_download(recorder& exec, std::span<const download> downloads) const {
    if (!staged_) {
        exec.barrier(VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_HOST_BIT,
                     VK_ACCESS_HOST_READ_BIT);
        return;
    }
    exec.barrier(VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT,
                 VK_ACCESS_TRANSFER_READ_BIT);
    std::uint64_t at = 0;
    for (const download& d : downloads) {
        if (d.bytes) exec.copy((*this)[d.from].handle(), d.offset, staging_out_.handle(), at, d.bytes);
        at += d.bytes;
    }
    exec.barrier(VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT, VK_PIPELINE_STAGE_HOST_BIT,
                 VK_ACCESS_HOST_READ_BIT);
}

void run_buffers::read(std::span<const download> downloads, std::size_t i, void* to) const {
    const download& d = downloads[i];
    if (d.bytes == 0) return;
    if (staged_) {
        std::uint64_t at = 0;
        for (std::size_t j = 0; j < i; ++j) at += downloads[j].bytes;
        staging_out_.invalidate();
        std::memcpy(to, staging_out_.mapped() + at, d.bytes);
    } else {
        const buffer& from = (*this)[d.from];
        from.invalidate();
        std::memcpy(to, from.mapped() + d.offset, d.bytes);
    }
}

void put_floats(std::byte* at, std::span<const float> values, float scale) {
    if (values.empty()) return;
    if (scale == 1.0f) {
        std::memcpy(at, values.data(), values.size_bytes());
        return;
    }
    auto* f = reinterpret_cast<float*>(at);
    for (std::size_t i = 0; i < values.size(); ++i) f[i] = values[i] * scale;
}

namespace {

[[noreturn]] void half_overflow(const char* what, std::size_t index, float value) {
    char text[32];
    std::snprintf(text, sizeof text, "%.7g", static_cast<double>(value));
    throw numeric_overflow(std::string(what) + "[" + std::to_string(index) + "] = " + text +
                           " is beyond float16's range (65504), so it cannot be stored as float16; use fp32 "
                           "(precision fp32, or a float32 K/V store), or scale the inputs down");
}

/// The first of the `n` values converted to `halves` (each times `scale`) that float16 could not
/// hold, or n: a finite value stored as ±inf, exactly what half_overflow_index finds (a finite
/// float rounds to ±inf in float16 exactly when it is at least 65520 in magnitude). The halves are
/// scanned (branch-free, vectorized; hot in the cache after the conversion); the values only where
/// one is infinite.
std::size_t overflowed_index(const float* values, const std::uint16_t* halves, std::size_t n, float scale) {
    std::uint32_t any = 0;
    for (std::size_t i = 0; i < n; ++i) any |= static_cast<std::uint32_t>((halves[i] & 0x7fffu) == 0x7c00u);
    if (any == 0) return n;
    for (std::size_t i = 0; i < n; ++i)
        if ((halves[i] & 0x7fffu) == 0x7c00u && std::isfinite(values[i] * scale)) return i;
    return n;
}

}  // namespace

void put_halves(std::byte* at, std::span<const float> values, const char* what, float scale) {
    // Every value (times the scale, applied within the check and the conversion: no scaled copy)
    // checked before any is written: a refused call leaves the memory as it was (a tensor's own
    // memory is written in place where it is mapped).
    if (const std::size_t bad = qkv::half_overflow_index(values, scale); bad < values.size())
        half_overflow(what, bad, values[bad]);
    qkv::to_half_bits(values, scale, {reinterpret_cast<std::uint16_t*>(at), values.size()});
}

void put_mask_bits(std::byte* at, std::span<const std::uint8_t> mask) {
    auto* bits = reinterpret_cast<std::uint32_t*>(at);
    std::fill(bits, bits + mask_bits_bytes(mask.size()) / 4, 0u);
    for (std::size_t i = 0; i < mask.size(); ++i)
        if (mask[i]) bits[i / 32] |= 1u << (i % 32);
}

void put_texel_rows(std::byte* at, const float* src, std::size_t rows, std::size_t width, std::size_t texels, bool fp16,
                    const char* what, float scale, half_check check) {
    const std::size_t padded = texels * 4;
    if (!fp16) {
        auto* d = reinterpret_cast<float*>(at);
        for (std::size_t r = 0; r < rows; ++r) {
            float* row = d + r * padded;
            put_floats(reinterpret_cast<std::byte*>(row), {src + r * width, width}, scale);
            std::fill(row + width, row + padded, 0.0f);
        }
        return;
    }
    // Each row converted (times the scale, applied within the conversion: no scaled copy), then
    // its halves checked while they are in the cache: one pass over the values, where a check
    // before the conversion would read them twice.
    auto* d = reinterpret_cast<std::uint16_t*>(at);
    for (std::size_t r = 0; r < rows; ++r) {
        std::uint16_t* row = d + r * padded;
        const float* in = src + r * width;
        qkv::to_half_bits({in, width}, scale, {row, width});
        if (check == half_check::on_store)
            if (const std::size_t bad = overflowed_index(in, row, width, scale); bad < width)
                half_overflow(what, r * width + bad, in[bad]);
        std::fill(row + width, row + padded, std::uint16_t{0});
    }
}

void put_half_rows(std::byte* at, const std::uint16_t* src, std::size_t rows, std::size_t width, std::size_t texels) {
    const std::size_t padded = texels * 4;
    auto* d = reinterpret_cast<std::uint16_t*>(at);
    for (std::size_t r = 0; r < rows; ++r) {
        std::uint16_t* row = d + r * padded;
        const std::uint16_t* in = src + r * width;
        // A NaN (exponent all ones, a nonzero mantissa) gets its quiet bit, as the float32 round
        // trip gives it; every other value is copied (branch-free, vectorized).
        for (std::size_t i = 0; i < width; ++i)
            row[i] = static_cast<std::uint16_t>(in[i] | (static_cast<unsigned>((in[i] & 0x7fffu) > 0x7c00u) << 9));
        std::fill(row + width, row + padded, std::uint16_t{0});
    }
}

}  // namespace qkv::vulkan::detail
