// qkv::vulkan::kv_cache (K and V resident on the device) and context::sdpa over it, which runs
// the split-S decode kernels (src/kernels/sdpa_decode.cpp).
#include "qkv/vulkan/kv_cache.hpp"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "api/context_impl.hpp"
#include "kernels/sdpa_decode.hpp"

namespace qkv::vulkan {

using namespace detail;

namespace {

std::string dims(std::initializer_list<std::size_t> d) {
    std::string s = "(";
    bool first = true;
    for (std::size_t x : d) s += (first ? "" : ", ") + std::to_string(x), first = false;
    return s + ")";
}

std::size_t product(std::initializer_list<std::size_t> d, const char* what) {
    std::size_t p = 1;
    for (std::size_t x : d) {
        if (x != 0 && p > SIZE_MAX / x) throw qkv::invalid_argument(std::string(what) + ": the size overflows");
        p *= x;
    }
    return p;
}

/// float32 to float16 bits, rounding to nearest even (overflow to inf, NaN kept NaN).
std::uint16_t to_half(float value) {
    const std::uint32_t x = std::bit_cast<std::uint32_t>(value);
    const std::uint32_t sign = (x >> 16) & 0x8000u;
    const std::uint32_t abs = x & 0x7fffffffu;
    if (abs >= 0x7f800000u) return static_cast<std::uint16_t>(sign | (abs > 0x7f800000u ? 0x7e00u : 0x7c00u));
    if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
    if (abs < 0x38800000u) {                                                    // subnormal half (or zero)
        if (abs < 0x33000000u) return static_cast<std::uint16_t>(sign);         // below half the smallest
        const std::uint32_t e = abs >> 23;
        const std::uint32_t m = (abs & 0x7fffffu) | 0x800000u;
        const std::uint32_t shift = 126u - e;  // 14 + (112 - e) + 1 ... so that the result is m >> (126 - e)
        std::uint32_t h = m >> shift;
        const std::uint32_t rest = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
        if (rest > half || (rest == half && (h & 1u))) ++h;
        return static_cast<std::uint16_t>(sign | h);
    }
    std::uint32_t h = ((abs - 0x38000000u) >> 13);  // rebias exponent 127 -> 15
    const std::uint32_t rest = abs & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
    return static_cast<std::uint16_t>(sign | h);
}

/// Writes `rows` rows of `width` floats as texels of 4 (zero-padded) in fp32 or fp16 at `dst`.
void write_texels(std::byte* dst, const float* src, std::size_t rows, std::size_t width, std::size_t texels,
                  bool half) {
    if (!half) {
        auto* d = reinterpret_cast<float*>(dst);
        for (std::size_t r = 0; r < rows; ++r) {
            float* row = d + r * texels * 4;
            std::memcpy(row, src + r * width, width * 4);
            std::fill(row + width, row + texels * 4, 0.0f);
        }
    } else {
        auto* d = reinterpret_cast<std::uint16_t*>(dst);
        for (std::size_t r = 0; r < rows; ++r) {
            std::uint16_t* row = d + r * texels * 4;
            for (std::size_t c = 0; c < width; ++c) row[c] = to_half(src[r * width + c]);
            std::fill(row + width, row + texels * 4, std::uint16_t{0});
        }
    }
}

void ensure(allocator& alloc, buffer& b, std::uint64_t need, memory_use use, const char* what,
            VkBufferUsageFlags extra = 0) {
    need = std::max<std::uint64_t>(need, 16);
    if (b && b.size() >= need && b.size() <= 4 * need) return;
    b.reset();
    b = alloc.create((need + 4095) / 4096 * 4096, use, what, extra);
}

}  // namespace

struct kv_cache::impl {
    context::impl* ctx = nullptr;
    kv_cache_shape shape{};
    std::size_t size = 0;
    std::uint32_t e4 = 0, ev4 = 0;
    VkFormat format = VK_FORMAT_R32G32B32A32_SFLOAT;
    std::uint64_t texel_bytes = 16;
    buffer k, v;
    buffer_view k_view, v_view;
    // Scratch of the decode calls, kept between them: Q texels, masks, partial states, output,
    // staging where device memory is not mapped.
    buffer q, masks, stats, acc, out, staging_in, staging_out;

    [[nodiscard]] std::size_t groups() const { return shape.batch * shape.kv_heads; }
    [[nodiscard]] bool mapped_io() const { return !ctx->options.force_staging && k.mapped() && v.mapped(); }
};

kv_cache::kv_cache(context& ctx, const kv_cache_shape& shape) : impl_(std::make_unique<impl>()) {
    impl& c = *impl_;
    c.ctx = ctx.impl_.get();
    c.shape = shape;
    auto positive = [](const char* what, std::size_t v) {
        if (v == 0) throw qkv::invalid_argument(std::string("kv_cache: ") + what + " must be at least 1");
    };
    positive("batch", shape.batch);
    positive("kv_heads", shape.kv_heads);
    positive("capacity", shape.capacity);
    positive("d_qk", shape.d_qk);
    positive("d_v", shape.d_v);
    if (shape.precision != precision::fp32 && shape.precision != precision::fp16)
        throw qkv::invalid_argument("kv_cache: unknown precision (" +
                                    std::to_string(static_cast<int>(shape.precision)) + ")");
    const bool half = shape.precision == precision::fp16;
    c.format = half ? VK_FORMAT_R16G16B16A16_SFLOAT : VK_FORMAT_R32G32B32A32_SFLOAT;
    c.texel_bytes = half ? 8 : 16;
    c.e4 = static_cast<std::uint32_t>(std::min<std::size_t>((shape.d_qk + 3) / 4, 0xffffffu));
    c.ev4 = static_cast<std::uint32_t>(std::min<std::size_t>((shape.d_v + 3) / 4, 0xffffffu));

    std::lock_guard lock(c.ctx->mutex);
    const device& dev = *c.ctx->dev;
    const std::string name = dev.info().name;
    if (!dev.uniform_texel_format(c.format))
        throw unavailable(std::string("kv_cache: ") + name + " cannot read " +
                          (half ? "R16G16B16A16_SFLOAT" : "R32G32B32A32_SFLOAT") + " uniform texel buffers");
    const std::size_t k_texels =
        product({shape.batch, shape.kv_heads, shape.capacity, std::size_t{c.e4}}, "kv_cache K");
    const std::size_t v_texels =
        product({shape.batch, shape.kv_heads, shape.capacity, std::size_t{c.ev4}}, "kv_cache V");
    const std::uint64_t max_texels = dev.limits().maxTexelBufferElements;
    const std::uint64_t max_bytes = dev.info().max_storage_buffer_range;
    for (const auto& [what, texels] : {std::pair{"K", k_texels}, std::pair{"V", v_texels}}) {
        if (texels > max_texels || texels > 0x7fffffffu)
            throw limit_exceeded(
                std::string("kv_cache: ") + what + " of shape " +
                dims({shape.batch, shape.kv_heads, shape.capacity, what[0] == 'K' ? shape.d_qk : shape.d_v}) +
                " needs " + std::to_string(texels) + " texels, more than " + name + "'s maxTexelBufferElements of " +
                std::to_string(max_texels) + "; use a smaller capacity or batch");
        if (texels * c.texel_bytes > max_bytes)
            throw limit_exceeded(std::string("kv_cache: ") + what + " needs " + std::to_string(texels * c.texel_bytes) +
                                 " bytes, more than " + name + "'s maxStorageBufferRange of " +
                                 std::to_string(max_bytes));
    }
    try {
        c.k = c.ctx->alloc->create(k_texels * c.texel_bytes, memory_use::device, "K/V cache (K)",
                                   VK_BUFFER_USAGE_UNIFORM_TEXEL_BUFFER_BIT);
        c.v = c.ctx->alloc->create(v_texels * c.texel_bytes, memory_use::device, "K/V cache (V)",
                                   VK_BUFFER_USAGE_UNIFORM_TEXEL_BUFFER_BIT);
        c.k_view = buffer_view(dev, c.k, c.format, 0, k_texels * c.texel_bytes);
        c.v_view = buffer_view(dev, c.v, c.format, 0, v_texels * c.texel_bytes);
    } catch (...) {
        c.k_view.reset(), c.v_view.reset(), c.k.reset(), c.v.reset();
        throw;
    }
}

kv_cache::~kv_cache() {
    if (!impl_) return;
    std::lock_guard lock(impl_->ctx->mutex);
    impl_.reset();
}
kv_cache::kv_cache(kv_cache&&) noexcept = default;
kv_cache& kv_cache::operator=(kv_cache&& other) noexcept {
    if (this != &other) {
        if (impl_) {
            std::lock_guard lock(impl_->ctx->mutex);
            impl_.reset();
        }
        impl_ = std::move(other.impl_);
    }
    return *this;
}

std::size_t kv_cache::size() const { return impl_->size; }
std::size_t kv_cache::capacity() const { return impl_->shape.capacity; }
const kv_cache_shape& kv_cache::shape() const { return impl_->shape; }
void kv_cache::clear() { impl_->size = 0; }

void kv_cache::append(std::span<const float> k, std::span<const float> v, std::size_t rows) {
    impl& c = *impl_;
    const kv_cache_shape& s = c.shape;
    const std::size_t want_k = product({s.batch, s.kv_heads, rows, s.d_qk}, "kv_cache::append k");
    const std::size_t want_v = product({s.batch, s.kv_heads, rows, s.d_v}, "kv_cache::append v");
    if (k.size() != want_k)
        throw qkv::invalid_argument("kv_cache::append: k has " + std::to_string(k.size()) +
                                    " elements, expected (batch, kv_heads, rows, d_qk) = " +
                                    dims({s.batch, s.kv_heads, rows, s.d_qk}) + " = " + std::to_string(want_k));
    if (v.size() != want_v)
        throw qkv::invalid_argument("kv_cache::append: v has " + std::to_string(v.size()) +
                                    " elements, expected (batch, kv_heads, rows, d_v) = " +
                                    dims({s.batch, s.kv_heads, rows, s.d_v}) + " = " + std::to_string(want_v));
    if (rows > s.capacity - c.size)
        throw limit_exceeded("kv_cache::append: " + std::to_string(rows) + " rows do not fit: the cache holds " +
                             std::to_string(c.size) + " of its capacity of " + std::to_string(s.capacity) +
                             " rows; nothing was appended");
    if (rows == 0) return;
    const bool half = s.precision == precision::fp16;
    if (half)  // a finite value that float16 cannot hold would become inf: refuse, never silently wrong
        for (const auto& [what, data] : {std::pair{"k", k}, std::pair{"v", v}})
            for (std::size_t i = 0; i < data.size(); ++i)
                if (std::isfinite(data[i]) && std::fabs(data[i]) >= 65520.0f)
                    throw numeric_overflow(std::string("kv_cache::append: ") + what + " element " + std::to_string(i) +
                                           " (" + std::to_string(data[i]) +
                                           ") is beyond float16's range (65504) of this fp16 cache; nothing was "
                                           "appended; use an fp32 cache or scale the inputs");
    std::lock_guard lock(c.ctx->mutex);
    c.ctx->check_alive();
    const std::uint64_t tb = c.texel_bytes;
    const std::size_t groups = c.groups();
    try {
        if (c.mapped_io()) {
            // The device is idle between calls (every call waits for its work), so the new rows
            // can be written in place.
            for (std::size_t z = 0; z < groups; ++z) {
                write_texels(c.k.mapped() + (z * s.capacity + c.size) * c.e4 * tb, k.data() + z * rows * s.d_qk, rows,
                             s.d_qk, c.e4, half);
                write_texels(c.v.mapped() + (z * s.capacity + c.size) * c.ev4 * tb, v.data() + z * rows * s.d_v, rows,
                             s.d_v, c.ev4, half);
            }
            c.k.flush();
            c.v.flush();
        } else {
            // Staged: the new rows of every (batch, kv head) side by side, copied into place.
            const std::uint64_t k_bytes = std::uint64_t{rows} * c.e4 * tb, v_bytes = std::uint64_t{rows} * c.ev4 * tb;
            ensure(*c.ctx->alloc, c.staging_in, groups * (k_bytes + v_bytes), memory_use::upload,
                   "K/V cache upload staging");
            for (std::size_t z = 0; z < groups; ++z) {
                write_texels(c.staging_in.mapped() + z * k_bytes, k.data() + z * rows * s.d_qk, rows, s.d_qk, c.e4,
                             half);
                write_texels(c.staging_in.mapped() + groups * k_bytes + z * v_bytes, v.data() + z * rows * s.d_v, rows,
                             s.d_v, c.ev4, half);
            }
            c.staging_in.flush();
            executor& exec = *c.ctx->exec;
            exec.begin();
            for (std::size_t z = 0; z < groups; ++z) {
                exec.copy(c.staging_in.handle(), z * k_bytes, c.k.handle(), (z * s.capacity + c.size) * c.e4 * tb,
                          k_bytes);
                exec.copy(c.staging_in.handle(), groups * k_bytes + z * v_bytes, c.v.handle(),
                          (z * s.capacity + c.size) * c.ev4 * tb, v_bytes);
            }
            exec.barrier(VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT,
                         VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_READ_BIT);
            (void)exec.submit_and_wait();
        }
    } catch (const device_lost&) {
        c.ctx->lost = true;
        throw;
    } catch (const std::bad_alloc&) {
        throw out_of_memory("host memory allocation failed while appending to a kv_cache");
    }
    c.size += rows;
}

namespace {

/// The checks of context::sdpa(problem, cache) before any work (qkv::invalid_argument).
sdpa_problem checked_decode_problem(const sdpa_problem& given, const kv_cache& cache) {
    const kv_cache_shape& cs = cache.shape();
    sdpa_problem p = given;
    sdpa_shape& s = p.shape;
    auto fail = [](const std::string& why) { throw qkv::invalid_argument("sdpa with a kv_cache: " + why); };
    if (!p.k.empty() || !p.v.empty()) fail("k and v come from the cache; leave problem.k and problem.v empty");
    if (cache.size() == 0) fail("the cache is empty; append keys and values first");
    if (s.kv_len == 0) s.kv_len = cache.size();
    if (s.kv_len != cache.size())
        fail("shape.kv_len is " + std::to_string(s.kv_len) + " but the cache holds " + std::to_string(cache.size()) +
             " rows (0 takes the cache's size)");
    if (s.batch != cs.batch || s.kv_heads != cs.kv_heads || s.d_qk != cs.d_qk || s.d_v != cs.d_v)
        fail("the problem's (batch, kv_heads, d_qk, d_v) = " + dims({s.batch, s.kv_heads, s.d_qk, s.d_v}) +
             " differ from the cache's " + dims({cs.batch, cs.kv_heads, cs.d_qk, cs.d_v}));
    if (p.options.return_weights) fail("return_weights is not available with a kv_cache");
    // The rest of validate()'s checks, for q and the masks (k and v are the cache's).
    if (s.q_heads == 0 || s.q_len == 0) fail("q_heads and q_len must be at least 1");
    if (s.q_heads % s.kv_heads != 0)
        fail("kv_heads (" + std::to_string(s.kv_heads) + ") must divide q_heads (" + std::to_string(s.q_heads) + ")");
    const std::size_t qn = product({s.batch, s.q_heads, s.q_len, s.d_qk}, "q");
    if (p.q.size() != qn)
        fail("q has " + std::to_string(p.q.size()) + " elements, expected (batch, q_heads, q_len, d_qk) = " +
             dims({s.batch, s.q_heads, s.q_len, s.d_qk}) + " = " + std::to_string(qn));
    (void)product({s.batch, s.q_heads, s.q_len, s.d_v}, "output");
    const bool has_mask = !p.mask.empty() || !p.additive_mask.empty();
    if (!has_mask && !p.mask_shape.empty()) fail("mask_shape given without a mask");
    if (has_mask) {
        (void)broadcast_strides(p.mask_shape, s);  // throws qkv::invalid_argument if it does not broadcast
        std::size_t want = 1;
        for (std::size_t d : p.mask_shape.empty() ? std::vector<std::size_t>{s.q_len, s.kv_len} : p.mask_shape)
            want *= d;
        for (const auto& [what, have] :
             {std::pair{"mask", p.mask.size()}, std::pair{"additive_mask", p.additive_mask.size()}})
            if (have != 0 && have != want)
                fail(std::string(what) + " has " + std::to_string(have) + " elements, expected " +
                     std::to_string(want) + " for its shape");
        for (std::size_t i = 0; i < p.mask.size(); ++i)
            if (p.mask[i] > 1) fail("mask values must be 0 or 1 (element " + std::to_string(i) + ")");
    }
    if (p.options.scale && !(std::isfinite(*p.options.scale) && *p.options.scale > 0))
        fail("scale must be finite and positive");
    if (p.options.alignment != causal_alignment::top_left && p.options.alignment != causal_alignment::bottom_right)
        fail("unknown causal alignment");
    if (p.options.kernel != kernel_family::automatic && p.options.kernel != kernel_family::cpu &&
        p.options.kernel != kernel_family::gpu)
        fail("unknown kernel family");
    return p;
}

}  // namespace

sdpa_output context::sdpa(const sdpa_problem& given, const kv_cache& cache) {
    if (cache.impl_->ctx != impl_.get())
        throw qkv::invalid_argument("sdpa with a kv_cache: the cache was created from another context");
    const sdpa_problem problem = checked_decode_problem(given, cache);
    const sdpa_shape& s = problem.shape;
    const auto start = std::chrono::steady_clock::now();
    std::lock_guard lock(impl_->mutex);
    impl_->check_alive();
    kv_cache::impl& c = *cache.impl_;
    const detail::device& dev = *impl_->dev;
    allocator& alloc = *impl_->alloc;
    try {
        decode_request req;
        req.shape = s;
        req.kv_stride = static_cast<std::uint32_t>(std::min<std::size_t>(c.shape.capacity, 0xffffffffu));
        req.masks = (problem.options.causal ? contract::MASK_FLAG_CAUSAL : 0u) |
                    (problem.mask.empty() ? 0u : contract::MASK_FLAG_BOOLEAN) |
                    (problem.additive_mask.empty() ? 0u : contract::MASK_FLAG_ADDITIVE);
        req.kernel = problem.options.kernel;
        req.max_chunks = impl_->options.max_decode_chunks;
        device_info plan_info = dev.info();
        if (impl_->options.fused_tiles_as)  // the test hook: plan as for that device (within this one)
            plan_info.subgroup_arithmetic =
                plan_info.subgroup_arithmetic && impl_->options.fused_tiles_as->subgroup_arithmetic;
        const decode_plan plan = plan_decode(plan_info, req);
        if (plan.q_texels() > dev.limits().maxTexelBufferElements)
            throw limit_exceeded("sdpa with a kv_cache: q needs " + std::to_string(plan.q_texels()) +
                                 " texels, more than " + dev.info().name + "'s maxTexelBufferElements of " +
                                 std::to_string(dev.limits().maxTexelBufferElements));
        const std::uint64_t limit = dev.info().max_storage_buffer_range;
        if (plan.acc_bytes() > limit || plan.out_bytes() > limit)
            throw limit_exceeded("sdpa with a kv_cache: the partial results need " + std::to_string(plan.acc_bytes()) +
                                 " bytes, more than " + dev.info().name + "'s maxStorageBufferRange of " +
                                 std::to_string(limit));

        // ---- buffers ----
        const std::uint64_t q_bytes = plan.q_texels() * 16;
        const std::size_t mask_elems = problem.mask.size(), add_elems = problem.additive_mask.size();
        const std::uint64_t mask_bytes = mask_elems * 4, add_bytes = add_elems * 4;
        const std::uint64_t align =
            std::max<std::uint64_t>({std::uint64_t{16}, dev.limits().minStorageBufferOffsetAlignment,
                                     dev.limits().minTexelBufferOffsetAlignment});
        const std::uint64_t mask_off = (q_bytes + align - 1) / align * align;
        const std::uint64_t add_off = (mask_off + mask_bytes + align - 1) / align * align;
        const std::uint64_t packed = add_off + add_bytes;
        const bool staged = !c.mapped_io();
        try {
            ensure(alloc, c.q, packed, memory_use::device, "decode inputs", VK_BUFFER_USAGE_UNIFORM_TEXEL_BUFFER_BIT);
            ensure(alloc, c.stats, plan.stats_bytes(), memory_use::device, "decode partial statistics");
            ensure(alloc, c.acc, plan.acc_bytes(), memory_use::device, "decode partial accumulators");
            ensure(alloc, c.out, plan.out_bytes(), memory_use::device, "decode output");
            if (staged || !c.q.mapped() || !c.out.mapped()) {
                ensure(alloc, c.staging_in, packed, memory_use::upload, "decode upload staging");
                ensure(alloc, c.staging_out, plan.out_bytes(), memory_use::readback, "decode readback staging");
            }
        } catch (const out_of_memory&) {
            c.q.reset(), c.stats.reset(), c.acc.reset(), c.out.reset(), c.staging_in.reset(), c.staging_out.reset();
            throw;
        }
        const bool staged_io = staged || !c.q.mapped() || !c.out.mapped();

        // ---- upload: Q rows as texels (row z·R + r is exactly q's row), the masks as words ----
        std::byte* up = staged_io ? c.staging_in.mapped() : c.q.mapped();
        write_texels(up, problem.q.data(), std::size_t{plan.groups} * plan.rows, s.d_qk, plan.e4, false);
        auto* mask_words = reinterpret_cast<std::uint32_t*>(up + mask_off);
        for (std::size_t i = 0; i < mask_elems; ++i) mask_words[i] = problem.mask[i];
        if (add_elems) std::memcpy(up + add_off, problem.additive_mask.data(), add_bytes);
        (staged_io ? c.staging_in : c.q).flush();

        const buffer_view q_view(dev, c.q, VK_FORMAT_R32G32B32A32_SFLOAT, 0, q_bytes);
        decode_io io;
        io.q = q_view.handle();
        io.k = c.k_view.handle();
        io.v = c.v_view.handle();
        io.mask = mask_elems ? binding{c.q.handle(), mask_off, mask_bytes} : binding{c.q.handle(), 0, 16};
        io.additive = add_elems ? binding{c.q.handle(), add_off, add_bytes} : binding{c.q.handle(), 0, 16};
        io.stats = binding{c.stats.handle(), 0, plan.stats_bytes()};
        io.acc = binding{c.acc.handle(), 0, plan.acc_bytes()};
        io.out = binding{c.out.handle(), 0, plan.out_bytes()};

        // ---- record, submit ----
        executor& exec = *impl_->exec;
        exec.begin();
        if (staged_io) {
            exec.copy(c.staging_in.handle(), 0, c.q.handle(), 0, packed);
            exec.barrier(VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT,
                         VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_READ_BIT);
        }
        exec.mark();
        record_decode(exec, *impl_->pipes, plan, io, decode_push_for(plan, problem));
        exec.mark();
        if (staged_io) {
            exec.barrier(VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT,
                         VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_READ_BIT);
            exec.copy(c.out.handle(), 0, c.staging_out.handle(), 0, plan.out_bytes());
            exec.barrier(VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT, VK_PIPELINE_STAGE_HOST_BIT,
                         VK_ACCESS_HOST_READ_BIT);
        } else {
            exec.barrier(VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_HOST_BIT,
                         VK_ACCESS_HOST_READ_BIT);
        }
        const double device_ms = exec.submit_and_wait();

        sdpa_output result;
        result.shape = s;
        result.kernel = plan.family;
        result.device = dev.info().name;
        result.output.resize(plan.out_bytes() / 4);
        const buffer& down = staged_io ? c.staging_out : c.out;
        down.invalidate();
        std::memcpy(result.output.data(), down.mapped(), plan.out_bytes());

        call_stats& last = impl_->last;
        last = {};
        last.host_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
        last.device_ms = device_ms;
        if (const std::vector<double>& m = exec.marks_ms(); m.size() >= 2) last.attention_ms = m[1] - m[0];
        last.device_bytes = alloc.allocated();
        return result;
    } catch (const device_lost&) {
        impl_->lost = true;
        throw;
    } catch (const std::bad_alloc&) {
        throw out_of_memory("host memory allocation failed while running sdpa with a kv_cache");
    }
}

namespace detail {

sdpa_output sdpa_through_cache(context& ctx, const sdpa_problem& problem) {
    const sdpa_shape& s = problem.shape;
    kv_cache cache(ctx, {.batch = s.batch,
                         .kv_heads = s.kv_heads,
                         .capacity = s.kv_len,
                         .d_qk = s.d_qk,
                         .d_v = s.d_v,
                         .precision = problem.options.precision});
    cache.append(problem.k, problem.v, s.kv_len);
    sdpa_problem p = problem;
    p.k = {};
    p.v = {};
    return ctx.sdpa(p, cache);
}

}  // namespace detail

}  // namespace qkv::vulkan
