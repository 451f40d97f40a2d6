// qkv::vulkan::context: the public host calls, each the run skeleton's frame (context_impl.hpp)
// around a run (run/run.hpp): attention, sdpa, and sdpa against a kv_cache (the decode route with
// the cache's texel views, or for q8_0 / q4_0 its blocks, as K and V).
#include "qkv/vulkan/context.hpp"

#include <mutex>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "api/context_impl.hpp"
#include "api/device_request.hpp"
#include "api/kv_cache_impl.hpp"
#include "plan/settings.hpp"
#include "qkv/runtime/capabilities.hpp"
#include "qkv/runtime/half.hpp"
#include "run/io.hpp"
#include "run/kv_storage.hpp"
#include "run/run.hpp"

namespace qkv::vulkan {

using namespace detail;

context::impl::impl(const context_options& options, const testing::hooks& hooks)
    : core(std::make_shared<device_core>(options, hooks)), set(read_settings(hooks)) {}

context::impl::impl(std::shared_ptr<device_core> shared, const testing::hooks& hooks)
    : core(std::move(shared)), set(read_settings(hooks)) {}

context::impl& context_access::of(const context& c) { return alive(c.impl_); }

context::impl::~impl() {
    // The buffers go back to the shared device under its lock: a cache may be using it.
    std::lock_guard lock(core->mutex);
    buffers.release();
    parts.clear();
}

context::context(const context_options& options) : impl_(std::make_unique<impl>(options, testing::hooks{})) {}
context::context(std::unique_ptr<impl> i) noexcept : impl_(std::move(i)) {}
context::~context() = default;
context::context(context&&) noexcept = default;
context& context::operator=(context&&) noexcept = default;

const device_info& context::device() const { return alive(impl_).core->dev->info(); }

attention_output context::attention(const attention_problem& problem) {
    impl& self = alive(impl_);
    validate(problem);
    require_supported(entry_point::context_attention, problem);
    return self.host_call("attention", [&](run_env& env) { return run_attention(env, problem); });
}

sdpa_output context::sdpa(const sdpa_problem& problem) {
    impl& self = alive(impl_);
    validate(problem);
    require_supported(entry_point::context_sdpa, problem);
    return self.host_call("sdpa", [&](run_env& env) { return run_sdpa(env, problem); });
}

sdpa_output context::sdpa(const sdpa_problem& given, const kv_cache& cache) {
    impl& self = alive(impl_);
    kv_cache::impl& c = *kv_cache_access::of(cache);
    if (c.core != self.core)
        throw qkv::invalid_argument("sdpa with a kv_cache: the cache was created from another context");
    return self.host_call("sdpa with a kv_cache", [&](run_env& env) {
        // Under the lock: the cache's size and rows cannot change during the call.
        c.check_ready("sdpa with a kv_cache", nullptr);
        const sdpa_problem problem = check_against_cache(given, c.layout, c.size, "sdpa with a kv_cache");
        std::vector<feature> asked = features_of(problem);
        for (const feature f : features_of(c.type)) asked.push_back(f);
        require_supported(entry_point::context_decode, asked);
        const sdpa_plan p = plan_sdpa_cache(problem, c.desc(), env.core.dev->desc(), env.set);
        const kv_stats stats = c.read_stats();
        cache_kv kv{c.k_view.handle(), c.v_view.handle(), {}, {}, c.rows(), c.desc(), &stats};
        if (c.blocks()) {
            kv.k_blocks = {c.k_blocks.handle(), 0, c.k_blocks.size()};
            kv.v_blocks = {c.v_blocks.handle(), 0, c.v_blocks.size()};
        }
        return run_decode(env, p, problem, &kv);
    });
}

sdpa_gradients context::sdpa_backward(const sdpa_backward_problem& problem) {
    impl& self = alive(impl_);
    validate(problem);
    require_supported(entry_point::context_sdpa_backward, problem);
    return self.host_call("sdpa_backward", [&](run_env& env) { return run_sdpa_backward(env, problem); });
}

namespace {

/// A validated ragged batch, its capability checked: each sequence as its own sdpa problem.
varlen_output run_ragged(context::impl& self, const varlen_problem& problem, const char* name) {
    return self.host_call(name, [&](run_env& env) {
        // Each sequence as its own sdpa problem (qkv::sequence_of), those with queries and keys run
        // in one command buffer; the rest written here (no queries: nothing; no keys: zeros, lse -inf).
        run_result<varlen_output> run;
        run.output = empty_output(problem);
        run.output.device = env.core.dev->info().name;
        std::vector<basic_varlen_sequence<float>> sequences;
        std::vector<sdpa_problem> problems;
        std::vector<std::size_t> which;
        for (std::size_t b = 0; b < batch_of(problem); ++b) {
            const sdpa_shape s = sequence_shape(problem, b);
            if (s.q_len != 0 && s.kv_len == 0) scatter_sequence<float>(problem, b, {}, {}, run.output);
            if (s.q_len == 0 || s.kv_len == 0) continue;
            sequences.push_back(sequence_of(problem, b));
            which.push_back(b);
        }
        for (const basic_varlen_sequence<float>& s : sequences) problems.push_back(s.problem);
        if (problems.empty()) return run;
        const run_result<std::vector<sdpa_output>> done = run_sdpa_batch(env, problems, self.parts);
        for (std::size_t i = 0; i < which.size(); ++i)
            scatter_sequence<float>(problem, which[i], done.output[i].output, done.output[i].lse, run.output);
        run.times = done.times;
        return run;
    });
}

}  // namespace

varlen_output context::sdpa(const varlen_problem& problem) {
    impl& self = alive(impl_);
    validate(problem);
    require_supported(entry_point::context_varlen, problem);
    return run_ragged(self, problem, "sdpa over a ragged batch");
}

varlen_output context::sdpa(const paged_problem& problem) {
    impl& self = alive(impl_);
    require_supported(entry_point::context_paged, problem);
    const basic_gathered_pages<float> gathered = gather_pages(problem);  // validates
    return run_ragged(self, gathered.problem, "sdpa over a paged K/V batch");
}

namespace {

/// sdpa over a paged problem against a device pool, appending its new rows when `writable`.
varlen_output paged_pool_call(context::impl& self, const paged_problem& given, kv_cache::impl& c, bool writable) {
    if (c.core != self.core)
        throw qkv::invalid_argument("sdpa over a paged K/V pool: the pool was created from another context");
    std::vector<feature> asked = features_of(given);
    for (const feature f : features_of(c.type)) asked.push_back(f);  // the pool's storage
    require_supported(entry_point::context_paged, asked);
    if (given.new_rows != 0 && !writable)
        throw qkv::invalid_argument("sdpa over a paged K/V pool: the problem appends " +
                                    std::to_string(given.new_rows) +
                                    " rows per sequence and the pool is const; pass a kv_cache& to append");
    if (given.new_rows != 0) require_supported(entry_point::paged_append, features_of(c.type));
    return self.host_call("sdpa over a paged K/V pool", [&](run_env& env) {
        // Under the lock: the pool's size and rows cannot change during the call.
        c.check_ready("sdpa over a paged K/V pool", nullptr);
        const kv_layout& l = c.layout;
        const paged_problem problem = c.check_pool(given, true);
        // Validated, appends and rotary resolved: nothing is written before this.
        const basic_resolved_pages<float> resolved = resolve_pages(problem, false);
        paged_pool p = c.pool(nullptr);
        const std::size_t n = resolved.rows_at.size();
        // A q8_0 / q4_0 pool's new rows as ggml's blocks, quantized once, as kv_cache::append does
        // (put_block_rows: qkv::quantize row by row; its refusals name k_new or v_new), before
        // anything is written. The facts of the values the blocks hold join the pool's statistics
        // before they are written (an overestimate is safe; a row the statistics miss is not).
        std::vector<std::byte> k_blocks, v_blocks;
        if (n != 0 && c.blocks()) {
            const std::size_t k_rows = resolved.k_rows.size() / l.d_qk, v_rows = resolved.v_rows.size() / l.d_v;
            k_blocks.resize(k_rows * c.k_row_bytes), v_blocks.resize(v_rows * c.v_row_bytes);
            put_block_rows(
                k_blocks.data(), c.type, resolved.k_rows.data(), k_rows, l.d_qk,
                given.rotary_dim ? "sdpa over a paged K/V pool: k_new (rotated)" : "sdpa over a paged K/V pool: k_new");
            put_block_rows(v_blocks.data(), c.type, resolved.v_rows.data(), v_rows, l.d_v,
                           "sdpa over a paged K/V pool: v_new");
            std::vector<float> k_held(resolved.k_rows.size()), v_held(resolved.v_rows.size());
            dequantize(c.type, k_blocks, k_held);
            dequantize(c.type, v_blocks, v_held);
            kv_stats added;
            added.add(k_held, v_held, l.kv_heads, n, l.d_qk, l.d_v);
            c.stats.invalidate();
            fold_host_rows(c.stats.mapped(), added, c.groups());
            c.stats.flush();
        }
        if (n != 0 && !c.blocks()) {
            if (c.texels_only())
                throw limit_exceeded("sdpa over a paged K/V pool: the pool's K or V passes " +
                                     self.core->dev->info().name + "'s maxStorageBufferRange of " +
                                     std::to_string(self.core->dev->info().max_storage_buffer_range) +
                                     " bytes; appends write it as one storage buffer");
            if (c.half())  // a finite value that float16 cannot hold would become inf: refuse
                for (const auto& [what, data] : {std::pair{"k_new", std::span<const float>(resolved.k_rows)},
                                                 std::pair{"v_new", std::span<const float>(resolved.v_rows)}})
                    if (const std::size_t i = half_overflow_index(data); i < data.size())
                        throw numeric_overflow(std::string("sdpa over a paged K/V pool: ") + what + " holds " +
                                               std::to_string(data[i]) +
                                               (std::string(what) == "k_new" && given.rotary_dim ? " (rotated)" : "") +
                                               ", beyond float16's range (65504) of this fp16 pool; nothing was "
                                               "written");
            // The new rows' facts join the pool's statistics before they are written (an
            // overestimate is safe; a row the statistics miss is not).
            kv_stats added;
            added.add(resolved.k_rows, resolved.v_rows, l.kv_heads, n, l.d_qk, l.d_v);
            c.stats.invalidate();
            fold_host_rows(c.stats.mapped(), added, c.groups());
            c.stats.flush();
            c.bind_stores(p);
        }
        const kv_stats stats = c.read_stats();
        p.stats = &stats;
        return run_paged(env, resolved.problem, p,
                         {resolved.k_rows, resolved.v_rows, resolved.rows_at, k_blocks, v_blocks});
    });
}

}  // namespace

varlen_output context::sdpa(const paged_problem& given, const kv_cache& pool) {
    impl& self = alive(impl_);
    return paged_pool_call(self, given, *kv_cache_access::of(pool), false);
}

varlen_output context::sdpa(const paged_problem& given, kv_cache& pool) {
    impl& self = alive(impl_);
    return paged_pool_call(self, given, *kv_cache_access::of(pool), true);
}

call_stats context::last_call() const {
    impl& self = alive(impl_);
    std::lock_guard lock(self.core->mutex);
    return self.last;
}

std::uint64_t context::device_memory_allocated() const { return alive(impl_).core->alloc->allocated(); }
std::uint64_t context::peak_device_memory() const { return alive(impl_).core->alloc->peak(); }
void context::reset_peak() { alive(impl_).core->alloc->reset_peak(); }

void context::trim() {
    impl& self = alive(impl_);
    std::lock_guard lock(self.core->mutex);
    self.buffers.release();
    self.parts.clear();
}

std::vector<std::string> context::take_validation_messages() { return alive(impl_).core->inst->messages().take(); }

context testing::make_context(const context_options& options, const hooks& h) {
    return context_access::make(std::make_unique<context::impl>(options, h));
}

}  // namespace qkv::vulkan
