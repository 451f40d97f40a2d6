// qkv::vulkan::tensor: device data with a shape and an element type, in qkv's memory or a caller's
// VkBuffer (interop.cpp: wrap).
#include "qkv/vulkan/tensor.hpp"

#include <cstring>
#include <limits>
#include <mutex>
#include <new>
#include <string>
#include <tuple>
#include <utility>

#include "api/context_impl.hpp"
#include "api/tensor_impl.hpp"
#include "plan/buffers.hpp"
#include "qkv/runtime/half.hpp"
#include "run/io.hpp"

namespace qkv::vulkan {

using namespace detail;

std::string shape_string(const std::vector<std::size_t>& shape) {
    std::string s = "(";
    for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + (shape.size() == 1 ? ",)" : ")");
}

tensor::impl::~impl() {
    if (!core || !owned) return;        // a caller's buffer, or a stand-in: nothing of qkv's to give back
    std::lock_guard lock(core->mutex);  // the memory goes back to the shared device under its lock
    owned.reset();
}

tensor::impl::bound tensor::impl::bind() const {
    if (texels_only)
        throw limit_exceeded("a kv_cache's storage of " + std::to_string(bytes) + " bytes is more than " +
                             core->dev->info().name + "'s maxStorageBufferRange of " +
                             std::to_string(core->dev->info().max_storage_buffer_range) +
                             " (or the context's kv_storage_range hook): it is read only through texel views, as "
                             "the decode and the paged decode do");
    const std::uint64_t align = core->dev->desc().storage_alignment;
    const VkDeviceSize start = offset / align * align;
    const std::uint32_t element = element_bytes() ? static_cast<std::uint32_t>((offset - start) / element_bytes()) : 0;
    return {binding{handle, start, offset - start + reach}, element, offset - start};
}

void require_usage(const tensor::impl& t, VkBufferUsageFlags needed, const char* flag, const char* op,
                   const char* what) {
    if ((t.usage & needed) == needed) return;
    throw qkv::invalid_argument(std::string(op) + ": the " + what + " tensor's VkBuffer was not created with " + flag +
                                " (as wrap() was told its usage), which " + op + " needs");
}

tensor texels_only_tensor(const std::shared_ptr<detail::device_core>& core, std::vector<std::size_t> shape,
                          element_type type, const char* what) {
    auto t = std::make_unique<tensor::impl>();
    t->core = core;
    device_info unbounded = core->dev->info();
    unbounded.max_storage_buffer_range = std::numeric_limits<std::uint64_t>::max();  // bound only as texels
    describe(*t, std::move(shape), type, unbounded, what);
    t->texels_only = true;
    std::lock_guard lock(core->mutex);
    core->check_alive();
    t->owned = core->alloc->create(t->reach, memory_use::device, what, VK_BUFFER_USAGE_UNIFORM_TEXEL_BUFFER_BIT);
    t->handle = t->owned.handle();
    return tensor_access::make(std::move(t));
}

tensor stand_in(const std::shared_ptr<detail::device_core>& core, std::vector<std::size_t> shape, element_type type) {
    auto t = std::make_unique<tensor::impl>();
    t->core = core;
    describe(*t, std::move(shape), type, core->dev->info(), "stand-in");
    t->wrapped = true;  // never viewed as qkv's own memory
    return tensor_access::make(std::move(t));
}

tensor::impl& tensor_access::of(const tensor& t, const char* what) {
    if (!t.impl_) throw qkv::error(std::string(what) + ": an empty (or moved-from) qkv::vulkan::tensor");
    return *t.impl_;
}

namespace {

std::vector<std::size_t> without_ones(const std::vector<std::size_t>& shape) {
    std::vector<std::size_t> s;
    for (const std::size_t d : shape)
        if (d != 1) s.push_back(d);
    return s;
}

}  // namespace

const tensor::impl& expect_tensor(const tensor& t, const char* op, const char* what,
                                  const std::shared_ptr<detail::device_core>& core,
                                  const std::vector<std::size_t>& shape, element_type type) {
    const tensor::impl& ti = tensor_access::of(t, op);
    const std::string named = std::string(op) + ": the " + what + " tensor";
    if (ti.core != core) throw qkv::invalid_argument(named + " is on another device");
    if (without_ones(ti.shape) != without_ones(shape) || ti.type != type)
        throw qkv::invalid_argument(named + " is " + shape_string(ti.shape) + " " + std::string(to_string(ti.type)) +
                                    "; " + op + " needs " + shape_string(shape) + " " + std::string(to_string(type)) +
                                    " (row-major; dimensions of 1 may be left out or added, none reordered)");
    return ti;
}

void refuse_overlap(const char* op, std::initializer_list<tensor_use> uses) {
    const auto range = [](const tensor_use& u) {
        return u.t ? std::tuple{u.t->handle, u.t->offset, u.t->bytes} : std::tuple{u.handle, u.offset, u.bytes};
    };
    for (auto a = uses.begin(); a != uses.end(); ++a) {
        if (!std::get<0>(range(*a))) continue;  // absent, or a stand-in (no memory)
        for (auto b = a + 1; b != uses.end(); ++b) {
            if (!std::get<0>(range(*b)) || (!a->written && !b->written)) continue;
            const auto [ha, oa, na] = range(*a);
            const auto [hb, ob, nb] = range(*b);
            if (ha == hb && oa < ob + nb && ob < oa + na)
                throw qkv::invalid_argument(std::string(op) + ": the " + a->what + " and " + b->what +
                                            " tensors overlap in one VkBuffer (bytes [" + std::to_string(oa) + ", " +
                                            std::to_string(oa + na) + ") and [" + std::to_string(ob) + ", " +
                                            std::to_string(ob + nb) + ")), and " + op +
                                            " writes one of them; nothing is computed in place");
        }
    }
}

tensor::tensor() noexcept = default;
tensor::tensor(std::unique_ptr<impl> i) noexcept : impl_(std::move(i)) {}
tensor::~tensor() = default;
tensor::tensor(tensor&&) noexcept = default;
tensor& tensor::operator=(tensor&&) noexcept = default;

void describe(tensor::impl& t, std::vector<std::size_t> shape, element_type type, const device_info& info,
              const char* what) {
    const std::string named = what;
    if (!is_known(type))
        throw qkv::invalid_argument(named + ": unknown element type (" + std::to_string(static_cast<int>(type)) + ")");
    if (type == element_type::f16 && !info.fp16_storage)
        throw unavailable(named +
                          ": f16 tensors need 16-bit storage buffers (storageBuffer16BitAccess): " + lacks(info));
    if (shape.empty()) throw qkv::invalid_argument(named + ": a shape of no dimensions");
    std::size_t n = 1;
    for (const std::size_t d : shape) {
        if (d == 0) throw qkv::invalid_argument(named + ": shape " + shape_string(shape) + " has a zero");
        if (n > SIZE_MAX / d / 4) throw qkv::invalid_argument(named + ": shape " + shape_string(shape) + " overflows");
        n *= d;
    }
    if (is_quantized(type) && shape.back() % block_size(type) != 0)
        throw qkv::invalid_argument(named + ": a " + std::string(to_string(type)) +
                                    " tensor stores rows of blocks of " + std::to_string(block_size(type)) +
                                    " values: its last dimension (" + std::to_string(shape.back()) +
                                    ") must be a multiple of " + std::to_string(block_size(type)));
    t.shape = std::move(shape);
    t.type = type;
    t.elements = n;
    t.bytes = bytes_for(type, n);
    t.reach = align_up(t.bytes, 4);               // whole words (tensor_impl.hpp); wrap() cuts it to the caller's range
    if (t.reach > info.max_storage_buffer_range)  // bound as whole words
        throw limit_exceeded(named + ": " + std::to_string(t.reach) + " bytes, more than " + info.name +
                             "'s maxStorageBufferRange of " + std::to_string(info.max_storage_buffer_range));
}

tensor::tensor(context& ctx, std::vector<std::size_t> shape, element_type type) {
    auto t = std::make_unique<impl>();
    t->core = alive(ctx.impl_).core;
    describe(*t, std::move(shape), type, t->core->dev->info(), "qkv::vulkan::tensor");
    std::lock_guard lock(t->core->mutex);
    t->core->check_alive();
    t->owned = t->core->alloc->create(t->reach, memory_use::device, "tensor", VK_BUFFER_USAGE_UNIFORM_TEXEL_BUFFER_BIT);
    t->handle = t->owned.handle();
    impl_ = std::move(t);
}

const std::vector<std::size_t>& tensor::shape() const { return tensor_access::of(*this, "tensor::shape").shape; }
element_type tensor::type() const { return tensor_access::of(*this, "tensor::type").type; }
std::size_t tensor::elements() const { return tensor_access::of(*this, "tensor::elements").elements; }
std::uint64_t tensor::bytes() const { return tensor_access::of(*this, "tensor::bytes").bytes; }
bool tensor::wraps_caller_memory() const { return tensor_access::of(*this, "tensor::wraps_caller_memory").wrapped; }

namespace {

/// Host bytes into the tensor, written by `write` (which may refuse before anything is written):
/// the tensor's own mapped memory, or a staging buffer and a copy. Waits until the device has them.
template <class Write>
void put_bytes(tensor::impl& t, const char* who, const Write& write) {
    require_usage(t, VK_BUFFER_USAGE_TRANSFER_DST_BIT, "VK_BUFFER_USAGE_TRANSFER_DST_BIT", who, "target");
    device_core& core = *t.core;
    std::lock_guard lock(core.mutex);
    core.check_alive();
    core.guarded(who, [&] {
        if (!t.wrapped && t.owned.mapped()) {
            write(t.owned.mapped());
            t.owned.flush();
            return;  // the next submit makes it visible
        }
        // A staging buffer written first: nothing reaches the tensor if a value is refused.
        buffer staging = core.alloc->create(t.bytes, memory_use::upload, "tensor upload staging");
        write(staging.mapped());
        staging.flush();
        executor& exec = *core.exec;
        exec.begin();
        exec.copy(staging.handle(), 0, t.handle, t.offset, t.bytes);
        exec.barrier(VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                     VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT);
        (void)exec.submit_and_wait();
    });
}

/// The tensor's bytes, handed to `read` (its own mapped memory, or a staging copy). Waits for the
/// device.
template <class Read>
void get_bytes(const tensor::impl& t, const char* who, const Read& read) {
    if (t.wrapped || !t.owned.mapped())
        require_usage(t, VK_BUFFER_USAGE_TRANSFER_SRC_BIT, "VK_BUFFER_USAGE_TRANSFER_SRC_BIT", who, "source");
    device_core& core = *t.core;
    std::lock_guard lock(core.mutex);
    core.check_alive();
    core.guarded(who, [&] {
        if (!t.wrapped && t.owned.mapped()) {
            t.owned.invalidate();
            read(t.owned.mapped());
            return;
        }
        buffer staging = core.alloc->create(t.bytes, memory_use::readback, "tensor download staging");
        executor& exec = *core.exec;
        exec.begin();
        // Whatever wrote the tensor last (a compute shader of qkv's or the caller's, a copy).
        exec.barrier(VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                     VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT,
                     VK_ACCESS_TRANSFER_READ_BIT);
        exec.copy(t.handle, t.offset, staging.handle(), 0, t.bytes);
        exec.barrier(VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT, VK_PIPELINE_STAGE_HOST_BIT,
                     VK_ACCESS_HOST_READ_BIT);
        (void)exec.submit_and_wait();
        staging.invalidate();
        read(staging.mapped());
    });
}

void expect_count(const tensor::impl& t, std::size_t count, const char* who) {
    if (count != t.elements)
        throw qkv::invalid_argument(std::string(who) + ": " + std::to_string(count) + " values for a tensor of " +
                                    shape_string(t.shape) + " = " + std::to_string(t.elements) + " elements");
}

/// An i32 tensor for the int32 forms, a float one for the others.
void expect_ints(const tensor::impl& t, bool ints, const char* who) {
    if ((t.type == element_type::i32) != ints)
        throw qkv::invalid_argument(std::string(who) + ": the tensor is " + std::string(to_string(t.type)) +
                                    (ints ? "; int32 values go into i32 tensors only"
                                          : "; an i32 tensor holds int32 values (upload(std::span<const "
                                            "std::int32_t>), download_int32)"));
}

}  // namespace

void tensor::upload(std::span<const float> values) {
    impl& t = tensor_access::of(*this, "tensor::upload");
    expect_ints(t, false, "tensor::upload");
    expect_count(t, values.size(), "tensor::upload");
    std::vector<std::byte> blocks;  // a quantized tensor's, made (and every value checked) first
    if (t.quantized()) {
        blocks.resize(t.bytes);
        quantize(t.type, values, blocks);
    }
    put_bytes(t, "tensor::upload", [&](std::byte* at) {
        if (t.quantized())
            std::memcpy(at, blocks.data(), blocks.size());
        else if (t.type == element_type::f16)
            put_halves(at, values, "tensor::upload: value");
        else
            put_floats(at, values);
    });
}

void tensor::upload(std::span<const std::int32_t> values) {
    impl& t = tensor_access::of(*this, "tensor::upload");
    expect_ints(t, true, "tensor::upload");
    expect_count(t, values.size(), "tensor::upload");
    put_bytes(t, "tensor::upload", [&](std::byte* at) {
        for (std::size_t i = 0; i < values.size(); ++i) {  // little-endian words, whatever the host's order
            const auto u = static_cast<std::uint32_t>(values[i]);
            const std::byte word[4] = {std::byte(u & 0xffu), std::byte((u >> 8) & 0xffu), std::byte((u >> 16) & 0xffu),
                                       std::byte(u >> 24)};
            std::memcpy(at + 4 * i, word, 4);
        }
    });
}

std::vector<float> tensor::download() const {
    const impl& t = tensor_access::of(*this, "tensor::download");
    expect_ints(t, false, "tensor::download");
    std::vector<float> out(t.elements);
    get_bytes(t, "tensor::download", [&](const std::byte* from) {
        if (t.quantized()) {
            dequantize(t.type, std::span<const std::byte>(from, t.bytes), out);
        } else if (t.type == element_type::f16) {
            qkv::from_half_bits({reinterpret_cast<const std::uint16_t*>(from), t.elements}, out);
        } else {
            std::memcpy(out.data(), from, t.bytes);
        }
    });
    return out;
}

std::vector<std::int32_t> tensor::download_int32() const {
    const impl& t = tensor_access::of(*this, "tensor::download_int32");
    expect_ints(t, true, "tensor::download_int32");
    std::vector<std::int32_t> out(t.elements);
    get_bytes(t, "tensor::download_int32", [&](const std::byte* from) {
        for (std::size_t i = 0; i < t.elements; ++i) {
            const auto b = [&](std::size_t k) { return std::to_integer<std::uint32_t>(from[4 * i + k]); };
            out[i] = static_cast<std::int32_t>(b(0) | (b(1) << 8) | (b(2) << 16) | (b(3) << 24));
        }
    });
    return out;
}

}  // namespace qkv::vulkan
