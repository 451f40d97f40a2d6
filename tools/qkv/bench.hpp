// `qkv bench`, shared between its parts: bench.cpp (options, the sweep, the run),
// bench_measure.cpp (timing one configuration), bench_table.cpp (the printed tables) and
// bench_json.cpp (the --json file).
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <ctime>
#include <iosfwd>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "option_flags.hpp"
#include "qkv/runtime/element_type.hpp"
#include "qkv/runtime/options.hpp"
#include "qkv/runtime/sdpa.hpp"
#include "qkv/vulkan/context.hpp"

namespace qkv::cli::bench {

using json = nlohmann::ordered_json;

struct options {
    /// The size flags as given (--batch, --heads, --seq, --dim, --kv-seq, --kv-heads, --dim-v), each
    /// a comma-separated list; parsed and checked into the numbers below before any work.
    std::vector<std::string> batch_text, heads_text, seq_text, dim_text, kv_seq_text, kv_heads_text, dim_v_text;
    std::vector<std::size_t> batch, heads, seq, dim, kv_seq, kv_heads;
    std::vector<std::string> impl, split;
    /// The flags of sdpa_options (option_flags.hpp): --causal, --precision, --kernel, --window,
    /// --softcap, ... each a row's value or a sweep of them.
    option_inputs flags;
    std::vector<std::size_t> dim_v;  // sdpa: Ev (default: d)
    bool sinks = false;              // sdpa: one sink logit per query head
    bool decode = false;             // time context::sdpa against a kv_cache instead of attention()
    bool backward = false;           // time context::sdpa_backward beside context::sdpa
    std::size_t layers = 0;  // with decode: one token of this many layers, host calls against one recorded sequence
    std::size_t varlen = 0;  // a ragged batch of this many sequences: one ragged call, separate calls, padding
    std::size_t serve = 0;   // a decode step of this many sequences: one paged call, separate calls, padding
    int repeat = 0;          // 0: chosen for the device
    int warmup = -1;         // -1: chosen for the device
    std::string device, json_file;
    bool skip_ceiling = false;
    std::uint64_t seed = 20261122;
    /// With serve: every sequence begins with a common prompt of this many rows in shared pages.
    std::size_t shared_prefix = 0;
    /// With serve and shared_prefix: a second level of shared pages after the prompt, this many
    /// rows, shared within each of prefix_groups groups of consecutive sequences (a prefix tree).
    std::size_t prefix_tree = 0, prefix_groups = 8;
    /// With serve: also the batched call over device tensors (paged_call::run) and recorded in a sequence.
    bool recorded = false;
    /// Every flag the command line gave ("--window", "--batch", ...), for the mode's check: each
    /// mode honours the flags its row of bench.cpp's mode table lists and refuses the others.
    std::vector<std::string> given;
};

/// One row of the sweep: a shape, how it runs, and its sdpa_options (attention rows take their
/// causal, precision, kernel and scale).
struct config {
    std::size_t batch = 1, heads = 1, seq = 0, dim = 0;
    qkv::implementation impl = qkv::implementation::fused;
    // decode: seq is the query rows per head (L), kv_seq the keys in the cache, kv_heads its heads
    bool decode = false;
    std::size_t kv_seq = 0, kv_heads = 0;
    bool split = true;      // decode: the split-S kernels choose their chunks (false: one chunk)
    bool host_kv = false;   // with decode: sdpa with K and V from the host (--kv-seq without --decode)
    std::size_t dim_v = 0;  // Ev (0: dim)
    bool sinks = false;
    qkv::sdpa_options options{};
    [[nodiscard]] std::size_t ev() const { return dim_v ? dim_v : dim; }
    /// A decode or host-K/V row's shape: seq query rows per head against kv_seq keys of kv_heads heads.
    [[nodiscard]] qkv::sdpa_shape decode_shape() const {
        return {.batch = batch,
                .q_heads = heads,
                .kv_heads = kv_heads,
                .q_len = seq,
                .kv_len = kv_seq,
                .d_qk = dim,
                .d_v = ev()};
    }
    [[nodiscard]] bool windowed() const { return options.window_left >= 0 || options.window_right >= 0; }
};

/// The options an sdpa row of the bench starts from: bottom-right alignment (a decoder's).
qkv::sdpa_options sdpa_base();

/// The rules of an sdpa configuration beyond its shape, causal, precision and kernel, compact
/// ("window_left 4095 window_right 0 softcap 10 kv_type q8_0 sinks"), or "-".
std::string rules_of(const config& c);

struct summary {
    double median = 0, min = 0, max = 0;
};

struct result {
    config c{};
    bool ran = false;
    std::string skipped;  // why not, when !ran
    summary attention_ms, projection_ms, call_ms;
    double attention_gflops = 0, projection_gflops = 0;
    double percent_of_fma = 0;
    double kv_gb_per_s = 0;  // decode: K and V bytes read per second of the attention phase
    std::uint64_t peak_bytes = 0;
    bool device_clock = false;
    qkv::kernel_family ran_kernel = qkv::kernel_family::automatic;  // the family that ran
};

summary summarise(std::vector<double> v);
std::string fixed(double value, int decimals);
std::string sig3(double value);  ///< three significant digits
std::string describe(const config& c);
std::string impl_name(const config& c, qkv::kernel_family ran);
double attention_flops(const config& c);
double projection_flops(const config& c);
double kv_bytes(const config& c);  ///< decode: K and V bytes one call reads

// bench_measure.cpp
result run_config(qkv::vulkan::context& ctx, const config& c, int warmup, int repeat, std::uint64_t seed,
                  double fma_gflops);
/// A decode configuration: a kv_cache of c.kv_seq rows on ctx (a context whose
/// max_decode_chunks is 1 for c.split == false), q from the host each call.
result run_decode(qkv::vulkan::context& ctx, const config& c, int warmup, int repeat, std::uint64_t seed,
                  double fma_gflops);
/// sdpa with q, k and v from the host (c.decode and c.host_kv): cross-attention, GQA, decode
/// shapes through context::sdpa(problem).
result run_sdpa_host(qkv::vulkan::context& ctx, const config& c, int warmup, int repeat, std::uint64_t seed,
                     double fma_gflops);
summary tiny_example(qkv::vulkan::context& ctx, int calls);

// bench_layers.cpp
/// `--decode --layers N`: one token of N decode layers (L = 1 against S keys).
struct layers_config {
    std::size_t layers = 0, q_heads = 32, kv_heads = 8, kv_len = 1024, dim = 128;
    qkv::precision precision = qkv::precision::fp32;
};
/// Times N host calls against N calls recorded into one command buffer (qkv::vulkan::sequence),
/// per token, on the same data; prints both and returns them as JSON ({"host_ms", "recorded_ms"}).
json run_layers(qkv::vulkan::context& ctx, const layers_config& c, int warmup, int repeat, std::uint64_t seed,
                std::ostream& os);

// bench_backward.cpp
/// `--backward`: the backward pass beside the forward, for every N, d and option set.
struct backward_config {
    std::size_t batch = 1, heads = 1, kv_heads = 1;
    std::vector<std::size_t> seq, dim;
    std::vector<qkv::sdpa_options> options;
};
/// Times context::sdpa (with its lse) and context::sdpa_backward (from the saved out and lse) in
/// turn on the same data; prints a table and returns it as JSON ({"rows": [{"forward_ms",
/// "backward_ms", "backward_over_forward", ...}]}).
json run_backward(qkv::vulkan::context& ctx, const backward_config& c, int warmup, int repeat, std::uint64_t seed,
                  std::ostream& os);
// bench_varlen.cpp
/// `--varlen B`: a ragged batch of B causal sequences (L_b = S_b), lengths log-uniform in [16, max_len];
/// `--serve B` (bench_serve.cpp): B sequences decoding one token each against as many cached keys.
struct varlen_config {
    std::size_t batch = 0, q_heads = 8, kv_heads = 8, max_len = 512, dim = 64;
    std::size_t shared_prefix = 0;  ///< --serve: rows of a common prompt every sequence begins with
    std::size_t prefix_tree = 0;    ///< --serve: rows of a second level, shared within each group
    std::size_t prefix_groups = 8;  ///< --serve: the second level's groups of consecutive sequences
    bool recorded = false;          ///< --serve: the paged_call forms too (over tensors, in a sequence)
    qkv::precision precision = qkv::precision::fp32;
    std::optional<qkv::element_type> kv_type;  ///< --serve: how the caches store K and V (unset: by precision)
};
/// The seeded draws of a --varlen or --serve batch, from one generator: the B sequence lengths,
/// log-uniform in [16, max_len], then N(0, 1) values (and the pages' shuffle, through rng).
struct batch_draws {
    explicit batch_draws(std::uint64_t seed) : rng(seed) {}
    std::vector<std::size_t> lengths(const varlen_config& c);
    std::vector<float> values(std::size_t n);
    std::mt19937_64 rng;
    std::normal_distribution<float> normal{0.0f, 1.0f};
};
/// The options of a --varlen or --serve call: causal, aligned bottom-right, at c.precision, K and V
/// stored as c.kv_type.
qkv::sdpa_options batch_options(const varlen_config& c);
/// Wall milliseconds since `t`; process CPU milliseconds since `c` (std::clock: the host thread and
/// lavapipe's worker threads alike).
double ms_since(std::chrono::steady_clock::time_point t);
double cpu_ms_since(std::clock_t c);
/// Times one ragged call (context::sdpa over a varlen_problem), B separate calls and one call
/// padded to the longest, in turn on the same data; prints them with tokens/s and returns them as
/// JSON ({"ragged_ms", "separate_ms", "padded_ms", ...}).
json run_varlen(qkv::vulkan::context& ctx, const varlen_config& c, int warmup, int repeat, std::uint64_t seed,
                std::ostream& os);
// bench_serve.cpp
/// Times one batched paged call (context::sdpa over a paged_problem), B separate calls against
/// per-sequence kv_caches and one call against a cache padded to the longest, in turn on the same
/// data; prints them with tokens/s and returns them as JSON ({"paged_ms", "separate_ms", ...}).
json run_serve(qkv::vulkan::context& ctx, const varlen_config& c, int warmup, int repeat, std::uint64_t seed,
               std::ostream& os);

// bench_table.cpp
void print_header(std::ostream& os, const options& o, const qkv::vulkan::device_info& info, const std::string& date);
/// The results table, and the fused-against-staged and split-against-unsplit ratios; returns the
/// ratios as JSON.
json print_results(std::ostream& os, const options& o, const qkv::vulkan::device_info& info,
                   const std::vector<result>& results);

// bench_json.cpp
json device_json(const qkv::vulkan::device_info& d);
json summary_json(const summary& s);
json results_json(const options& o, const qkv::vulkan::device_info& info, const std::vector<result>& results);

}  // namespace qkv::cli::bench
