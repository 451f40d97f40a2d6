// The run skeleton: every operation (run_attention, run_sdpa, run_decode) is the same short list
// of named steps over a run_session:
//
//   plan      a pure function of the problem's shapes and options, the device description and the
//             settings (plan/attention_plan.hpp, plan/sdpa_plan.hpp): routes, kernels, tiles, buffer
//             sizes, downloads
//   check     the host's part of the overflow rule (range_guard.hpp, sdpa_guard.hpp)
//   prepare   run_session(env, plan.buffers, plan.downloads): the buffers, by role (run/io.hpp)
//   write     the inputs packed at the plan's offsets (run/io.hpp's put_*)
//   record    begin() (the upload), the operation's kernels, finish() (the download), submit
//   read      read() each download; the verdicts after the readback; assemble the result
//
// A host call's frame (context::impl::host_call, api/context_impl.hpp) holds the lock, the
// device-loss bookkeeping and the statistics around each; a planned call over tensors
// (api/planned_call.hpp) records the same steps into a command buffer instead.
#pragma once

#include <span>
#include <vector>

#include "api/device_core.hpp"
#include "kernels/flash_cpu.hpp"
#include "kernels/paged_plan.hpp"
#include "kernels/sdpa_decode.hpp"
#include "plan/sdpa_plan.hpp"
#include "plan/settings.hpp"
#include "qkv/runtime/paged.hpp"
#include "qkv/runtime/problem.hpp"
#include "qkv/runtime/sdpa_backward.hpp"
#include "run/io.hpp"
#include "run/sdpa_guard.hpp"

namespace qkv::vulkan::detail {

/// What a run works with: the shared device, the context's settings and buffers.
struct run_env {
    device_core& core;
    const settings& set;
    run_buffers& buffers;
};

/// Device times of a call's phases (0 without timestamps).
struct phase_times {
    double device_ms = 0;  ///< the whole command buffer
    double projection_ms = 0, attention_ms = 0, output_projection_ms = 0;
    double backward_dq_ms = 0, backward_dkdv_ms = 0;  ///< of a backward call's attention_ms
    bool device_range_check = false;                  ///< the attention's range guard ran on the device
};

template <class Output>
struct run_result {
    Output output;
    phase_times times;
};

/// The tag of a run_session that is one of several problems in the executor's command buffer.
struct shared_command_buffer {};

/// One call's commands over a set of call buffers: a host call (the core's executor and the
/// context's buffers: begin() uploads, submit() downloads and waits), one part of a host call that
/// runs several problems (run_sdpa_batch: its own buffers; begin() and finish() record its upload
/// and download into the executor, which the caller begins and submits), or a recording (a caller's
/// command buffer through an external_recorder, the recording's own buffers; nothing submitted).
class run_session {
public:
    /// A host call: prepares the buffers the plan asks for (run_buffers::prepare).
    run_session(run_env& env, const buffer_plan& buffers, std::span<const download> downloads);
    /// A part of a host call, over `buffers` (prepared here as a host call's).
    run_session(run_env& env, run_buffers& buffers, const buffer_plan& plan, std::span<const download> downloads,
                shared_command_buffer);
    /// A recording into `rec` over `buffers` (prepared here, device-only: no staging, no downloads).
    run_session(device_core& core, recorder& rec, run_buffers& buffers, const buffer_plan& plan);

    /// Where the inputs are written before begin().
    [[nodiscard]] std::byte* inputs() const { return buffers_.inputs(); }
    /// Starts the command buffer with the upload of the inputs; marks "inputs on the device". A
    /// part records its upload only.
    void begin();
    /// Records the download (submit() does, then submits): a part's last step.
    void finish();
    /// Ends a phase (a timestamp; see executor::mark).
    void mark() const { exec().mark(); }
    /// Records the download, submits, waits; returns the device time and each phase's (from the
    /// marks: inputs, then the phases in order).
    phase_times submit();
    /// After submit(): the bytes of download i.
    void read(std::size_t i, void* to) const { buffers_.read(downloads_, i, to); }

    /// Where the commands go.
    [[nodiscard]] recorder& rec() const { return rec_; }
    /// The executor of a host call (its marks); an internal error for a recording.
    [[nodiscard]] executor& exec() const;
    [[nodiscard]] pipeline_set& pipes() const { return *core_.pipes; }
    [[nodiscard]] const device& dev() const { return *core_.dev; }
    [[nodiscard]] allocator& alloc() const { return *core_.alloc; }
    [[nodiscard]] run_buffers& buffers() const { return buffers_; }
    [[nodiscard]] bool recording() const { return &rec_ != static_cast<recorder*>(core_.exec.get()); }

private:
    device_core& core_;
    recorder& rec_;
    run_buffers& buffers_;
    buffer_plan plan_;
    std::span<const download> downloads_;
    bool part_ = false;
};

run_result<attention_output> run_attention(run_env& env, const attention_problem& problem);

struct plan;
/// What an attention call's buffers hold (by role) and what the host reads back.
void attention_buffers(const plan& p, buffer_plan& buffers, std::vector<download>& downloads);

/// Texel views of Q|K|V and of the scores for the staged products' texel variants, and the
/// projection's and the fused cpu family's, made when recording: they must live until the
/// commands have run.
struct staged_views {
    buffer_view qkv, scores;
};
struct attention_views {
    buffer_view projection;
    staged_views staged;
    flash_cpu_views flash;
};

/// The record step of an attention call whose inputs are in the session's buffers: the
/// projection (then the device range guard where `guard`), the fused or staged attention, the
/// output projection, with marks between them on a host call. `v_finite`: every input of the
/// projection is known finite (the staged aggregation may skip its zero-weight rule).
void record_attention(const run_session& s, const plan& p, bool guard, bool v_finite, attention_views& views);

/// Q, K and V from the host: plan_sdpa's route, fused or decode.
run_result<sdpa_output> run_sdpa(run_env& env, const sdpa_problem& problem);

/// K and V of a kv_cache (kv_cache.cpp), as the decode kernels read them: texel views, or (q8_0,
/// q4_0) the blocks' storage bindings.
struct cache_kv {
    VkBufferView k = VK_NULL_HANDLE, v = VK_NULL_HANDLE;
    binding k_blocks{}, v_blocks{};
    decode_rows rows{};  ///< an f16 cache's K and V rows as storage (the cooperative-matrix family; q unset)
    cache_desc desc;
    const kv_stats* stats = nullptr;
};

/// The host's side of one planned sdpa run, made before anything is recorded: the facts of its
/// inputs as stored (the overflow rule applied to them: check_sdpa_scores), the values' scale, and
/// the fused route's copies of Q, K and V rounded to their stored types (empty: used as given).
struct sdpa_prepared {
    sdpa_facts facts;
    float v_scale = 1.0f;
    std::vector<float> q, k, v;
    /// `problem` over the stored copies where there are any.
    [[nodiscard]] sdpa_problem stored(const sdpa_problem& problem) const {
        sdpa_problem s = problem;
        if (!q.empty()) s.q = q;
        if (!k.empty()) s.k = k;
        if (!v.empty()) s.v = v;
        return s;
    }
};

/// The texel views a recorded sdpa run's commands read: they must live until the commands have run.
struct sdpa_views {
    flash_cpu_views flash;  ///< the fused cpu family's
    buffer_view q, k, v;    ///< the decode route's (k and v: host K/V only)
};

/// A planned sdpa run in three steps, so that several can share one command buffer: prepare (the
/// check), record (write the inputs into the session's buffers, begin(): the upload, the route's
/// kernels) and, after the submit, read (the output assembled and scaled back). The fused route's
/// (run_sdpa.cpp) and the decode route's, K and V from the host (cache null) or a cache
/// (run_decode.cpp).
sdpa_prepared prepare_fused(const sdpa_plan& plan, const sdpa_problem& problem);
void record_fused_part(run_session& s, const sdpa_plan& plan, const sdpa_problem& problem, const sdpa_prepared& prep,
                       sdpa_views& views);
sdpa_output read_fused_part(const run_session& s, const sdpa_plan& plan, const sdpa_problem& problem,
                            const sdpa_prepared& prep);
sdpa_prepared prepare_decode(const sdpa_plan& plan, const sdpa_problem& problem, const cache_kv* cache);
void record_decode_part(run_session& s, const sdpa_plan& plan, const sdpa_problem& problem, const sdpa_prepared& prep,
                        const cache_kv* cache, sdpa_views& views);
sdpa_output read_decode_part(const run_session& s, const sdpa_plan& plan, const sdpa_problem& problem,
                             const sdpa_prepared& prep);

/// The decode route of a planned call: K and V from the host (packed into the inputs, `cache`
/// null) or from a cache.
run_result<sdpa_output> run_decode(run_env& env, const sdpa_plan& plan, const sdpa_problem& problem,
                                   const cache_kv* cache);

/// The fused route of a planned call (run_sdpa.cpp).
run_result<sdpa_output> run_fused_sdpa(run_env& env, const sdpa_plan& plan, const sdpa_problem& problem);

/// The write step of the fused route: q, k and v as stored (float32, or float16 where the binding
/// is; V scaled by `v_scale`), the masks and the score params, at the plan's offsets of `in`.
void write_fused_inputs(std::byte* in, const sdpa_plan& plan, const sdpa_problem& problem, float v_scale);

/// The backward pass over host data (run_sdpa_backward.cpp): the forward first where out or lse
/// is not given, then the backward kernels.
run_result<sdpa_gradients> run_sdpa_backward(run_env& env, const sdpa_backward_problem& problem);
/// The most problems run_sdpa_batch records into one command buffer.
inline constexpr std::size_t max_batch_parts = 64;

/// Several sdpa problems (Q, K and V from the host) in one command buffer per max_batch_parts, one
/// submit each: the sequences of a ragged batch. Each is planned by plan_sdpa (its own route and
/// family) and checked before anything is recorded, so a refusal leaves nothing begun; each runs
/// over its own buffers, parts[i] (kept by the caller between calls, grown to at most
/// max_batch_parts), so the parts need no barrier between them. The outputs in order;
/// times.device_ms is the command buffers'.
run_result<std::vector<sdpa_output>> run_sdpa_batch(run_env& env, std::span<const sdpa_problem> problems,
                                                    std::vector<run_buffers>& parts);

/// Where a call's masks and score params (contract/score.h, put_score_params) are (the plan's
/// regions of the inputs, or a planned call's constants); an empty binding where there is no such
/// mask. The params are always there.
struct mask_bindings {
    binding bits, additive, params;
};
/// The plan's mask and params regions of `b`.
mask_bindings masks_in(const sdpa_plan& plan, const buffer& b);

/// The record step of the fused route, over the session's buffers as `plan` lays them out: the
/// chosen family's kernel, then the weights kernel where asked. `views`: the cpu family's texel
/// views, made here; they must live until the command buffer has run. `v_finite`: the host saw
/// every input finite (the cpu family then needs no careful pipeline).
void record_fused_sdpa(const run_session& s, const sdpa_plan& plan, const mask_bindings& masks, flash_cpu_views& views,
                       bool v_finite = false);

/// The record step of the decode route: the decode kernel and the merge over q, k and v texel
/// views (or, for quantized K and V, their blocks' bindings), the masks and params, the session's
/// partials and output (and the lse where the plan asks for it).
/// `values` with `gate`: whether V may hold NaN or Inf, or (decode_values::gated) the flags word
/// that says so on the device. `out`: where the output goes instead of the session's (a caller's
/// float32 tensor of the same layout, bound from an aligned offset).
/// `rows`: q, k and v as float16 rows in storage buffers, which the cooperative-matrix family reads.
/// `guard`: the overflow guard's passes the merge runs too (a call over device tensors), or none.
void record_decode_sdpa(const run_session& s, const sdpa_plan& plan, const sdpa_problem& problem, VkBufferView q,
                        VkBufferView k, VkBufferView v, const mask_bindings& masks, float v_scale, decode_values values,
                        binding k_blocks = {}, binding v_blocks = {}, binding gate = {}, binding out = {},
                        const decode_rows& rows = {}, const merge_guard* guard = nullptr);

/// A paged batch's pool on the device: a kv_cache of one batch whose rows are the pages' rows
/// (page p is rows p·page_size onwards of each K/V head), its texel views (f32, f16) or its
/// blocks' bindings (q8_0, q4_0: rows of ggml's blocks), rows per K/V head (the cache's capacity),
/// its storage type and the statistics of its rows.
struct paged_pool {
    VkBufferView k = VK_NULL_HANDLE, v = VK_NULL_HANDLE;
    binding k_blocks{}, v_blocks{};
    std::uint32_t rows = 0;
    element_type type = element_type::f32;
    const kv_stats* stats = nullptr;  ///< of every row, the appended ones included
    /// For appends (f32, f16): K's and V's storage as 32-bit words from an aligned offset, and the
    /// word of row 0 of each within it; empty where the pool takes none (q8_0 / q4_0: k_blocks and
    /// v_blocks, written by transfer copies).
    binding k_store{}, v_store{};
    std::uint64_t k_word = 0, v_word = 0;
};

/// New rows written into the pool before the decode (resolve_pages' k_rows, v_rows, rows_at): per
/// K/V head (Hkv, n, E / Ev), row r to pool row rows_at[r]. For a q8_0 / q4_0 pool, the same rows
/// as ggml's blocks (put_block_rows, run/kv_storage.hpp: Hkv·n rows of bytes_for(type, E / Ev)
/// bytes), which are what is written.
struct paged_append {
    std::span<const float> k{}, v{};
    std::span<const std::size_t> rows_at{};
    std::span<const std::byte> k_blocks{}, v_blocks{};
};

/// The host side of a paged batch's decode, made before anything is recorded (every limit checked):
/// the plan, the work words, and where the inputs go. `whole` is the batch as one problem of shape
/// (1, Hq, Hkv, total_q, max(longest, 1), E, Ev) with its options, sinks and slopes (the score
/// params, the overflow rule). The inputs: q's texels at 0 (total_q·Hq rows of e4 texels), then
/// the block table, the work words and the score params, each at its offset.
struct paged_layout {
    paged_plan plan;
    sdpa_problem whole;
    std::uint32_t longest = 0, page_shift = 0;
    std::uint64_t total_q = 0, token_base = 0, item_base = 0;
    std::vector<std::uint32_t> words;
    std::uint64_t q_bytes = 0, table_at = 0, table_bytes = 0, words_at = 0, words_bytes = 0, params_at = 0,
                  params_bytes = 0, out_bytes = 0, lse_at = 0, lse_bytes = 0;
    buffer_plan buffers;  ///< role::inputs (all of the above), the partials, role::out (out, then lse)
};
/// Plans a validated paged batch (k_pages, v_pages and q may be empty: only their sizes are used)
/// against a pool of `pool_rows` rows per K/V head of `pool_type`. Throws limit_exceeded past the
/// device's limits. `bounds`: the problem's lengths are upper bounds (the lengths are a device
/// tensor, read when the commands run): no sequence's first key is planned from a window, no
/// shared prefix, and every bound within the positions the kernels take unreduced.
paged_layout plan_paged_call(const device& dev, const settings& set, const paged_problem& problem,
                             std::uint32_t pool_rows, element_type pool_type, bool bounds = false);
/// Writes the block table, the work words and the score params at the layout's offsets of the
/// inputs, less `from`, into `to` (host-visible memory up to the params' end; q's texels not written).
void put_paged_words(std::byte* to, const paged_layout& layout, const paged_problem& problem, std::uint64_t from = 0);
/// What the paged kernels bind: q's texels, the table, the work words and the score params; the
/// gate word (DECODE_VALUES_GATED: whether V may hold NaN or Inf), the partials, out and lse.
struct paged_bindings {
    binding q, table, work, params, gate, stats, acc, out, lse;
};
/// Records the paged decode's dispatch (none without work items), a barrier and the merge.
/// `values`: DECODE_VALUES_FINITE, DECODE_VALUES_NONFINITE or DECODE_VALUES_GATED.
void record_paged(recorder& rec, pipeline_set& pipes, const paged_layout& layout, const paged_problem& problem,
                  const paged_pool& pool, const paged_bindings& b, float scale, float v_scale, std::uint32_t values);

/// Records the paged append (shaders/paged_append.comp): `n` new rows per K/V head of K and of V,
/// in the pool's texel form per K/V head (Hkv, n, e4 / ev4 texels) in `k_rows` and `v_rows`, row r
/// to pool row rows_at[r] (n words) through the pool's storage (k_store, v_store). Throws
/// limit_exceeded where a binding passes maxStorageBufferRange or a word index 2^32 - 1, before
/// anything is recorded. No barrier after.
void record_paged_append(recorder& rec, pipeline_set& pipes, const device& dev, const paged_pool& pool,
                         std::uint64_t kv_heads, std::uint64_t n, std::uint32_t e4, std::uint32_t ev4, binding k_rows,
                         binding v_rows, binding rows_at);

/// Where one side (K or V) of a q8_0 / q4_0 append's new rows of ggml's blocks lies: row r of K/V
/// head h at byte at + h·head_stride + r·row_stride of `buffer` (the host call's staged rows per
/// head, or a paged_call's k_new / v_new tensor of (B·new_rows, Hkv) rows).
struct block_source {
    VkBuffer buffer = VK_NULL_HANDLE;
    std::uint64_t at = 0, head_stride = 0, row_stride = 0;
};
/// Records the writes of a q8_0 / q4_0 paged append: the n = rows_at.size() new rows per K/V head
/// of K and of V, row r to pool row rows_at[r] of the pool's blocks, bytes as they are. A row of
/// 34- or 18-byte blocks may end mid-word, which a 32-bit word copy (shaders/paged_append.comp)
/// cannot write without touching its neighbour row: transfer copies take any byte offset, one
/// region per run of rows consecutive in the pool and in the source. Barriers: after earlier
/// compute and transfer reads and writes (of the pool, of the source), and before the decode's
/// compute reads.
void record_block_append(recorder& rec, const block_source& k, const block_source& v, const paged_pool& pool,
                         std::uint64_t kv_heads, std::uint64_t k_row_bytes, std::uint64_t v_row_bytes,
                         std::span<const std::size_t> rows_at);

/// Records the fused rotary embedding (shaders/paged_rotary.comp) in place on `rows` texel rows of
/// `w4` texels (RGBA16F with `half`) in `texels` from texel `at`: row r turned at position
/// pos[(r / pos_div) % pos_mod] of `angles` (cos at float cos_off, sin at sin_off, rotary_dim / 2
/// each per position), as paged.hpp's rotate_rows. No barrier after.
struct paged_rotary {
    std::uint32_t rows = 0, w4 = 0, at = 0;
    bool half = false, interleaved = true;
    std::uint32_t rotary_dim = 0, pos_div = 1, pos_mod = 1, cos_off = 0, sin_off = 0;
};
void record_paged_rotary(recorder& rec, pipeline_set& pipes, binding texels, binding angles, binding positions,
                         const paged_rotary& r);

/// Records the checks of a block table or the lengths on the device (shaders/paged_table.comp,
/// contract/paged.h), flags into word 0 of `flag`. With the lengths on the device (`lengths` bound,
/// `sequences` int32, the call's copy of them): each sequence's length checked against the plan's
/// bound, its work words (`work`, the call's device copy) and spans (`spans`) written from it; then
/// the entries each of `sequences` rows of `table` (sequences x max_pages int32) reads or writes,
/// columns [spans[2b], spans[2b + 1]), against `num_pages`; then, with `n` new rows, their keys in
/// the table (at_in) to pool rows (at_out), none once flagged. A barrier after each dispatch.
struct paged_table_check {
    std::uint32_t sequences = 0, max_pages = 0, page_shift = 0, num_pages = 0, n = 0;
    std::uint32_t new_rows = 0;   ///< rows appended to each sequence (with device lengths)
    bool device_lengths = false;  ///< `lengths` and `work` bound: PAGED_TABLE_LENGTHS first
    bool bottom_right = false;    ///< the offset is each sequence's S_b - L_b
};
struct paged_table_bindings {
    binding table, spans, at_in, at_out, flag, lengths, work;
};
void record_paged_table(recorder& rec, pipeline_set& pipes, const paged_table_bindings& b, const paged_table_check& c);
/// The rotary positions at the device lengths (PAGED_TABLE_POSITIONS): `count` (sequence, position
/// less its length) pairs of `pairs` into `positions`, a barrier after.
void record_paged_positions(recorder& rec, pipeline_set& pipes, const paged_table_bindings& b, std::uint32_t count);

/// Records the claims of the new rows' pool rows (shaders/paged_claim.comp, contract/paged.h), after
/// record_paged_table mapped them into `rows` (n words): each claims its row in `claims` (a uint
/// per pool row of the step's pages, zeroed here where claimed); two claims of one row set
/// PAGED_FLAG_SHARED_ROW in `flag` (its PAGED_FLAG_WORDS words), and then every row is unmapped. A
/// barrier after each dispatch; nothing without new rows.
void record_paged_claim(recorder& rec, pipeline_set& pipes, binding rows, binding claims, binding flag,
                        std::uint32_t n);

/// The batched paged decode of a validated, resolved paged batch (k_pages and v_pages empty; no
/// appends, rotary or cache_batch_idx of its own; cache_leftpad taken) against `pool`, after
/// writing `append`'s rows into it in the same command buffer: one dispatch over the plan's work
/// list (kernels/paged_plan.hpp), then the merge (run_paged.cpp).
run_result<varlen_output> run_paged(run_env& env, const paged_problem& problem, const paged_pool& pool,
                                    const paged_append& append = {});

}  // namespace qkv::vulkan::detail
