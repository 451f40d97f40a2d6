// qkv::vulkan::kv_cache: K and V resident on the device, appended from the host or from tensors.
// context::sdpa over it is context.cpp's.
#include "qkv/vulkan/kv_cache.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "api/context_impl.hpp"
#include "api/kv_cache_impl.hpp"
#include "api/tensor_impl.hpp"
#include "kernels/tensor_ops.hpp"
#include "plan/sdpa_plan.hpp"
#include "qkv/runtime/capabilities.hpp"
#include "qkv/runtime/half.hpp"
#include "qkv/vulkan/testing.hpp"
#include "run/io.hpp"
#include "run/kv_storage.hpp"
#include "run/run.hpp"
#include "run/sdpa_guard.hpp"

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

kv_cache::impl::~impl() {
    if (!core) return;  // never attached to a device (the context was moved from)
    // The views and statistics go back to the shared device under its lock; k and v lock for themselves.
    std::lock_guard lock(core->mutex);
    k_view.reset(), v_view.reset(), stats.reset(), staging.reset(), k_blocks.reset(), v_blocks.reset();
}

void kv_cache::impl::check_ready(const char* what, const void* by) const {
    if (!pending_in || pending_in == by) return;
    if (pending_count)
        throw qkv::invalid_argument(std::string(what) +
                                    ": an append to this cache recorded into a command buffer (record_append) is not "
                                    "known to have run, so the cache's last rows may not be written; after its "
                                    "fence, call check() on that recording (or destroy it), or record into the same "
                                    "command buffer");
    throw qkv::invalid_argument(std::string(what) +
                                ": a sequence holds a recorded append to this cache that has not run, so the "
                                "cache's last rows are not written yet; run() that sequence first");
}

void kv_cache::impl::check_room(std::size_t rows, const char* what, const void* by) const {
    check_ready(what, by);
    if (rows > layout.capacity - size)
        throw limit_exceeded(std::string(what) + ": " + std::to_string(rows) + " rows do not fit: the cache holds " +
                             std::to_string(size) + " of its capacity of " + std::to_string(layout.capacity) +
                             " rows; nothing was done");
}

std::unique_lock<std::mutex> kv_cache::impl::lock_for_append(std::size_t rows, const char* what, const void* by) const {
    std::unique_lock lock(core->mutex);
    core->check_alive();
    check_room(rows, what, by);
    return lock;
}

kv_stats kv_cache::impl::read_stats() const {
    stats.invalidate();
    return stats_of(guard_words::read(stats.mapped(), 0, groups()));
}

bool kv_cache::impl::rows_finite() const {
    stats.invalidate();
    std::uint32_t flags = 0;
    std::memcpy(&flags, stats.mapped(), 4);
    return (flags & contract::GUARD_FLAG_INPUT_NONFINITE) == 0;
}

decode_rows kv_cache::impl::rows() const {
    decode_rows r;
    if (!half() || texels_only()) return r;
    const tensor::impl::bound k_rows = tensor_access::of(k, "kv_cache").bind();
    const tensor::impl::bound v_rows = tensor_access::of(v, "kv_cache").bind();
    r.k = k_rows.b, r.k_off = k_rows.element;
    r.v = v_rows.b, r.v_off = v_rows.element;
    return r;
}

std::shared_ptr<kv_cache::impl> kv_cache_access::of(const kv_cache& c) {
    if (!c.impl_) throw qkv::error("qkv::vulkan::kv_cache used after move: it holds no keys or values any more");
    return c.impl_;
}

namespace {

kv_cache::impl& alive(const std::shared_ptr<kv_cache::impl>& impl) {
    if (!impl) throw qkv::error("qkv::vulkan::kv_cache used after move: it holds no keys or values any more");
    return *impl;
}

/// The checks of a cache's layout; fills the texel widths and format.
void describe(kv_cache::impl& c, const kv_layout& layout) {
    validate(layout, "kv_cache");
    c.layout = layout;
    c.type = layout.type;
    c.format = texel_format(c.half());
    c.texel_bytes = c.half() ? 8 : 16;
    if (layout.capacity > 0x7fffffffu)
        throw limit_exceeded("kv_cache: a capacity of " + std::to_string(layout.capacity) +
                             " rows is beyond the decode kernels' 2^31 keys");
    // The kernels index a row's texels in 24 bits; a wider row is refused, never cut short.
    constexpr std::size_t widest = std::size_t{0xffffff} * 4;
    if (layout.d_qk > widest || layout.d_v > widest)
        throw limit_exceeded("kv_cache: d_qk " + std::to_string(layout.d_qk) + " and d_v " +
                             std::to_string(layout.d_v) + ": a row is at most " + std::to_string(widest) +
                             " values wide");
    c.e4 = static_cast<std::uint32_t>((layout.d_qk + 3) / 4);
    c.ev4 = static_cast<std::uint32_t>((layout.d_v + 3) / 4);
    c.k_row_bytes = c.blocks() ? bytes_for(c.type, layout.d_qk) : std::uint64_t{c.e4} * c.texel_bytes;
    c.v_row_bytes = c.blocks() ? bytes_for(c.type, layout.d_v) : std::uint64_t{c.ev4} * c.texel_bytes;
}

/// The overflow rule's statistics of a cache with no rows (the lock held).
void create_stats(kv_cache::impl& c) {
    c.stats = c.core->alloc->create(guard_words::bytes(0, c.groups()), memory_use::readback, "K/V cache statistics");
    std::memset(c.stats.mapped(), 0, c.stats.size());
    c.stats.flush();
}

/// The storage of a q8_0 / q4_0 cache: rows of blocks in storage buffers (the lock held), read by
/// the decode kernel at 32-bit byte offsets.
void attach_blocks(kv_cache::impl& c) {
    device_core& core = *c.core;
    const device_info& info = core.dev->info();
    const kv_layout& shape = c.layout;
    const std::uint64_t rows = product({shape.batch, shape.kv_heads, shape.capacity}, "kv_cache");
    for (const auto& [what, row_bytes, store] :
         {std::tuple{"K", c.k_row_bytes, &c.k_blocks}, std::tuple{"V", c.v_row_bytes, &c.v_blocks}}) {
        if (row_bytes != 0 && rows > info.max_storage_buffer_range / row_bytes)
            throw limit_exceeded(std::string("kv_cache: ") + what + " of " + std::to_string(rows) + " rows of " +
                                 std::to_string(row_bytes) + " bytes (" + std::string(to_string(c.type)) +
                                 " blocks) is more than " + info.name + "'s maxStorageBufferRange of " +
                                 std::to_string(info.max_storage_buffer_range) +
                                 " bytes; use a smaller capacity or batch");
        // Rounded up to whole 32-bit words: the kernels read the blocks a word at a time
        // (kv_blocks.glsl), and the last row's last quant bytes share a word with what follows them
        // (34- and 18-byte rows: an odd number of rows ends mid-word), which must lie inside the
        // binding or a robust read returns zero for the whole word.
        *store = core.alloc->create(align_up(rows * row_bytes, std::uint64_t{4}), memory_use::device,
                                    what[0] == 'K' ? "K/V cache (K blocks)" : "K/V cache (V blocks)");
    }
    create_stats(c);
}

/// The storage's shapes: (B, Hkv, capacity, 4·texels per row).
std::vector<std::size_t> storage_shape(const kv_layout& s, std::uint32_t texels) {
    return {s.batch, s.kv_heads, s.capacity, std::size_t{texels} * 4};
}

/// The device checks of a cache and its views and statistics (the lock held).
void attach(kv_cache::impl& c) {
    device_core& core = *c.core;
    const device& dev = *core.dev;
    const device_desc& desc = dev.desc();
    const std::string& name = desc.info.name;
    if (!desc.uniform_texels(c.half()))
        throw unavailable(std::string("kv_cache: ") + name + " cannot read " +
                          (c.half() ? "R16G16B16A16_SFLOAT" : "R32G32B32A32_SFLOAT") + " uniform texel buffers");
    for (const auto& [what, t, texels] : {std::tuple{"K", &c.k, c.e4}, std::tuple{"V", &c.v, c.ev4}}) {
        const tensor::impl& ti = tensor_access::of(*t, "kv_cache");
        const std::uint64_t count = ti.elements / 4;
        if (count > desc.max_texel_elements || count > 0x7fffffffu)
            throw limit_exceeded(std::string("kv_cache: ") + what + " of shape " + shape_string(ti.shape) + " needs " +
                                 std::to_string(count) + " texels, more than " + name +
                                 "'s maxTexelBufferElements of " + std::to_string(desc.max_texel_elements) +
                                 "; use a smaller capacity or batch");
        if (ti.offset % desc.texel_alignment != 0)
            throw qkv::invalid_argument(std::string("kv_cache: the ") + what + " tensor starts at byte " +
                                        std::to_string(ti.offset) + " of its buffer, not a multiple of " + name +
                                        "'s minTexelBufferOffsetAlignment (" + std::to_string(desc.texel_alignment) +
                                        ")");
        (void)texels;
    }
    const tensor::impl& k = tensor_access::of(c.k, "kv_cache");
    const tensor::impl& v = tensor_access::of(c.v, "kv_cache");
    c.k_view = buffer_view(dev, k.handle, c.format, k.offset, k.bytes);
    c.v_view = buffer_view(dev, v.handle, c.format, v.offset, v.bytes);
    create_stats(c);
}

}  // namespace

kv_cache::kv_cache(context& ctx, const kv_layout& shape) {
    auto c = std::make_shared<impl>();
    c->core = context_access::of(ctx).core;
    c->force_staging = context_access::of(ctx).set.force_staging;
    describe(*c, shape);
    if (c->blocks()) {
        std::lock_guard lock(c->core->mutex);
        c->core->check_alive();
        attach_blocks(*c);
        impl_ = std::move(c);
        return;
    }
    const element_type type = c->half() ? element_type::f16 : element_type::f32;
    if (c->half() && !c->core->dev->info().fp16_storage)
        throw unavailable("kv_cache: an fp16 cache needs 16-bit storage buffers (storageBuffer16BitAccess): " +
                          lacks(c->core->dev->info()) + "; use an fp32 cache");
    // Storage past maxStorageBufferRange (or the test hook's smaller range) is kept all the same
    // where the texel views reach it: the decode kernels read K and V only through them.
    const context::impl& ci = context_access::of(ctx);
    std::uint64_t range = c->core->dev->info().max_storage_buffer_range;
    if (ci.set.kv_storage_range != 0) range = std::min(range, ci.set.kv_storage_range);
    for (const auto& [t, texels, what] :
         {std::tuple{&c->k, c->e4, "K/V cache (K)"}, std::tuple{&c->v, c->ev4, "K/V cache (V)"}}) {
        const std::vector<std::size_t> dims = storage_shape(shape, texels);
        const std::uint64_t bytes = std::uint64_t{c->texel_bytes} * texels * shape.batch * shape.kv_heads *
                                    shape.capacity;  // the texel check (attach) bounds it
        *t = bytes > range ? texels_only_tensor(c->core, dims, type, what) : tensor(ctx, dims, type);
    }
    std::lock_guard lock(c->core->mutex);
    c->core->check_alive();
    attach(*c);
    impl_ = std::move(c);
}

kv_cache::kv_cache(context& ctx, const kv_layout& shape, tensor k, tensor v) {
    auto c = std::make_shared<impl>();
    c->core = context_access::of(ctx).core;
    c->force_staging = context_access::of(ctx).set.force_staging;
    describe(*c, shape);
    if (c->blocks())
        throw qkv::invalid_argument("kv_cache: a " + std::string(to_string(c->type)) +
                                    " cache keeps its blocks in storage qkv allocates; over a caller's tensors, caches "
                                    "are f32 or f16");
    const element_type type = c->half() ? element_type::f16 : element_type::f32;
    for (const auto& [what, t, texels] : {std::tuple{"k", &k, c->e4}, std::tuple{"v", &v, c->ev4}}) {
        const tensor::impl& ti = tensor_access::of(*t, "kv_cache");
        if (ti.core != c->core)
            throw qkv::invalid_argument(std::string("kv_cache: the ") + what + " tensor is on another device");
        if (ti.shape != storage_shape(shape, texels) || ti.type != type)
            throw qkv::invalid_argument(std::string("kv_cache: the ") + what + " tensor is " + shape_string(ti.shape) +
                                        " " + std::string(to_string(ti.type)) + "; this cache needs " +
                                        shape_string(storage_shape(shape, texels)) + " " +
                                        std::string(to_string(type)));
    }
    for (const tensor* t : {&k, &v})
        require_usage(tensor_access::of(*t, "kv_cache"), VK_BUFFER_USAGE_UNIFORM_TEXEL_BUFFER_BIT,
                      "VK_BUFFER_USAGE_UNIFORM_TEXEL_BUFFER_BIT (read through texel buffer views)", "kv_cache",
                      t == &k ? "k storage" : "v storage");
    refuse_overlap("kv_cache", {{&tensor_access::of(k, "kv_cache"), "k storage", true},
                                {&tensor_access::of(v, "kv_cache"), "v storage", true}});
    c->k = std::move(k);
    c->v = std::move(v);
    std::lock_guard lock(c->core->mutex);
    c->core->check_alive();
    attach(*c);
    impl_ = std::move(c);
}

testing::cache_bytes testing::cache_blocks(const kv_cache& cache) {
    const kv_cache::impl& c = alive(kv_cache_access::of(cache));
    if (!c.blocks())
        throw qkv::invalid_argument("testing::cache_blocks: a " + std::string(to_string(c.type)) +
                                    " cache's storage is its keys() and values() tensors");
    device_core& core = *c.core;
    std::lock_guard lock(core.mutex);
    core.check_alive();
    c.check_ready("testing::cache_blocks", nullptr);
    return core.guarded("testing::cache_blocks", [&] {
        const std::uint64_t rows = std::uint64_t{c.layout.batch} * c.layout.kv_heads * c.layout.capacity;
        const std::uint64_t k_bytes = rows * c.k_row_bytes, v_bytes = rows * c.v_row_bytes;
        buffer staging =
            core.alloc->create(align_up(k_bytes, 4) + v_bytes, memory_use::readback, "testing::cache_blocks staging");
        executor& exec = *core.exec;
        exec.begin();
        exec.barrier(VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                     VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT,
                     VK_ACCESS_TRANSFER_READ_BIT);
        exec.copy(c.k_blocks.handle(), 0, staging.handle(), 0, k_bytes);
        exec.copy(c.v_blocks.handle(), 0, staging.handle(), align_up(k_bytes, 4), v_bytes);
        exec.barrier(VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT, VK_PIPELINE_STAGE_HOST_BIT,
                     VK_ACCESS_HOST_READ_BIT);
        (void)exec.submit_and_wait();
        staging.invalidate();
        const std::byte* from = staging.mapped();
        return cache_bytes{{from, from + k_bytes},
                           {from + align_up(k_bytes, 4), from + align_up(k_bytes, 4) + v_bytes}};
    });
}

kv_cache::~kv_cache() = default;
kv_cache::kv_cache(kv_cache&&) noexcept = default;
kv_cache& kv_cache::operator=(kv_cache&&) noexcept = default;

std::size_t kv_cache::size() const {
    impl& c = alive(impl_);
    std::lock_guard lock(c.core->mutex);
    return c.size;
}
std::size_t kv_cache::capacity() const { return alive(impl_).layout.capacity; }
const kv_layout& kv_cache::layout() const { return alive(impl_).layout; }
namespace {

const kv_cache::impl& tensors_of(const std::shared_ptr<kv_cache::impl>& p, const char* what) {
    const kv_cache::impl& c = alive(p);
    if (c.blocks())
        throw unavailable(std::string(what) + ": a " + std::string(to_string(c.type)) +
                          " cache stores ggml's blocks, which are no tensor");
    if (c.texels_only())
        throw limit_exceeded(std::string(what) + ": this cache's storage passes " + c.core->dev->info().name +
                             "'s maxStorageBufferRange of " +
                             std::to_string(c.core->dev->info().max_storage_buffer_range) +
                             " bytes (or the context's kv_storage_range hook), so it is no tensor: it is read only "
                             "through texel views");
    return c;
}

}  // namespace

const tensor& kv_cache::keys() const { return tensors_of(impl_, "kv_cache::keys").k; }
const tensor& kv_cache::values() const { return tensors_of(impl_, "kv_cache::values").v; }

void kv_cache::clear() {
    impl& c = alive(impl_);
    std::lock_guard lock(c.core->mutex);
    c.core->check_alive();
    c.check_ready("kv_cache::clear", nullptr);
    c.size = 0;
    std::memset(c.stats.mapped(), 0, c.stats.size());
    c.stats.flush();
}

namespace {

/// Where one side (K or V) of a cache's rows lives on the device: the buffer, the byte offset of
/// row 0 of (batch, kv head) 0, and the bytes of one row.
struct rows_place {
    VkBuffer buffer = VK_NULL_HANDLE;
    std::uint64_t base = 0, row_bytes = 0;
};

/// The upload staging a cache keeps between host appends, at most (1 MiB: a decode step's rows
/// for 512 K/V heads of width 128 in f32).
constexpr std::uint64_t kept_staging_bytes = std::uint64_t{1} << 20;

/// Appends through staging (the lock held, the size checked): `put(k_at, v_at, z)` writes the new
/// rows of (batch, kv head) z into staging, K's and V's side by side, and one submit copies them
/// into place after the cache's rows.
template <class Put>
void upload_rows(kv_cache::impl& c, rows_place k, rows_place v, std::size_t rows, const Put& put) {
    const std::size_t groups = c.groups();
    const std::uint64_t k_bytes = std::uint64_t{rows} * k.row_bytes, v_bytes = std::uint64_t{rows} * v.row_bytes;
    device_core& core = *c.core;
    core.alloc->ensure(c.staging, groups * (k_bytes + v_bytes), memory_use::upload, "K/V cache upload staging");
    // Kept for the next append (a decode token's rows) while small; a prefill's is given back,
    // whether the append succeeds or not.
    struct give_back_large {
        buffer& staging;
        ~give_back_large() {
            if (staging.size() > kept_staging_bytes) staging.reset();
        }
    } const give_back{c.staging};
    for (std::size_t z = 0; z < groups; ++z)
        put(c.staging.mapped() + z * k_bytes, c.staging.mapped() + groups * k_bytes + z * v_bytes, z);
    c.staging.flush();
    executor& exec = *core.exec;
    exec.begin();
    // The rows may have been read by a recorded call (a compute shader) before.
    exec.barrier(VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT,
                 VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT);
    for (std::size_t z = 0; z < groups; ++z) {
        const std::uint64_t row = std::uint64_t{z} * c.layout.capacity + c.size;
        exec.copy(c.staging.handle(), z * k_bytes, k.buffer, k.base + row * k.row_bytes, k_bytes);
        exec.copy(c.staging.handle(), groups * k_bytes + z * v_bytes, v.buffer, v.base + row * v.row_bytes, v_bytes);
    }
    exec.barrier(VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                 VK_ACCESS_SHADER_READ_BIT);
    (void)exec.submit_and_wait();
}

/// The new rows of a q8_0 / q4_0 cache, quantized once (by qkv::quantize, before the lock): K's
/// rows of every (batch, kv head) in turn, then V's.
struct block_rows {
    std::vector<std::byte> bytes;
    std::uint64_t k_bytes = 0, v_bytes = 0;  // of one (batch, kv head)
};

block_rows quantize_rows(const kv_cache::impl& c, std::span<const float> k, std::span<const float> v,
                         std::size_t rows) {
    const std::size_t groups = c.groups();
    block_rows b;
    b.k_bytes = std::uint64_t{rows} * c.k_row_bytes, b.v_bytes = std::uint64_t{rows} * c.v_row_bytes;
    b.bytes.resize(groups * (b.k_bytes + b.v_bytes));
    // Rows are whole blocks: each span quantizes as one row, and a refusal names its element.
    put_block_rows(b.bytes.data(), c.type, k.data(), 1, k.size(), "kv_cache::append: k");
    put_block_rows(b.bytes.data() + groups * b.k_bytes, c.type, v.data(), 1, v.size(), "kv_cache::append: v");
    return b;
}

/// Quantized rows into a q8_0 / q4_0 cache after its rows (the lock held, the size checked): in
/// place, or through staging.
void append_blocks(kv_cache::impl& c, const block_rows& b, std::size_t rows) {
    const kv_layout& s = c.layout;
    const std::size_t groups = c.groups();
    const auto put = [&](std::byte* k_at, std::byte* v_at, std::size_t z) {
        std::memcpy(k_at, b.bytes.data() + z * b.k_bytes, b.k_bytes);
        std::memcpy(v_at, b.bytes.data() + groups * b.k_bytes + z * b.v_bytes, b.v_bytes);
    };
    if (!c.force_staging && c.k_blocks.mapped() && c.v_blocks.mapped()) {
        for (std::size_t z = 0; z < groups; ++z)
            put(c.k_blocks.mapped() + (z * s.capacity + c.size) * c.k_row_bytes,
                c.v_blocks.mapped() + (z * s.capacity + c.size) * c.v_row_bytes, z);
        c.k_blocks.flush();
        c.v_blocks.flush();
        return;
    }
    upload_rows(c, {c.k_blocks.handle(), 0, c.k_row_bytes}, {c.v_blocks.handle(), 0, c.v_row_bytes}, rows, put);
}

}  // namespace

namespace {

/// k (B, Hkv, rows, E) and v (B, Hkv, rows, Ev) have their sizes (qkv::invalid_argument).
void check_append_sizes(const kv_layout& s, std::size_t k, std::size_t v, std::size_t rows) {
    const std::size_t want_k = product({s.batch, s.kv_heads, rows, s.d_qk}, "kv_cache::append k");
    const std::size_t want_v = product({s.batch, s.kv_heads, rows, s.d_v}, "kv_cache::append v");
    if (k != want_k)
        throw qkv::invalid_argument("kv_cache::append: k has " + std::to_string(k) +
                                    " elements, expected (batch, kv_heads, rows, d_qk) = " +
                                    dims({s.batch, s.kv_heads, rows, s.d_qk}) + " = " + std::to_string(want_k));
    if (v != want_v)
        throw qkv::invalid_argument("kv_cache::append: v has " + std::to_string(v) +
                                    " elements, expected (batch, kv_heads, rows, d_v) = " +
                                    dims({s.batch, s.kv_heads, rows, s.d_v}) + " = " + std::to_string(want_v));
}

/// Host rows after a cache's rows, their facts `added` (or its blocks, quantized) computed before:
/// takes the lock, writes them (in place where the storage is mapped, else through staging;
/// `put(k_at, v_at, z)` packs (batch, kv head) z's rows of an f32 / f16 cache), then folds their
/// facts into the statistics and counts them.
template <class Put>
void append_host_rows(kv_cache::impl& c, std::size_t rows, const kv_stats& added, const block_rows& blocks,
                      const Put& put) {
    const kv_layout& s = c.layout;
    const std::size_t groups = c.groups();
    device_core& core = *c.core;
    const auto lock = c.lock_for_append(rows, "kv_cache::append", nullptr);
    if (rows == 0) return;
    const std::uint64_t tb = c.texel_bytes;
    core.guarded("kv_cache::append", [&] {
        if (c.blocks()) {
            append_blocks(c, blocks, rows);
            return;
        }
        tensor::impl& kt = tensor_access::of(c.k, "kv_cache::append");
        tensor::impl& vt = tensor_access::of(c.v, "kv_cache::append");
        if (!c.force_staging && !kt.wrapped && !vt.wrapped && kt.owned.mapped() && vt.owned.mapped()) {
            // The device is idle between calls (every call waits for its work), so the new rows
            // can be written in place.
            for (std::size_t z = 0; z < groups; ++z)
                put(kt.owned.mapped() + (z * s.capacity + c.size) * c.e4 * tb,
                    vt.owned.mapped() + (z * s.capacity + c.size) * c.ev4 * tb, z);
            kt.owned.flush();
            vt.owned.flush();
        } else {
            // Staged: the new rows of every (batch, kv head) side by side, copied into place.
            upload_rows(c, {kt.handle, kt.offset, c.e4 * tb}, {vt.handle, vt.offset, c.ev4 * tb}, rows, put);
        }
    });
    // The rows are in place: their facts join the statistics.
    c.stats.invalidate();
    fold_host_rows(c.stats.mapped(), added, groups);
    c.stats.flush();
    c.size += rows;
}

}  // namespace

void kv_cache::append(std::span<const float> k, std::span<const float> v, std::size_t rows) {
    impl& c = alive(impl_);
    require_supported(entry_point::cache_append, features_of(c.type));
    const kv_layout& s = c.layout;
    check_append_sizes(s, k.size(), v.size(), rows);
    const bool half = c.half();
    // A finite value that float16 cannot hold would become inf: refuse, never silently wrong. The
    // only scan of the values: put_texel_rows below is told they are checked (half_check::done).
    if (half)
        for (const auto& [what, data] : {std::pair{"k", k}, std::pair{"v", v}})
            if (const std::size_t i = half_overflow_index(data); i < data.size())
                throw numeric_overflow(std::string("kv_cache::append: ") + what + " element " + std::to_string(i) +
                                       " (" + std::to_string(data[i]) +
                                       ") is beyond float16's range (65504) of this fp16 cache; nothing was "
                                       "appended; use an fp32 cache or scale the inputs");
    const std::size_t groups = c.groups();
    // What depends on the rows alone is done before the lock: the blocks of a quantized cache
    // (quantized once) and the overflow rule's facts of the values as the device will read them.
    kv_stats added;  // folded into the statistics once the rows are in place
    block_rows blocks;
    try {
        if (c.blocks()) {
            blocks = quantize_rows(c, k, v, rows);
            std::vector<float> kq(k.size()), vq(v.size());
            dequantize(c.type, std::span(blocks.bytes).first(groups * blocks.k_bytes), kq);
            dequantize(c.type, std::span(blocks.bytes).subspan(groups * blocks.k_bytes), vq);
            added.add(kq, vq, groups, rows, s.d_qk, s.d_v);
        } else {
            added.add(k, v, groups, rows, s.d_qk, s.d_v);
        }
    } catch (const std::bad_alloc&) {
        throw out_of_memory("host memory allocation failed while appending to a kv_cache");
    }
    append_host_rows(c, rows, added, blocks, [&](std::byte* k_at, std::byte* v_at, std::size_t z) {
        put_texel_rows(k_at, k.data() + z * rows * s.d_qk, rows, s.d_qk, c.e4, half, "kv_cache::append: k", 1.0f,
                       half_check::done);
        put_texel_rows(v_at, v.data() + z * rows * s.d_v, rows, s.d_v, c.ev4, half, "kv_cache::append: v", 1.0f,
                       half_check::done);
    });
}

void kv_cache::append_f16(std::span<const std::uint16_t> k, std::span<const std::uint16_t> v, std::size_t rows) {
    impl& c = alive(impl_);
    require_supported(entry_point::cache_append, features_of(c.type));
    const kv_layout& s = c.layout;
    check_append_sizes(s, k.size(), v.size(), rows);
    if (!c.half()) {
        // Stored as their float32 values are (exact): the float append, with its refusals.
        std::vector<float> kf, vf;
        try {
            kf.resize(k.size()), vf.resize(v.size());
        } catch (const std::bad_alloc&) {
            throw out_of_memory("host memory allocation failed while appending to a kv_cache");
        }
        from_half_bits(k, kf), from_half_bits(v, vf);
        append(kf, vf, rows);
        return;
    }
    // Float16 into float16: nothing to round and nothing that can overflow; the facts of their
    // float32 values, as append() takes them.
    kv_stats added;
    try {
        added.add_f16(k, v, c.groups(), rows, s.d_qk, s.d_v);
    } catch (const std::bad_alloc&) {
        throw out_of_memory("host memory allocation failed while appending to a kv_cache");
    }
    append_host_rows(c, rows, added, block_rows{}, [&](std::byte* k_at, std::byte* v_at, std::size_t z) {
        put_half_rows(k_at, k.data() + z * rows * s.d_qk, rows, s.d_qk, c.e4);
        put_half_rows(v_at, v.data() + z * rows * s.d_v, rows, s.d_v, c.ev4);
    });
}

std::pair<const tensor::impl*, const tensor::impl*> kv_cache::impl::check_append(const tensor& kt, const tensor& vt,
                                                                                 std::size_t rows) const {
    require_supported(entry_point::cache_append_tensors, features_of(type));
    if (texels_only())
        throw limit_exceeded("kv_cache::append: this cache's storage passes " + core->dev->info().name +
                             "'s maxStorageBufferRange of " +
                             std::to_string(core->dev->info().max_storage_buffer_range) +
                             " bytes (or the context's kv_storage_range hook), which an append of device tensors "
                             "binds; append host data (nothing was appended)");
    const kv_layout& s = layout;
    // (B, Hkv, rows, E) and (B, Hkv, rows, Ev), of the cache's storage type.
    (void)product({s.batch, s.kv_heads, rows, s.d_qk}, "kv_cache::append");  // fits size_t
    (void)product({s.batch, s.kv_heads, rows, s.d_v}, "kv_cache::append");
    const tensor::impl& kin =
        expect_tensor(kt, "kv_cache::append", "k", core, {s.batch, s.kv_heads, rows, s.d_qk}, type);
    const tensor::impl& vin =
        expect_tensor(vt, "kv_cache::append", "v", core, {s.batch, s.kv_heads, rows, s.d_v}, type);
    // The rows written: the cache's storage (a caller's buffer, perhaps the one k and v are in).
    const tensor::impl* sk = blocks() ? nullptr : &tensor_access::of(k, "kv_cache::append");
    const tensor::impl* sv = blocks() ? nullptr : &tensor_access::of(v, "kv_cache::append");
    refuse_overlap("kv_cache::append",
                   {{&kin, "k"}, {&vin, "v"}, {sk, "cache's k storage", true}, {sv, "cache's v storage", true}});
    const device_desc& desc = core->dev->desc();
    if (blocks() && !desc.info.fp16_storage)
        throw unavailable("kv_cache::append: the rows of " + std::string(to_string(type)) +
                          " tensors are copied as 16-bit words, which needs 16-bit storage buffers "
                          "(storageBuffer16BitAccess): " +
                          lacks(desc.info) + "; append host data");
    return {&kin, &vin};
}

void kv_cache::impl::record_append(recorder& rec, const tensor& kt, const tensor& vt, std::size_t rows,
                                   buffer& scratch) {
    const kv_layout& s = layout;
    const auto [kp, vp] = check_append(kt, vt, rows);
    const tensor::impl &kin = *kp, &vin = *vp;
    const device_desc& desc = core->dev->desc();
    pipeline_set& pipes = *core->pipes;
    tensor::impl::bound kb = kin.bind(), vb = vin.bind();
    const tensor::impl::bound k_src = kb, v_src = vb;  // the blocks as given (kb, vb become their values)
    const binding stats_all{stats.handle(), 0, stats.size()};
    // Earlier compute writes (the caller's, or a recorded call's) before these reads and writes.
    rec.barrier(VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_UNIFORM_READ_BIT);
    if (blocks()) {  // the overflow rule reads the values the blocks hold, as float32, from `scratch`
        const std::uint64_t k_values = std::uint64_t{groups()} * rows * s.d_qk;
        const std::uint64_t v_at = align_up(k_values, desc.storage_alignment / 4);
        const std::uint64_t v_values = std::uint64_t{groups()} * rows * s.d_v;
        core->alloc->ensure(scratch, (v_at + v_values) * 4, memory_use::device, "K/V cache append (rows as float32)");
        const binding to{scratch.handle(), 0, scratch.size()};
        record_tensor_widen(rec, pipes, kb.b, kb.byte, type, to, 0, groups() * rows, s.d_qk);
        record_tensor_widen(rec, pipes, vb.b, vb.byte, type, to, v_at, groups() * rows, s.d_v);
        kb = {to, 0, 0};
        vb = {to, static_cast<std::uint32_t>(v_at), v_at * 4};
        rec.compute_barrier();
    }
    // The overflow rule's facts of the new rows, folded into the cache's statistics.
    guard_rows g;
    g.q_rows = 0;
    g.k_rows = static_cast<std::uint32_t>(groups() * rows);
    g.q_len = 1, g.kv_len = static_cast<std::uint32_t>(rows);
    g.d = static_cast<std::uint32_t>(s.d_qk), g.dv = static_cast<std::uint32_t>(s.d_v);
    g.k_off = kb.element, g.v_off = vb.element;
    g.half = half();
    record_guard_rows(rec, pipes, kb.b, kb.b, vb.b, stats_all, g);
    if (blocks()) {
        // The blocks as they are, after the rows already held: each (batch, kv head)'s rows are
        // contiguous in the tensor, and start at row (z·capacity + size) of the store.
        for (const auto& [src, store, row_bytes] :
             {std::tuple{k_src, &k_blocks, k_row_bytes}, std::tuple{v_src, &v_blocks, v_row_bytes}}) {
            const std::uint64_t cols = rows * row_bytes / 2, count = groups() * cols;  // 16-bit words
            if (count >= (std::uint64_t{1} << 32) || store->size() / 2 >= (std::uint64_t{1} << 32))
                throw limit_exceeded("kv_cache::append: a copy of more than 2^32 - 1 16-bit words");
            rec.compute_barrier();  // the rows pass read the scratch; the copy's destination follows the last reads
            record_block_copy(rec, pipes, src.b, static_cast<std::uint32_t>(src.byte / 2),
                              static_cast<std::uint32_t>(cols), binding{store->handle(), 0, store->size()},
                              static_cast<std::uint32_t>(size * row_bytes / 2),
                              static_cast<std::uint32_t>(s.capacity * row_bytes / 2),
                              static_cast<std::uint32_t>(groups()), static_cast<std::uint32_t>(cols), true);
        }
    } else {
        // The rows into whole texels, after the rows already held.
        const tensor::impl &ks = tensor_access::of(k, "kv_cache"), &vs = tensor_access::of(v, "kv_cache");
        const std::uint64_t align = desc.storage_alignment;
        for (const auto& [src, store, width, texels] :
             {std::tuple{kb, &ks, s.d_qk, e4}, std::tuple{vb, &vs, s.d_v, ev4}}) {
            const VkDeviceSize start = store->offset / align * align;
            texel_pack t;
            t.groups = static_cast<std::uint32_t>(groups());
            t.rows = static_cast<std::uint32_t>(rows);
            t.width = static_cast<std::uint32_t>(width);
            t.w4 = texels;
            t.src_off = src.element;
            t.at = static_cast<std::uint32_t>((store->offset - start) / texel_bytes + size * texels);
            t.stride = static_cast<std::uint32_t>(s.capacity);
            t.half = half();
            t.texels_half = half();
            const binding dst{store->handle, start, store->offset - start + store->bytes};
            // The packer's flags binding (unused here) is the statistics: ordered after their last use.
            rec.compute_barrier();
            record_texel_pack(rec, pipes, src.b, dst, stats_all, t);
        }
    }
    // The rows and statistics readable by later work in submission order, wherever it is recorded
    // (this command buffer, the next submit), and by the host, which reads the statistics.
    rec.barrier(VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT,
                VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_HOST_BIT,
                VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_UNIFORM_READ_BIT | VK_ACCESS_HOST_READ_BIT);
    size += rows;
}

void kv_cache::append(const tensor& k, const tensor& v, std::size_t rows) {
    impl& c = alive(impl_);
    device_core& core = *c.core;
    const auto lock = c.lock_for_append(rows, "kv_cache::append", nullptr);
    if (rows == 0) return;
    const std::size_t before = c.size;
    try {
        core.guarded("kv_cache::append", [&] {
            executor& exec = *core.exec;
            exec.begin();
            buffer scratch;                              // quantized rows as float32, for the overflow rule
            c.record_append(exec, k, v, rows, scratch);  // ends with the barrier to compute and host reads
            (void)exec.submit_and_wait();
        });
    } catch (...) {
        c.size = before;  // record_append grew it
        throw;
    }
}

paged_problem kv_cache::impl::check_pool(const paged_problem& given, bool data) const {
    const kv_layout& l = layout;
    if (l.batch != 1 || l.kv_heads != given.kv_heads || l.d_qk != given.d_qk || l.d_v != given.d_v)
        throw qkv::invalid_argument(
            "sdpa over a paged K/V pool: the pool is a kv_cache of batch 1 with the problem's kv_heads, d_qk "
            "and d_v (it has batch " +
            std::to_string(l.batch) + ", kv_heads " + std::to_string(l.kv_heads) + ", d_qk " + std::to_string(l.d_qk) +
            ", d_v " + std::to_string(l.d_v) + "; the problem kv_heads " + std::to_string(given.kv_heads) + ", d_qk " +
            std::to_string(given.d_qk) + ", d_v " + std::to_string(given.d_v) + ")");
    if (type != element_type::f32 && type != element_type::f16 && !blocks())
        throw limit_exceeded(std::string("sdpa over a paged K/V pool: the paged decode kernel reads f32, f16, "
                                         "q8_0 and q4_0 pools, not ") +
                             std::string(to_string(type)));
    const auto validated = [&](const paged_problem& p) {
        if (data)
            validate_without_pool(p);
        else
            validate_without_data(p);
    };
    paged_problem problem = given;
    const std::size_t ps = given.page_size;
    if (ps == 0 || ps > max_page_size || (ps & (ps - 1)) != 0) {
        problem.num_pages = 1;
        validated(problem);  // names the page size
    }
    const std::size_t held = size / ps;
    if (problem.num_pages == 0) problem.num_pages = held;
    if (problem.num_pages > held)
        throw qkv::invalid_argument("sdpa over a paged K/V pool: num_pages is " + std::to_string(problem.num_pages) +
                                    " and the pool holds " + std::to_string(held) + " pages of " +
                                    std::to_string(given.page_size) + " rows (" + std::to_string(size) + " rows)");
    if (problem.num_pages == 0)
        throw qkv::invalid_argument("sdpa over a paged K/V pool: the pool holds no whole page (" +
                                    std::to_string(size) + " rows)");
    validated(problem);
    return problem;
}

detail::paged_pool kv_cache::impl::pool(const detail::kv_stats* s) const {
    paged_pool p{k_view.handle(), v_view.handle(), {}, {}, static_cast<std::uint32_t>(layout.capacity), type, s};
    if (blocks()) {
        p.k_blocks = {k_blocks.handle(), 0, k_blocks.size()};
        p.v_blocks = {v_blocks.handle(), 0, v_blocks.size()};
    }
    return p;
}

void kv_cache::impl::bind_stores(detail::paged_pool& p) const {
    const std::uint64_t align = core->dev->desc().storage_alignment;
    for (const auto& [t, store, word] :
         {std::tuple{&k, &p.k_store, &p.k_word}, std::tuple{&v, &p.v_store, &p.v_word}}) {
        const tensor::impl& ti = tensor_access::of(*t, "paged K/V pool");
        const VkDeviceSize start = ti.offset / align * align;
        *store = {ti.handle, start, ti.offset - start + ti.bytes};
        *word = (ti.offset - start) / 4;
    }
}

}  // namespace qkv::vulkan
