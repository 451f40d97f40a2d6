// qkv::vulkan::kv_cache (K and V resident on the device), and context::sdpa over it: the decode
// route of the call skeleton (run_decode) with the cache's texel views as K and V.
#include "qkv/vulkan/kv_cache.hpp"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "api/call_io.hpp"
#include "api/context_impl.hpp"
#include "api/kv_storage.hpp"
#include "api/runs.hpp"
#include "api/sdpa_guard.hpp"
#include "api/sdpa_plan.hpp"
#include "runtime/float16.hpp"

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

}  // namespace

struct kv_cache::impl {
    std::shared_ptr<device_core> core;  // declared first: outlives the buffers below
    kv_cache_shape shape{};
    element_type type = element_type::f32;
    std::uint32_t e4 = 0, ev4 = 0;
    VkFormat format = VK_FORMAT_R32G32B32A32_SFLOAT;
    std::uint64_t texel_bytes = 16;
    std::uint64_t k_row_bytes = 0, v_row_bytes = 0;  // bytes of one row of K and of V
    // Guarded by core->mutex:
    std::size_t size = 0;
    kv_stats stats;  // what the overflow rule needs of the rows appended (sdpa_guard.hpp)
    buffer k, v;
    buffer_view k_view, v_view;
    buffer staging;  // the upload staging where device memory is not mapped

    impl() = default;
    impl(const impl&) = delete;
    impl& operator=(const impl&) = delete;
    ~impl() {
        if (!core) return;  // never attached to a device (the context was moved from)
        // The buffers go back to the shared device under its lock: a call may be using it.
        std::lock_guard lock(core->mutex);
        k_view.reset(), v_view.reset(), k.reset(), v.reset(), staging.reset();
    }

    [[nodiscard]] std::size_t groups() const { return shape.batch * shape.kv_heads; }
    [[nodiscard]] bool half() const { return type == element_type::f16; }
    [[nodiscard]] bool blocks() const { return is_quantized(type); }
};

namespace {

kv_cache::impl& alive(const std::unique_ptr<kv_cache::impl>& impl) {
    if (!impl) throw qkv::error("qkv::vulkan::kv_cache used after move: it holds no keys or values any more");
    return *impl;
}

}  // namespace

kv_cache::kv_cache(context& ctx, const kv_cache_shape& shape) {
    auto c = std::make_unique<impl>();
    c->core = alive(ctx.impl_).core;
    c->shape = shape;
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
    if (shape.kv_type && !is_known(*shape.kv_type))
        throw qkv::invalid_argument("kv_cache: unknown kv_type (" + std::to_string(static_cast<int>(*shape.kv_type)) +
                                    ")");
    c->type = shape.type();
    if (c->blocks() && (shape.d_qk % block_size(c->type) != 0 || shape.d_v % block_size(c->type) != 0))
        throw qkv::invalid_argument("kv_cache: kv_type " + std::string(to_string(c->type)) + " stores blocks of " +
                                    std::to_string(block_size(c->type)) + " values along each row: d_qk (" +
                                    std::to_string(shape.d_qk) + ") and d_v (" + std::to_string(shape.d_v) +
                                    ") must be multiples of " + std::to_string(block_size(c->type)));
    const bool half = c->half();
    c->format = half ? VK_FORMAT_R16G16B16A16_SFLOAT : VK_FORMAT_R32G32B32A32_SFLOAT;
    c->texel_bytes = half ? 8 : 16;
    c->e4 = static_cast<std::uint32_t>(std::min<std::size_t>((shape.d_qk + 3) / 4, 0xffffffu));
    c->ev4 = static_cast<std::uint32_t>(std::min<std::size_t>((shape.d_v + 3) / 4, 0xffffffu));
    c->k_row_bytes = c->blocks() ? bytes_for(c->type, shape.d_qk) : std::uint64_t{c->e4} * c->texel_bytes;
    c->v_row_bytes = c->blocks() ? bytes_for(c->type, shape.d_v) : std::uint64_t{c->ev4} * c->texel_bytes;
    c->stats.k_norm.assign(c->groups(), 0.0);

    device_core& core = *c->core;
    std::lock_guard lock(core.mutex);
    core.check_alive();
    const device& dev = *core.dev;
    const device_desc& desc = dev.desc();
    const std::string& name = desc.info.name;
    if (!c->blocks() && !desc.uniform_texels(half))
        throw unavailable(std::string("kv_cache: ") + name + " cannot read " +
                          (half ? "R16G16B16A16_SFLOAT" : "R32G32B32A32_SFLOAT") + " uniform texel buffers");
    if (half && !desc.info.fp16_storage)
        throw unavailable("kv_cache: an fp16 cache needs 16-bit storage buffers (storageBuffer16BitAccess), which " +
                          name + " does not offer; use an fp32 cache");
    if (shape.capacity > 0x7fffffffu)
        throw limit_exceeded("kv_cache: a capacity of " + std::to_string(shape.capacity) +
                             " rows is beyond the decode kernels' 2^31 keys");
    const std::size_t k_texels =
        product({shape.batch, shape.kv_heads, shape.capacity, std::size_t{c->e4}}, "kv_cache K");
    const std::size_t v_texels =
        product({shape.batch, shape.kv_heads, shape.capacity, std::size_t{c->ev4}}, "kv_cache V");
    const std::uint64_t max_texels = desc.max_texel_elements;
    const std::uint64_t max_bytes = desc.info.max_storage_buffer_range;
    const std::uint64_t k_total = std::uint64_t{product({shape.batch, shape.kv_heads, shape.capacity}, "kv_cache K")} *
                                  c->k_row_bytes;
    const std::uint64_t v_total = std::uint64_t{product({shape.batch, shape.kv_heads, shape.capacity}, "kv_cache V")} *
                                  c->v_row_bytes;
    for (const auto& [what, texels] : {std::pair{"K", k_texels}, std::pair{"V", v_texels}}) {
        if (c->blocks()) {  // rows of blocks in a storage buffer, addressed by 32-bit byte offsets
            const std::uint64_t bytes = what[0] == 'K' ? k_total : v_total;
            if (bytes > max_bytes)
                throw limit_exceeded(std::string("kv_cache: ") + what + " needs " + std::to_string(bytes) +
                                     " bytes of " + std::string(to_string(c->type)) + " blocks, more than " + name +
                                     "'s maxStorageBufferRange of " + std::to_string(max_bytes));
            continue;
        }
        if (texels > max_texels || texels > 0x7fffffffu)
            throw limit_exceeded(
                std::string("kv_cache: ") + what + " of shape " +
                dims({shape.batch, shape.kv_heads, shape.capacity, what[0] == 'K' ? shape.d_qk : shape.d_v}) +
                " needs " + std::to_string(texels) + " texels, more than " + name + "'s maxTexelBufferElements of " +
                std::to_string(max_texels) + "; use a smaller capacity or batch");
        if (texels * c->texel_bytes > max_bytes)
            throw limit_exceeded(std::string("kv_cache: ") + what + " needs " +
                                 std::to_string(texels * c->texel_bytes) + " bytes, more than " + name +
                                 "'s maxStorageBufferRange of " + std::to_string(max_bytes));
    }
    if (c->blocks()) {
        c->k = core.alloc->create(k_total, memory_use::device, "K/V cache (K blocks)");
        c->v = core.alloc->create(v_total, memory_use::device, "K/V cache (V blocks)");
    } else {
        c->k = core.alloc->create(k_texels * c->texel_bytes, memory_use::device, "K/V cache (K)",
                                  VK_BUFFER_USAGE_UNIFORM_TEXEL_BUFFER_BIT);
        c->v = core.alloc->create(v_texels * c->texel_bytes, memory_use::device, "K/V cache (V)",
                                  VK_BUFFER_USAGE_UNIFORM_TEXEL_BUFFER_BIT);
        c->k_view = buffer_view(dev, c->k, c->format, 0, k_texels * c->texel_bytes);
        c->v_view = buffer_view(dev, c->v, c->format, 0, v_texels * c->texel_bytes);
    }
    // (On a failure above the lock_guard, declared after `c`, is released first; then ~impl takes it.)
    impl_ = std::move(c);
}

kv_cache::~kv_cache() = default;
kv_cache::kv_cache(kv_cache&&) noexcept = default;
kv_cache& kv_cache::operator=(kv_cache&&) noexcept = default;

std::size_t kv_cache::size() const {
    impl& c = alive(impl_);
    std::lock_guard lock(c.core->mutex);
    return c.size;
}
std::size_t kv_cache::capacity() const { return alive(impl_).shape.capacity; }
const kv_cache_shape& kv_cache::shape() const { return alive(impl_).shape; }

void kv_cache::clear() {
    impl& c = alive(impl_);
    std::lock_guard lock(c.core->mutex);
    c.size = 0;
    c.stats = {};
    c.stats.k_norm.assign(c.groups(), 0.0);
}

void kv_cache::append(std::span<const float> k, std::span<const float> v, std::size_t rows) {
    impl& c = alive(impl_);
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
    const bool half = c.half();
    if (half)  // a finite value that float16 cannot hold would become inf: refuse, never silently wrong
        for (const auto& [what, data] : {std::pair{"k", k}, std::pair{"v", v}})
            for (std::size_t i = 0; i < data.size(); ++i)
                if (qkv::detail::half_overflows(data[i]))
                    throw numeric_overflow(std::string("kv_cache::append: ") + what + " element " + std::to_string(i) +
                                           " (" + std::to_string(data[i]) +
                                           ") is beyond float16's range (65504) of this fp16 cache; nothing was "
                                           "appended; use an fp32 cache or scale the inputs");
    device_core& core = *c.core;
    // Every check against the cache's size and every write happen under the device's lock, so
    // concurrent appends both fit or one is refused with nothing appended.
    std::lock_guard lock(core.mutex);
    core.check_alive();
    if (rows > s.capacity - c.size)
        throw limit_exceeded("kv_cache::append: " + std::to_string(rows) + " rows do not fit: the cache holds " +
                             std::to_string(c.size) + " of its capacity of " + std::to_string(s.capacity) +
                             " rows; nothing was appended");
    if (rows == 0) return;
    const std::size_t groups = c.groups();
    // One row of (batch, kv head) z's new rows as the cache stores them (texels, or blocks).
    const auto put_rows = [&](std::byte* at, bool is_k, std::size_t z) {
        const float* src = is_k ? k.data() + z * rows * s.d_qk : v.data() + z * rows * s.d_v;
        const std::size_t width = is_k ? s.d_qk : s.d_v;
        const char* what = is_k ? "kv_cache::append: k" : "kv_cache::append: v";
        if (c.blocks())
            put_block_rows(at, c.type, src, rows, width, what);
        else
            put_texel_rows(at, src, rows, width, is_k ? c.e4 : c.ev4, half, what);
    };
    try {
        kv_stats stats = c.stats;  // committed only once the rows are in place
        if (c.blocks()) {  // the overflow rule's facts of the values as they dequantize
            const std::vector<float> kq = stored_values(c.type, k, "kv_cache::append: k");
            const std::vector<float> vq = stored_values(c.type, v, "kv_cache::append: v");
            stats.add(kq, vq, groups, rows, s.d_qk, s.d_v);
        } else {
            stats.add(k, v, groups, rows, s.d_qk, s.d_v);
        }
        const std::uint64_t k_bytes = std::uint64_t{rows} * c.k_row_bytes, v_bytes = std::uint64_t{rows} * c.v_row_bytes;
        if (c.k.mapped() && c.v.mapped()) {
            // The device is idle between calls (every call waits for its work), so the new rows
            // can be written in place.
            for (std::size_t z = 0; z < groups; ++z) {
                put_rows(c.k.mapped() + (z * s.capacity + c.size) * c.k_row_bytes, true, z);
                put_rows(c.v.mapped() + (z * s.capacity + c.size) * c.v_row_bytes, false, z);
            }
            c.k.flush();
            c.v.flush();
        } else {
            // Staged: the new rows of every (batch, kv head) side by side, copied into place.
            core.alloc->ensure(c.staging, groups * (k_bytes + v_bytes), memory_use::upload, "K/V cache upload staging");
            for (std::size_t z = 0; z < groups; ++z) {
                put_rows(c.staging.mapped() + z * k_bytes, true, z);
                put_rows(c.staging.mapped() + groups * k_bytes + z * v_bytes, false, z);
            }
            c.staging.flush();
            executor& exec = *core.exec;
            exec.begin();
            for (std::size_t z = 0; z < groups; ++z) {
                exec.copy(c.staging.handle(), z * k_bytes, c.k.handle(), (z * s.capacity + c.size) * c.k_row_bytes,
                          k_bytes);
                exec.copy(c.staging.handle(), groups * k_bytes + z * v_bytes, c.v.handle(),
                          (z * s.capacity + c.size) * c.v_row_bytes, v_bytes);
            }
            exec.barrier(VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT,
                         VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_READ_BIT);
            (void)exec.submit_and_wait();
        }
        c.stats = std::move(stats);
    } catch (const device_lost&) {
        core.lost = true;
        throw;
    } catch (const std::bad_alloc&) {
        throw out_of_memory("host memory allocation failed while appending to a kv_cache");
    }
    c.size += rows;
}

namespace {

/// The checks of context::sdpa(problem, cache) before any work (qkv::invalid_argument), with
/// `rows` the cache's size: the cache's own, then validate()'s for q and the masks.
sdpa_problem checked_decode_problem(const sdpa_problem& given, const kv_cache_shape& cs, std::size_t rows) {
    sdpa_problem p = given;
    sdpa_shape& s = p.shape;
    auto fail = [](const std::string& why) { throw qkv::invalid_argument("sdpa with a kv_cache: " + why); };
    if (!p.k.empty() || !p.v.empty()) fail("k and v come from the cache; leave problem.k and problem.v empty");
    if (rows == 0) fail("the cache is empty; append keys and values first");
    if (s.kv_len == 0) s.kv_len = rows;
    if (s.kv_len != rows)
        fail("shape.kv_len is " + std::to_string(s.kv_len) + " but the cache holds " + std::to_string(rows) +
             " rows (0 takes the cache's size)");
    if (s.batch != cs.batch || s.kv_heads != cs.kv_heads || s.d_qk != cs.d_qk || s.d_v != cs.d_v)
        fail("the problem's (batch, kv_heads, d_qk, d_v) = " + dims({s.batch, s.kv_heads, s.d_qk, s.d_v}) +
             " differ from the cache's " + dims({cs.batch, cs.kv_heads, cs.d_qk, cs.d_v}));
    if (p.options.return_weights) fail("return_weights is not available with a kv_cache");
    if (p.options.kv_type && *p.options.kv_type != cs.type())
        fail("options.kv_type is " + std::string(to_string(*p.options.kv_type)) + " but the cache stores " +
             std::string(to_string(cs.type())) + " (leave kv_type unset to take the cache's)");
    try {
        validate_queries(p);  // the runtime's one validator, without k and v (the cache's)
    } catch (const qkv::invalid_argument& e) {
        fail(e.what());
    }
    return p;
}

}  // namespace

sdpa_output context::sdpa(const sdpa_problem& given, const kv_cache& cache) {
    impl& self = alive(impl_);
    kv_cache::impl& c = alive(cache.impl_);
    if (c.core != self.core)
        throw qkv::invalid_argument("sdpa with a kv_cache: the cache was created from another context");
    return self.call("sdpa with a kv_cache", [&](call_env& env) {
        // Under the lock: the cache's size and rows cannot change during the call.
        const sdpa_problem problem = checked_decode_problem(given, c.shape, c.size);
        const cache_desc cd{static_cast<std::uint32_t>(c.shape.capacity), c.type};
        const sdpa_plan p = plan_sdpa_cache(problem, cd, env.core.dev->desc(), env.set);
        cache_kv kv{c.k_view.handle(), c.v_view.handle(), {}, {}, cd, &c.stats};
        if (c.blocks()) kv.k_blocks = {c.k.handle(), 0, c.k.size()}, kv.v_blocks = {c.v.handle(), 0, c.v.size()};
        return run_decode(env, p, problem, &kv);
    });
}

}  // namespace qkv::vulkan
