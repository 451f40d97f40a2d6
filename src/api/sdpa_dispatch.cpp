#include "api/sdpa_dispatch.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "kernels/flash_cpu.hpp"
#include "kernels/flash_gpu.hpp"
#include "kernels/flash_layout.hpp"
#include "kernels/stages.hpp"
#include "qkv/vulkan/error.hpp"

namespace qkv::vulkan::detail {
namespace {

std::uint64_t align_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }

/// Where everything of one call lives: the inputs buffer holds [q | k | v] (one binding, the
/// kernels' Q|K|V) then the mask bits and the additive mask, each part aligned for a binding.
struct sdpa_plan {
    flash_layout layout;
    std::uint64_t q_count = 0, k_count = 0, v_count = 0, out_count = 0, weights_count = 0, mask_count = 0;
    std::uint64_t element_bytes = 4;
    std::uint64_t k_at = 0, v_at = 0, qkv_bytes = 0;  // byte offsets inside the Q|K|V region (at 0)
    std::uint64_t bits_at = 0, bits_bytes = 0, additive_at = 0, additive_bytes = 0, inputs_bytes = 0;
    std::uint64_t out_bytes = 0, weights_bytes = 0, state_bytes = 0;
};

void fits_u32(const char* what, std::uint64_t count, const std::string& device) {
    if (count >= (std::uint64_t{1} << 32))
        throw limit_exceeded(std::string("sdpa: ") + what + " has " + std::to_string(count) +
                             " elements; the kernels on " + device +
                             " index at most 2^32 - 1 (split the batch or the heads into several calls)");
}

void fits_range(const char* what, std::uint64_t bytes, const device_info& info) {
    if (bytes > info.max_storage_buffer_range)
        throw limit_exceeded(std::string("sdpa: ") + what + " needs " + std::to_string(bytes) +
                             " bytes in one binding, more than maxStorageBufferRange (" +
                             std::to_string(info.max_storage_buffer_range) + ") of " + info.name +
                             "; split the batch or the heads into several calls");
}

sdpa_plan make_sdpa_plan(const sdpa_problem& problem, const device& dev) {
    const device_info& info = dev.info();
    const sdpa_shape& s = problem.shape;
    const sdpa_options& opt = problem.options;
    sdpa_plan p;
    // Every count below the kernels' 32-bit indices (they also bound each dimension).
    p.q_count = std::uint64_t{s.batch} * s.q_heads * s.q_len * s.d_qk;
    p.k_count = std::uint64_t{s.batch} * s.kv_heads * s.kv_len * s.d_qk;
    p.v_count = std::uint64_t{s.batch} * s.kv_heads * s.kv_len * s.d_v;
    p.out_count = std::uint64_t{s.batch} * s.q_heads * s.q_len * s.d_v;
    p.weights_count = opt.return_weights ? std::uint64_t{s.batch} * s.q_heads * s.q_len * s.kv_len : 0;
    const bool has_mask = !problem.mask.empty(), has_additive = !problem.additive_mask.empty();
    p.mask_count = has_mask ? problem.mask.size() : has_additive ? problem.additive_mask.size() : 0;
    fits_u32("q", p.q_count, info.name);
    fits_u32("k", p.k_count, info.name);
    fits_u32("v", p.v_count, info.name);
    fits_u32("the output", p.out_count, info.name);
    fits_u32("the weights", p.weights_count, info.name);
    fits_u32("the mask", p.mask_count, info.name);
    fits_u32("the softmax statistics", 2 * std::uint64_t{s.batch} * s.q_heads * s.q_len, info.name);
    if (s.q_len > 0x7fffffffu || s.kv_len > 0x7fffffffu)
        throw limit_exceeded("sdpa: q_len and kv_len must be below 2^31 on the device");
    if (s.d_qk > fused_max_head || s.d_v > fused_max_head)
        throw limit_exceeded("sdpa: the fused kernels take head widths up to " + std::to_string(fused_max_head) +
                             " (d_qk = " + std::to_string(s.d_qk) + ", d_v = " + std::to_string(s.d_v) +
                             "); use the cpu backend for wider heads");
    if (dev.limits().maxPushConstantsSize < sizeof(contract::flash_push))
        throw limit_exceeded("sdpa: the fused kernels push " + std::to_string(sizeof(contract::flash_push)) +
                             " bytes of constants; " + info.name + " takes " +
                             std::to_string(dev.limits().maxPushConstantsSize));
    const bool fp16 = opt.precision == precision::fp16;
    if (fp16 && !info.fp16_storage)
        throw unavailable("sdpa: fp16 precision needs 16-bit storage buffers (storageBuffer16BitAccess), which " +
                          info.name + " does not offer; use fp32");

    const std::uint64_t align = std::max<std::uint64_t>(dev.limits().minStorageBufferOffsetAlignment, 16);
    p.element_bytes = fp16 ? 2 : 4;
    p.k_at = align_up(p.q_count * p.element_bytes, 16);
    p.v_at = align_up(p.k_at + p.k_count * p.element_bytes, 16);
    p.qkv_bytes = p.v_at + p.v_count * p.element_bytes;
    fits_range("q, k and v together", p.qkv_bytes, info);
    fits_u32("q, k and v together", p.qkv_bytes / p.element_bytes, info.name);
    p.bits_at = align_up(p.qkv_bytes, align);
    p.bits_bytes = has_mask ? (p.mask_count + 31) / 32 * 4 : 0;
    p.additive_at = align_up(p.bits_at + p.bits_bytes, align);
    p.additive_bytes = has_additive ? p.mask_count * 4 : 0;
    fits_range("the additive mask", p.additive_bytes, info);
    p.inputs_bytes = p.additive_at + p.additive_bytes;
    p.out_bytes = p.out_count * 4;
    p.weights_bytes = p.weights_count * 4;
    fits_range("the output", p.out_bytes, info);
    fits_range("the weights", p.weights_bytes, info);

    flash_layout& l = p.layout;
    const auto u32 = [](std::uint64_t v) { return static_cast<std::uint32_t>(v); };
    l.batch = u32(s.batch), l.heads = u32(s.q_heads), l.kv_heads = u32(s.kv_heads);
    l.q_len = u32(s.q_len), l.kv_len = u32(s.kv_len), l.d = u32(s.d_qk), l.dv = u32(s.d_v);
    l.q = {u32(s.q_heads * s.q_len * s.d_qk), u32(s.q_len * s.d_qk), u32(s.d_qk)};
    l.k = {u32(s.kv_heads * s.kv_len * s.d_qk), u32(s.kv_len * s.d_qk), u32(s.d_qk)};
    l.v = {u32(s.kv_heads * s.kv_len * s.d_v), u32(s.kv_len * s.d_v), u32(s.d_v)};
    l.o = {u32(s.q_heads * s.q_len * s.d_v), u32(s.q_len * s.d_v), u32(s.d_v)};
    l.k_off = u32(p.k_at / p.element_bytes), l.v_off = u32(p.v_at / p.element_bytes);
    if (has_mask || has_additive) {
        const mask_strides m = broadcast_strides(problem.mask_shape, s);
        l.m_bs = u32(m.batch), l.m_hs = u32(m.head), l.m_rs = u32(m.row), l.m_cs = u32(m.col);
        l.a_bs = l.m_bs;
    }
    l.mask = has_mask, l.additive = has_additive;
    l.causal = opt.causal;
    const std::ptrdiff_t offset = causal_offset(s, opt.alignment);
    if (offset > std::numeric_limits<std::int32_t>::max() || offset < std::numeric_limits<std::int32_t>::min())
        throw limit_exceeded("sdpa: the causal offset kv_len - q_len does not fit 32 bits");
    l.causal_offset = static_cast<std::int32_t>(offset);
    l.scale = opt.scale ? *opt.scale : default_scale(s);
    l.fp16 = fp16;
    return p;
}

/// IEEE binary16 of `x`, rounded to nearest even; throws numeric_overflow for a finite value
/// beyond its range (65504), as the attention path's range guard does for fp16.
std::uint16_t to_half(float x, const char* what, std::size_t index) {
    const std::uint32_t f = std::bit_cast<std::uint32_t>(x);
    const std::uint32_t sign = (f >> 16) & 0x8000u;
    const std::uint32_t abs = f & 0x7fffffffu;
    if (abs >= 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
    if (abs >= 0x477ff000u)  // rounds to 65536 or more
        throw numeric_overflow(std::string("sdpa: ") + what + "[" + std::to_string(index) + "] = " + std::to_string(x) +
                               " is beyond float16's range (65504); use fp32 precision");
    if (abs < 0x38800000u) {  // a subnormal half (or zero)
        if (abs < 0x33000000u) return static_cast<std::uint16_t>(sign);
        const std::uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
        const int shift = 126 - static_cast<int>(abs >> 23);  // 14..24
        std::uint32_t h = mant >> shift;
        const std::uint32_t rest = mant & ((1u << shift) - 1), half_way = 1u << (shift - 1);
        if (rest > half_way || (rest == half_way && (h & 1u))) ++h;
        return static_cast<std::uint16_t>(sign | h);
    }
    std::uint32_t h = ((abs >> 13) - (112u << 10));
    const std::uint32_t rest = abs & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
    return static_cast<std::uint16_t>(sign | h);
}

void put_tensor(std::byte* at, std::span<const float> data, bool fp16, const char* what) {
    if (!fp16) {
        if (!data.empty()) std::memcpy(at, data.data(), data.size_bytes());
        return;
    }
    auto* h = reinterpret_cast<std::uint16_t*>(at);
    for (std::size_t i = 0; i < data.size(); ++i) h[i] = to_half(data[i], what, i);
}

void pack_sdpa_inputs(std::byte* base, const sdpa_plan& p, const sdpa_problem& problem) {
    const bool fp16 = p.layout.fp16;
    put_tensor(base, problem.q, fp16, "q");
    put_tensor(base + p.k_at, problem.k, fp16, "k");
    put_tensor(base + p.v_at, problem.v, fp16, "v");
    if (p.bits_bytes) {
        auto* bits = reinterpret_cast<std::uint32_t*>(base + p.bits_at);
        std::fill(bits, bits + p.bits_bytes / 4, 0u);
        for (std::size_t i = 0; i < problem.mask.size(); ++i)
            if (problem.mask[i]) bits[i / 32] |= 1u << (i % 32);
    }
    if (p.additive_bytes) std::memcpy(base + p.additive_at, problem.additive_mask.data(), p.additive_bytes);
}

void ensure(allocator& alloc, buffer& b, std::uint64_t need, memory_use use, const char* what,
            VkBufferUsageFlags extra_usage = 0) {
    need = std::max<std::uint64_t>(need, 4);
    if (b && b.size() >= need && b.size() <= 2 * need) return;
    b.reset();
    b = alloc.create((need + 4095) / 4096 * 4096, use, what, extra_usage);
}

binding part(const buffer& b, std::uint64_t offset, std::uint64_t size) { return {b.handle(), offset, size}; }

/// The family that runs (as for attention, see dispatch.cpp): a forced family, or cpu on CPU
/// devices where it can run there, gpu elsewhere.
kernel_family choose_sdpa_family(kernel_family asked, const device& dev, const flash_cpu_plan& cpu_plan) {
    if (asked == kernel_family::gpu) return kernel_family::gpu;
    if (asked == kernel_family::automatic && dev.info().type != device_type::cpu) return kernel_family::gpu;
    const flash_cpu_refusal no = check_flash_cpu(dev, cpu_plan);
    if (no.why.empty()) return kernel_family::cpu;
    if (asked == kernel_family::automatic) return kernel_family::gpu;
    if (no.limit) throw limit_exceeded("sdpa: " + no.why);
    throw unavailable("sdpa: " + no.why);
}

/// The fused kernel that runs a call: its family and that family's plan (key chunks, tiles), and
/// whether the row statistics must be kept (key chunks, or the weights on request).
struct sdpa_kernels {
    kernel_family family = kernel_family::gpu;
    flash_cpu_plan cpu;
    flash_gpu_plan gpu;
    bool weights = false;
    bool need_state = false;
    std::uint64_t state_bytes = 0;
    [[nodiscard]] bool cpu_family() const { return family == kernel_family::cpu; }
};

sdpa_kernels choose_sdpa_kernels(const dispatch_environment& env, const sdpa_plan& p, const sdpa_problem& problem) {
    const device_info& info = env.dev.info();
    const flash_layout& l = p.layout;
    const kernel_family asked = env.fused_tiles_as && problem.options.kernel == kernel_family::automatic
                                    ? kernel_family::gpu  // the GPU-tile test hook is for the gpu family
                                    : problem.options.kernel;
    sdpa_kernels k;
    k.cpu = plan_flash_cpu(env.dev, l, env.max_fused_keys);
    k.family = choose_sdpa_family(asked, env.dev, k.cpu);
    if (!k.cpu_family()) k.gpu = plan_flash_gpu(env.dev, l, env.max_fused_keys, env.fused_tiles_as);
    const std::uint32_t chunk = k.cpu_family() ? k.cpu.chunk_keys : k.gpu.chunk_keys;
    const std::uint32_t dispatches = k.cpu_family() ? k.cpu.dispatches(l.kv_len) : k.gpu.dispatches(l.kv_len);
    if (dispatches > 1000)
        throw limit_exceeded("sdpa: the fused kernel would need " + std::to_string(dispatches) + " dispatches of " +
                             std::to_string(chunk) + " keys each for kv_len = " + std::to_string(l.kv_len) + " on " +
                             info.name + " (at most 1000 per call)");
    k.weights = p.weights_bytes > 0;
    k.need_state = chunk < l.kv_len || k.weights;
    k.state_bytes = k.need_state ? 8 * std::uint64_t{l.q_batches()} * l.q_len : 0;
    fits_range("the softmax statistics", k.state_bytes, info);
    if (!l.output_contiguous_per_batch()) throw error("sdpa: internal: the output layout is not (B, H, L, Ev)");
    return k;
}

/// The context's buffers (reused between calls of similar size) sized for this call; returns
/// whether the inputs and outputs go through staging buffers.
bool ensure_sdpa_buffers(dispatch_environment& env, const sdpa_plan& p, const sdpa_kernels& k) {
    buffer_cache& bufs = env.buffers;
    try {
        ensure(env.alloc, bufs.inputs, p.inputs_bytes, memory_use::device, "sdpa inputs");
        ensure(env.alloc, bufs.out, p.out_bytes, memory_use::device, "sdpa output");
        if (k.weights) ensure(env.alloc, bufs.scores, p.weights_bytes, memory_use::device, "sdpa weights");
        if (k.need_state)
            ensure(env.alloc, bufs.flash_state, k.state_bytes, memory_use::device, "fused-attention state");
        else
            bufs.flash_state.reset();
        bufs.flash_views = {};
        if (k.cpu_family())
            ensure(env.alloc, bufs.flash_texels, k.cpu.bytes, memory_use::device, "fused-attention texels",
                   VK_BUFFER_USAGE_UNIFORM_TEXEL_BUFFER_BIT);
        else
            bufs.flash_texels.reset();
        const bool staged_io =
            env.force_staging || !bufs.inputs.mapped() || !bufs.out.mapped() || (k.weights && !bufs.scores.mapped());
        if (staged_io) {
            ensure(env.alloc, bufs.staging_in, p.inputs_bytes, memory_use::upload, "upload staging");
            ensure(env.alloc, bufs.staging_out, p.out_bytes + p.weights_bytes, memory_use::readback,
                   "readback staging");
        } else {
            bufs.staging_in.reset();
            bufs.staging_out.reset();
        }
        return staged_io;
    } catch (const out_of_memory&) {
        bufs = buffer_cache{};
        throw;
    }
}

/// Writes the inputs where the device (or the upload staging buffer) reads them.
void write_sdpa_inputs(buffer_cache& bufs, const sdpa_plan& p, const sdpa_problem& problem, bool staged_io) {
    const buffer& upload = staged_io ? bufs.staging_in : bufs.inputs;
    pack_sdpa_inputs(upload.mapped(), p, problem);
    upload.flush();
}

void record_sdpa_upload(executor& exec, const buffer_cache& bufs, const sdpa_plan& p, bool staged_io) {
    if (!staged_io) return;
    exec.copy(bufs.staging_in.handle(), 0, bufs.inputs.handle(), 0, p.inputs_bytes);
    exec.barrier(VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                 VK_ACCESS_SHADER_READ_BIT);
}

/// The kernels' bindings: parts of the inputs buffer, the output and the row statistics (unused
/// ones bound to Q|K|V).
flash_io bind_sdpa(const buffer_cache& bufs, const sdpa_plan& p, const sdpa_kernels& k) {
    const binding qkv = part(bufs.inputs, 0, p.qkv_bytes);
    flash_io io;
    io.qkv = qkv;
    io.mask_bits = p.bits_bytes ? part(bufs.inputs, p.bits_at, p.bits_bytes) : qkv;
    io.additive = p.additive_bytes ? part(bufs.inputs, p.additive_at, p.additive_bytes) : qkv;
    io.out = part(bufs.out, 0, p.out_bytes);
    io.state = k.need_state ? part(bufs.flash_state, 0, k.state_bytes) : qkv;
    return io;
}

/// The chosen fused kernel, then the weights kernel on request.
void record_sdpa_kernels(dispatch_environment& env, const sdpa_plan& p, const sdpa_kernels& k, const flash_io& io) {
    buffer_cache& bufs = env.buffers;
    const flash_layout& l = p.layout;
    if (k.cpu_family()) {
        bufs.flash_views = make_flash_cpu_views(env.dev, bufs.flash_texels, k.cpu);
        const flash_cpu_texels tx{bufs.flash_texels.handle(), bufs.flash_views.q.handle(), bufs.flash_views.k.handle(),
                                  bufs.flash_views.v.handle()};
        record_flash_cpu(env.exec, env.pipes, l, k.cpu, io, tx, k.weights);
    } else {
        record_flash_gpu(env.exec, env.pipes, l, k.gpu, io, k.weights);
    }
    if (k.weights) {
        env.exec.compute_barrier();
        record_flash_weights(env.exec, env.pipes, l, io, part(bufs.scores, 0, p.weights_bytes));
    }
}

void record_sdpa_download(executor& exec, const buffer_cache& bufs, const sdpa_plan& p, bool weights, bool staged_io) {
    if (staged_io) {
        exec.barrier(VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT,
                     VK_ACCESS_TRANSFER_READ_BIT);
        exec.copy(bufs.out.handle(), 0, bufs.staging_out.handle(), 0, p.out_bytes);
        if (weights) exec.copy(bufs.scores.handle(), 0, bufs.staging_out.handle(), p.out_bytes, p.weights_bytes);
        exec.barrier(VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT, VK_PIPELINE_STAGE_HOST_BIT,
                     VK_ACCESS_HOST_READ_BIT);
    } else {
        exec.barrier(VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_HOST_BIT,
                     VK_ACCESS_HOST_READ_BIT);
    }
}

/// The output (and the weights) read back into the result.
sdpa_output assemble_sdpa(const buffer_cache& bufs, const sdpa_plan& p, const sdpa_problem& problem,
                          const sdpa_kernels& k, const device_info& info, bool staged_io) {
    sdpa_output result;
    result.shape = problem.shape;
    result.kernel = k.family;
    result.device = info.name;
    result.output.resize(p.out_count);
    if (k.weights) result.weights.resize(p.weights_count);
    if (staged_io) {
        bufs.staging_out.invalidate();
        std::memcpy(result.output.data(), bufs.staging_out.mapped(), p.out_bytes);
        if (k.weights) std::memcpy(result.weights.data(), bufs.staging_out.mapped() + p.out_bytes, p.weights_bytes);
    } else {
        bufs.out.invalidate();
        std::memcpy(result.output.data(), bufs.out.mapped(), p.out_bytes);
        if (k.weights) {
            bufs.scores.invalidate();
            std::memcpy(result.weights.data(), bufs.scores.mapped(), p.weights_bytes);
        }
    }
    return result;
}

}  // namespace

sdpa_run run_sdpa(dispatch_environment& env, const sdpa_problem& problem) {
    const sdpa_plan p = make_sdpa_plan(problem, env.dev);
    const sdpa_kernels k = choose_sdpa_kernels(env, p, problem);
    const bool staged_io = ensure_sdpa_buffers(env, p, k);
    write_sdpa_inputs(env.buffers, p, problem, staged_io);
    executor& exec = env.exec;
    exec.begin();
    record_sdpa_upload(exec, env.buffers, p, staged_io);
    exec.mark();  // inputs on the device
    record_sdpa_kernels(env, p, k, bind_sdpa(env.buffers, p, k));
    exec.mark();  // attention done
    record_sdpa_download(exec, env.buffers, p, k.weights, staged_io);

    sdpa_run run;
    run.device_ms = exec.submit_and_wait();
    if (const std::vector<double>& m = exec.marks_ms(); m.size() >= 2) run.attention_ms = m[1] - m[0];
    run.output = assemble_sdpa(env.buffers, p, problem, k, env.dev.info(), staged_io);
    return run;
}

}  // namespace qkv::vulkan::detail
