// `qkv bench`: how fast qkv's attention runs on a Vulkan device, and how close that is to what the
// device itself can do.
//
// For every configuration of the sweep (B, H, N, d, causal, precision, implementation) it runs
// warm-up calls, then timed calls, and reports the median and the range of the device time of the
// attention phase (GPU timestamps, or the host clock around the whole call where the device has
// none), its throughput in the FlashAttention convention (4·B·H·N²·d FLOP, halved when causal),
// the Q|K|V projection's time and throughput separately (2·B·N·d_in·3·H·d FLOP), and the peak
// device memory the context held. In the same process it measures the device's ceiling (an FMA
// chain and a copy shader) and states each kernel's throughput as a share of it, and it times the
// tutorial's tiny example call against an empty submit-and-wait to show the fixed cost of a call.
//
// `--decode` times context::sdpa against a kv_cache instead: --seq query rows per head (L) against
// --kv-seq keys resident on the device (--kv-heads K/V heads), with the split-S kernels choosing
// their chunks (--split on) and with one chunk (--split off).
//
// Parts: this file (options, the sweep, the run), bench_measure.cpp, bench_table.cpp, bench_json.cpp.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backend.hpp"
#include "bench.hpp"
#include "commands.hpp"
#include "context_parallel.hpp"
#include "errors.hpp"
#include "flag_args.hpp"
#include "names.hpp"
#include "option_flags.hpp"
#include "output_files.hpp"
#include "qkv/runtime/error.hpp"
#include "qkv/runtime/sdpa.hpp"
#include "qkv/version.hpp"
#include "qkv/vulkan/context.hpp"
#include "qkv/vulkan/error.hpp"
#include "qkv/vulkan/testing.hpp"

namespace qkv::cli {
namespace bench {
namespace {

using bench_options = options;

std::string utc_now() {
    const std::time_t t = std::time(nullptr);
    std::tm tm{};
#ifdef _WIN32
    gmtime_s(&tm, &t);
#else
    gmtime_r(&t, &tm);
#endif
    char text[32];
    std::strftime(text, sizeof text, "%Y-%m-%d %H:%M UTC", &tm);
    return text;
}

// ---- Sizes: checked before any work (exit 2, naming the flag and the limit) -------------------
/// The most any size flag takes: qkv's kernels index with 32-bit integers, and the library's
/// plans refuse a dimension beyond 2^31 - 1.
constexpr std::size_t most_size = 0x7fffffff;

struct size_flag {
    const char* name;
    std::vector<std::string> bench_options::*text;
    std::vector<std::size_t> bench_options::*values;
};
constexpr size_flag size_flags[] = {{"--batch", &bench_options::batch_text, &bench_options::batch},
                                    {"--heads", &bench_options::heads_text, &bench_options::heads},
                                    {"--seq", &bench_options::seq_text, &bench_options::seq},
                                    {"--dim", &bench_options::dim_text, &bench_options::dim},
                                    {"--kv-seq", &bench_options::kv_seq_text, &bench_options::kv_seq},
                                    {"--kv-heads", &bench_options::kv_heads_text, &bench_options::kv_heads},
                                    {"--dim-v", &bench_options::dim_v_text, &bench_options::dim_v}};

/// Every size flag as whole numbers from 1 to most_size; before the device is opened.
void parse_sizes(bench_options& o) {
    for (const size_flag& flag : size_flags)
        for (const std::string& text : o.*flag.text)
            (o.*flag.values)
                .push_back(parse_count(flag.name, text, most_size, "size qkv's kernels can index with 32 bits"));
}

/// a x b, or UINT64_MAX where that does not fit: the products below may pass 64 bits before
/// they are refused.
std::uint64_t times(std::uint64_t a, std::uint64_t b) { return b != 0 && a > UINT64_MAX / b ? UINT64_MAX : a * b; }

std::string bytes_text(std::uint64_t bytes) {
    const double mib = static_cast<double>(bytes) / (1024.0 * 1024.0);
    char text[48];
    std::snprintf(text, sizeof text, mib < 1024 ? "%.3g MiB" : "%.3g GiB", mib < 1024 ? mib : mib / 1024);
    return text;
}

/// Every array the bench builds on the host for `c` (float32) goes to the device in one buffer,
/// which the library refuses beyond maxStorageBufferRange (limit_exceeded), but only after the
/// host has built it (or failed to: bad_alloc). Refused here, for every configuration of the
/// sweep, before anything is timed.
void check_fits_device(const config& c, const qkv::vulkan::device_info& info) {
    struct host_array {
        const char* what;
        std::uint64_t floats;
        const char* flags;
    };
    const std::uint64_t width = times(c.heads, c.dim), wide = std::max(c.dim, c.ev());  // d, or Ev if wider
    const host_array arrays[] = {
        {c.decode ? "q and the output (B x H x L x d floats)" : "x and the output (B x N x H*d floats)",
         times(times(times(c.batch, c.seq), c.heads), wide), "--batch, --seq, --heads, --dim or --dim-v"},
        {"each weight matrix (H*d x H*d floats)", c.decode ? 0 : times(width, width), "--heads or --dim"},
        {"k and v (B x Hkv x S x d floats each)",
         c.decode ? times(times(times(c.batch, c.kv_heads), c.kv_seq), wide) : 0,
         "--batch, --kv-heads, --kv-seq, --dim or --dim-v"}};
    for (const host_array& a : arrays) {
        const std::uint64_t bytes = times(a.floats, sizeof(float));
        if (bytes > info.max_storage_buffer_range)
            throw usage_error(describe(c) + ": " + a.what + " needs " + bytes_text(bytes) +
                              ", more than the largest buffer of " + info.name + " (maxStorageBufferRange, " +
                              bytes_text(info.max_storage_buffer_range) + "); lower " + a.flags);
    }
}

/// An sdpa row as the library will check it (qkv::validate_description: its shape, options and
/// sinks; no data): a row the library would refuse, such as q8_0 K/V with d = 48, is refused here
/// (exit 2, the row named) before any row is timed, not after minutes of others.
void check_valid(const config& c) {
    if (!c.decode) return;
    qkv::sdpa_problem p;
    p.shape = c.decode_shape();
    p.options = c.options;
    const std::vector<float> sinks(c.sinks ? c.heads : 0, 0.0f);
    p.sinks = sinks;
    try {
        qkv::validate_description(p);
    } catch (const qkv::invalid_argument& e) {
        throw usage_error(describe(c) + ": " + e.what());
    }
}

/// Progress on stderr, one line per configuration, so stdout holds only the results.
class progress {
public:
    explicit progress(std::size_t total) : total_(total) {}
    void show(std::size_t i, const std::string& what) {
        std::cerr << "qkv bench: [" << i << "/" << total_ << "] " << what << "\n";
        std::cerr.flush();
    }

private:
    std::size_t total_;
};

/// The --json file, written all or nothing (output_files.hpp): reserved (checked, and a temporary
/// created beside it) before any timing, so a bad path fails first; renamed into place only when
/// the whole run succeeded, so a run that fails on the way leaves an existing file as it was.
void reserve_json(output_set& files, const std::string& path) {
    if (path.empty()) return;
    const named_file out{"--json", path};
    check_output_paths({&out, 1}, {});
    files.reserve({path});
}
void write_json(output_set& files, const std::string& path, const json& j) {
    if (path.empty()) return;
    const std::string text = j.dump(2) + "\n";
    files.commit({{path, {}, std::string_view(text)}});
    std::cerr << "qkv bench: wrote " << path << "\n";
}

// ---- What each mode honours: one table; every other flag given is refused (exit 2, named) -----
/// The modes of `qkv bench`, chosen by the flags: --context-parallel, --backward, --varlen (a ragged
/// batch three ways), --serve (a decode step of many sequences four ways), --decode --layers, --decode (a kv_cache),
/// --kv-seq or --kv-heads (sdpa with q, k, v from the host), else attention().
enum class mode { attention, sdpa_host, decode, layers, backward, varlen, serve, context_parallel };

/// The flags every mode takes.
constexpr std::string_view common_flags[] = {"--repeat", "--warmup", "--device", "--json", "--seed", "--no-ceiling"};

/// One mode's row: the option fields (sdpa_option_fields' names; their flags come from the field
/// list) and the bench's own flags it honours, and what it does, for the refusal.
struct mode_row {
    mode m;
    const char* name;
    bool every_option;                          ///< takes every option field with a bench flag
    std::span<const std::string_view> options;  ///< else these
    std::span<const std::string_view> flags;    ///< the bench's own flags it takes
    const char* does;                           ///< "times ...": why the others do not apply
};

constexpr std::string_view attention_options[] = {"scale", "causal", "precision", "kernel"};
constexpr std::string_view attention_flags[] = {"--batch", "--heads", "--seq", "--dim", "--impl"};
constexpr std::string_view host_flags[] = {"--batch",  "--heads",    "--seq",   "--dim",
                                           "--kv-seq", "--kv-heads", "--dim-v", "--sinks"};
constexpr std::string_view decode_flags[] = {"--batch",    "--heads", "--seq",   "--dim",   "--kv-seq",
                                             "--kv-heads", "--dim-v", "--sinks", "--split", "--decode"};
constexpr std::string_view layers_options[] = {"precision"};
constexpr std::string_view layers_flags[] = {"--heads", "--kv-heads", "--seq",   "--kv-seq",
                                             "--dim",   "--decode",   "--layers"};
constexpr std::string_view backward_flags[] = {"--batch", "--heads", "--seq", "--dim", "--kv-heads", "--backward"};
constexpr std::string_view varlen_options[] = {"precision"};
constexpr std::string_view varlen_flags[] = {"--heads", "--kv-heads", "--seq", "--dim", "--varlen"};
constexpr std::string_view serve_options[] = {"precision", "kv_type"};
constexpr std::string_view serve_flags[] = {"--heads",       "--kv-heads",      "--seq",
                                            "--dim",         "--serve",         "--shared-prefix",
                                            "--prefix-tree", "--prefix-groups", "--recorded"};
constexpr std::string_view context_parallel_flags_taken[] = {
    "--batch",      "--heads",      "--seq", "--dim", "--kv-seq", "--kv-heads", "--context-parallel",
    "--cp-slicing", "--mpi-timeout"};

constexpr mode_row mode_table[] = {
    {mode::attention, "qkv bench", false, attention_options, attention_flags,
     "times attention() (projections and attention; the other options and sizes time sdpa: add --decode for a "
     "kv_cache, or --kv-seq for q, k and v from the host)"},
    {mode::sdpa_host,
     "qkv bench --kv-seq",
     true,
     {},
     host_flags,
     "times sdpa with q, k and v from the host (the fused kernels; --split and --impl are --decode's and "
     "attention()'s)"},
    {mode::decode,
     "qkv bench --decode",
     true,
     {},
     decode_flags,
     "times sdpa against a kv_cache (the fused kernels, --split choosing the chunks)"},
    {mode::layers, "qkv bench --decode --layers", false, layers_options, layers_flags,
     "times one token (L = 1, batch 1) of plain decode layers, taking --precision of the options"},
    {mode::backward,
     "qkv bench --backward",
     true,
     {},
     backward_flags,
     "times sdpa and its backward pass over host q, k and v with L = S = --seq (one --batch, --heads and "
     "--kv-heads)"},
    {mode::varlen, "qkv bench --varlen", false, varlen_options, varlen_flags,
     "times a ragged batch of causal self-attention sequences (S_b = L_b, lengths drawn up to --seq) three ways, "
     "taking --precision of the options"},
    {mode::serve, "qkv bench --serve", false, serve_options, serve_flags,
     "times one decode step of sequences with cached lengths drawn up to --seq four ways, taking --precision and "
     "--kv-type of the options"},
    {mode::context_parallel,
     "qkv bench --context-parallel",
     true,
     {},
     context_parallel_flags_taken,
     "times one configuration of sdpa over host q, k, v across the ranks"},
};

mode mode_of(const bench_options& o, bool context_parallel) {
    if (context_parallel) return mode::context_parallel;
    if (o.backward) return mode::backward;
    if (o.varlen) return mode::varlen;
    if (o.serve) return mode::serve;
    if (o.layers) return mode::layers;
    if (o.decode) return mode::decode;
    if (!o.kv_seq_text.empty() || !o.kv_heads_text.empty()) return mode::sdpa_host;
    return mode::attention;
}

/// Every flag given that `m` neither honours nor shares with every mode: a usage_error naming
/// them and the mode, before any work (no device is opened).
void refuse_flags_beyond(const bench_options& o, mode m) {
    const mode_row& row =
        *std::find_if(std::begin(mode_table), std::end(mode_table), [&](const mode_row& r) { return r.m == m; });
    const auto listed = [](std::span<const std::string_view> list, std::string_view name) {
        return std::find(list.begin(), list.end(), name) != list.end();
    };
    std::string beyond;
    for (const std::string& flag : o.given) {
        bool taken = listed(common_flags, flag) || listed(row.flags, flag);
        for (std::size_t i = 0; i < option_inputs::count && !taken; ++i)
            if (qkv::sdpa_option_fields[i].flag == flag)
                taken = row.every_option || listed(row.options, qkv::sdpa_option_fields[i].name);
        if (!taken) beyond += (beyond.empty() ? "" : ", ") + flag;
    }
    if (!beyond.empty()) throw usage_error(beyond + ": not taken by " + row.name + ", which " + row.does);
}

/// The sweep's option sets: the flags' values (each bad value a usage_error naming its flag), over
/// the bench's defaults: causal no and yes, fp32 (and fp16 where the device stores 16-bit).
std::vector<qkv::sdpa_options> option_rows(const bench_options& o, const qkv::vulkan::device_info& info, bool sdpa) {
    std::vector<std::string> precisions{"fp32"};
    if (info.fp16_storage) precisions.push_back("fp16");
    return option_sweep(o.flags, sdpa ? sdpa_base() : qkv::sdpa_options{},
                        {{"causal", {"no", "yes"}}, {"precision", precisions}});
}

std::vector<config> sweep(const bench_options& o, const qkv::vulkan::device_info& info) {
    std::vector<qkv::implementation> impls;
    for (const auto& s : o.impl) impls.push_back(value_in(implementation_names(), s, qkv::implementation::fused));
    const bool sdpa = o.decode || !o.kv_seq.empty() || !o.kv_heads.empty();
    const std::vector<qkv::sdpa_options> rows = option_rows(o, info, sdpa);
    std::vector<config> out;
    for (std::size_t b : o.batch)
        for (std::size_t h : o.heads)
            for (std::size_t n : o.seq)
                for (std::size_t d : o.dim)
                    for (const qkv::sdpa_options& options : rows) {
                        config base;
                        base.batch = b, base.heads = h, base.seq = n, base.dim = d;
                        base.options = options;
                        if (sdpa) {
                            for (std::size_t s : o.kv_seq.empty() ? std::vector<std::size_t>{n} : o.kv_seq)
                                for (std::size_t hkv : o.kv_heads.empty() ? std::vector<std::size_t>{h} : o.kv_heads)
                                    for (const std::string& split : o.split)
                                        for (std::size_t ev : o.dim_v.empty() ? std::vector<std::size_t>{d} : o.dim_v) {
                                            config c = base;
                                            c.decode = true, c.kv_seq = s, c.kv_heads = hkv;
                                            c.split = split == "on";
                                            c.host_kv = !o.decode;  // sdpa with host K/V: no split choice
                                            if (c.host_kv && !c.split) continue;
                                            c.dim_v = ev;
                                            c.sinks = o.sinks;
                                            out.push_back(c);
                                        }
                            continue;
                        }
                        for (qkv::implementation i : impls) {
                            config c = base;
                            c.impl = i;
                            // The staged route has no fused kernel family: one row whatever --kernel says.
                            if (i != qkv::implementation::fused) {
                                if (options.kernel != rows.front().kernel) continue;
                                c.options.kernel = qkv::kernel_family::automatic;
                            }
                            out.push_back(c);
                        }
                    }
    return out;
}

void fill_defaults(bench_options& o, const qkv::vulkan::device_info& info) {
    // lavapipe and other CPU implementations manage a few GFLOP/s: a sweep that ends in minutes.
    const bool slow = info.type == qkv::vulkan::device_type::cpu;
    if (o.batch.empty()) o.batch = {1};
    if (o.heads.empty()) o.heads = {slow ? 1u : 8u};
    if (o.seq.empty() && o.decode) o.seq = {1};
    if (o.split.empty()) o.split = o.decode ? std::vector<std::string>{"on", "off"} : std::vector<std::string>{"on"};
    if (o.seq.empty())
        o.seq = slow ? std::vector<std::size_t>{128, 512, 1024} : std::vector<std::size_t>{512, 1024, 2048, 4096, 8192};
    if (o.dim.empty()) o.dim = {64};
    if (o.impl.empty()) o.impl = {"staged", "fused"};
    if (o.repeat <= 0) o.repeat = slow ? 5 : 20;
    if (o.warmup < 0) o.warmup = slow ? 1 : 3;
}

/// `--decode --layers N`: one token of N layers, host calls against one recorded sequence.
void run_layers_bench(bench_options& o, qkv::vulkan::context& ctx) {
    const qkv::vulkan::device_info& info = ctx.device();
    layers_config lc;
    lc.layers = o.layers;
    const auto one = [](const std::vector<std::size_t>& v, const char* flag, std::size_t fallback) {
        if (v.size() > 1) throw usage_error(std::string(flag) + " takes one value with --layers");
        return v.empty() ? fallback : v[0];
    };
    lc.q_heads = one(o.heads, "--heads", 32);
    lc.kv_heads = one(o.kv_heads, "--kv-heads", 8);
    lc.kv_len = one(o.kv_seq, "--kv-seq", 1024);
    lc.dim = one(o.dim, "--dim", 128);
    // One token: --seq may say so (as for --decode alone), and nothing else.
    if (const std::size_t rows = one(o.seq, "--seq", 1); rows != 1)
        throw usage_error("--seq " + std::to_string(rows) +
                          ": --decode --layers times one token (L = 1); give --seq 1 or leave it out");
    if (lc.q_heads % lc.kv_heads != 0)
        throw usage_error("--kv-heads " + std::to_string(lc.kv_heads) + " must divide --heads " +
                          std::to_string(lc.q_heads));
    const std::vector<qkv::sdpa_options> rows = option_sweep(o.flags, {});
    if (rows.size() > 1) throw usage_error("--precision takes one value with --layers");
    lc.precision = rows.front().precision;
    config one_layer;  // each layer's cache and q: refused before anything is built if no buffer holds them
    one_layer.decode = true, one_layer.seq = 1, one_layer.heads = lc.q_heads, one_layer.kv_heads = lc.kv_heads;
    one_layer.kv_seq = lc.kv_len, one_layer.dim = lc.dim, one_layer.options.precision = lc.precision;
    check_fits_device(one_layer, info);
    const bool slow = info.type == qkv::vulkan::device_type::cpu;
    if (o.repeat <= 0) o.repeat = slow ? 5 : 20;
    if (o.warmup < 0) o.warmup = slow ? 1 : 3;
    output_set json_out;
    reserve_json(json_out, o.json_file);
    std::cout << "qkv " << qkv::version_string << " bench, " << utc_now() << "\n"
              << "Device: " << info.name << " — " << qkv::vulkan::to_string(info.type) << ", driver " << info.driver
              << "\nTiming: " << o.warmup << " warm-up + " << o.repeat
              << " timed tokens, host clock around each token's calls\n\n";
    const json layers = run_layers(ctx, lc, o.warmup, o.repeat, o.seed, std::cout);
    if (!o.json_file.empty()) {
        json j;
        j["qkv_version"] = qkv::version_string;
        j["device"] = device_json(info);
        j["layers"] = layers;
        write_json(json_out, o.json_file, j);
    }
}

/// `--backward`: context::sdpa_backward beside context::sdpa over host q, k, v.
void run_backward_bench(bench_options& o, qkv::vulkan::context& ctx) {
    const qkv::vulkan::device_info& info = ctx.device();
    const bool slow = info.type == qkv::vulkan::device_type::cpu;
    const auto one = [](const std::vector<std::size_t>& v, const char* flag, std::size_t fallback) {
        if (v.size() > 1) throw usage_error(std::string(flag) + " takes one value with --backward");
        return v.empty() ? fallback : v[0];
    };
    backward_config bc;
    bc.batch = one(o.batch, "--batch", 1);
    bc.heads = one(o.heads, "--heads", slow ? 1 : 8);
    bc.kv_heads = one(o.kv_heads, "--kv-heads", bc.heads);
    if (bc.heads % bc.kv_heads != 0)
        throw usage_error("--kv-heads " + std::to_string(bc.kv_heads) + " must divide --heads " +
                          std::to_string(bc.heads));
    bc.seq = o.seq.empty() ? std::vector<std::size_t>{1024, 4096} : o.seq;
    bc.dim = o.dim.empty() ? std::vector<std::size_t>{64, 128} : o.dim;
    bc.options = option_sweep(o.flags, {}, {{"causal", {"no", "yes"}}});
    for (const std::size_t n : bc.seq)
        for (const std::size_t d : bc.dim) {
            config c;  // q, k, v, d_out and the gradients: refused before anything is built if no buffer holds them
            c.decode = true, c.seq = n, c.kv_seq = n, c.batch = bc.batch, c.heads = bc.heads, c.kv_heads = bc.kv_heads;
            c.dim = d;
            check_fits_device(c, info);
        }
    if (o.repeat <= 0) o.repeat = slow ? 5 : 20;
    if (o.warmup < 0) o.warmup = slow ? 1 : 3;
    output_set json_out;  // reserved first: a bad path fails before the timing
    reserve_json(json_out, o.json_file);
    std::cout << "qkv " << qkv::version_string << " bench, " << utc_now() << "\n"
              << "Device: " << info.name << " — " << qkv::vulkan::to_string(info.type) << ", driver " << info.driver
              << "\nTiming: " << o.warmup << " warm-up + " << o.repeat << " timed calls of each\n\n";
    const json backward = run_backward(ctx, bc, o.warmup, o.repeat, o.seed, std::cout);
    if (!o.json_file.empty()) {
        json j;
        j["qkv_version"] = qkv::version_string;
        j["device"] = device_json(info);
        j["backward"] = backward;
        write_json(json_out, o.json_file, j);
    }
}

/// `--varlen B`: a ragged batch as one call, as B calls and padded to the longest; `--serve B`: a
/// decode step of B sequences as one paged call, as B calls and padded to the longest.
void run_varlen_bench(bench_options& o, qkv::vulkan::context& ctx) {
    const qkv::vulkan::device_info& info = ctx.device();
    const bool serve = o.serve != 0;
    const std::string flag = serve ? "--serve" : "--varlen";
    varlen_config vc;
    vc.batch = serve ? o.serve : o.varlen;
    const auto one = [&](const std::vector<std::size_t>& v, const char* name, std::size_t fallback) {
        if (v.size() > 1) throw usage_error(std::string(name) + " takes one value with " + flag);
        return v.empty() ? fallback : v[0];
    };
    vc.q_heads = one(o.heads, "--heads", serve ? 32 : 8);
    vc.kv_heads = one(o.kv_heads, "--kv-heads", serve ? 8 : vc.q_heads);
    vc.max_len = one(o.seq, "--seq", serve ? 2048 : 512);
    vc.dim = one(o.dim, "--dim", serve ? 128 : 64);
    vc.shared_prefix = o.shared_prefix;
    vc.recorded = o.recorded;
    vc.prefix_tree = o.prefix_tree, vc.prefix_groups = o.prefix_groups;
    if (vc.shared_prefix % 16 != 0)
        throw usage_error("--shared-prefix " + std::to_string(vc.shared_prefix) +
                          ": a prompt in shared pages is whole pages of 16 rows");
    if (vc.prefix_tree % 16 != 0)
        throw usage_error("--prefix-tree " + std::to_string(vc.prefix_tree) +
                          ": a prefix in shared pages is whole pages of 16 rows");
    if (vc.prefix_tree != 0 && vc.shared_prefix == 0)
        throw usage_error("--prefix-tree needs --shared-prefix: the prompt every sequence shares is the tree's top");
    if (vc.prefix_tree != 0 && vc.prefix_groups > vc.batch)
        throw usage_error("--prefix-groups " + std::to_string(vc.prefix_groups) + ": more groups than the " +
                          std::to_string(vc.batch) + " sequences");
    if (vc.q_heads % vc.kv_heads != 0)
        throw usage_error("--kv-heads " + std::to_string(vc.kv_heads) + " must divide --heads " +
                          std::to_string(vc.q_heads));
    if (vc.max_len < 16)
        throw usage_error("--seq " + std::to_string(vc.max_len) + ": " + flag + " draws lengths from 16");
    const std::vector<qkv::sdpa_options> rows = option_sweep(o.flags, {});
    if (rows.size() > 1) throw usage_error("--precision and --kv-type take one value each with " + flag);
    vc.precision = rows.front().precision;
    vc.kv_type = rows.front().kv_type;
    if (vc.kv_type && qkv::is_quantized(*vc.kv_type) && vc.dim % 32 != 0)
        throw usage_error("--kv-type " + std::string(qkv::to_string(*vc.kv_type)) +
                          " stores blocks of 32 values: --dim " + std::to_string(vc.dim) + " is not a multiple of 32");
    config largest;  // the largest form's K/V: refused before anything is built if no buffer holds it
    largest.batch = serve ? 1 : vc.batch, largest.heads = vc.q_heads, largest.kv_heads = vc.kv_heads;
    largest.seq = serve ? 1 : vc.max_len, largest.kv_seq = vc.max_len + vc.shared_prefix + vc.prefix_tree,
    largest.dim = vc.dim;
    largest.decode = true;
    largest.host_kv = true;
    largest.options.precision = vc.precision;
    largest.options.kv_type = vc.kv_type;
    check_fits_device(largest, info);
    const bool slow = info.type == qkv::vulkan::device_type::cpu;
    if (o.repeat <= 0) o.repeat = slow ? 5 : 20;
    if (o.warmup < 0) o.warmup = 1;
    output_set json_out;
    reserve_json(json_out, o.json_file);
    std::cout << "qkv " << qkv::version_string << " bench, " << utc_now() << "\n"
              << "Device: " << info.name << " — " << qkv::vulkan::to_string(info.type) << ", driver " << info.driver
              << "\nTiming: " << o.warmup << " warm-up + " << o.repeat
              << " timed rounds, host clock around each form (q, k, v up and the output down included)\n\n";
    const json result = serve ? run_serve(ctx, vc, o.warmup, o.repeat, o.seed, std::cout)
                              : run_varlen(ctx, vc, o.warmup, o.repeat, o.seed, std::cout);
    if (!o.json_file.empty()) {
        json j;
        j["qkv_version"] = qkv::version_string;
        j["device"] = device_json(info);
        j[serve ? "serve" : "varlen"] = result;
        write_json(json_out, o.json_file, j);
    }
}

void run(bench_options o) {
    if (o.layers && !o.decode) throw usage_error("--layers needs --decode");
    refuse_flags_beyond(o, mode_of(o, false));
    parse_sizes(o);
    qkv::vulkan::context ctx = open_context(o.device, false);
    if (o.layers) return run_layers_bench(o, ctx);
    if (o.backward) return run_backward_bench(o, ctx);
    if (o.varlen || o.serve) return run_varlen_bench(o, ctx);
    const qkv::vulkan::device_info& info = ctx.device();
    fill_defaults(o, info);
    const std::vector<config> configs = sweep(o, info);
    for (const config& c : configs) {
        if (c.decode && c.heads % c.kv_heads != 0)
            throw usage_error("--kv-heads " + std::to_string(c.kv_heads) + " must divide --heads " +
                              std::to_string(c.heads));
        check_valid(c);
        check_fits_device(c, info);
    }
    const std::string date = utc_now();

    output_set json_out;  // reserved first: a bad path fails before minutes of benchmarking
    reserve_json(json_out, o.json_file);

    std::cout << "qkv " << qkv::version_string << " bench, " << date << "\n"
              << "Device: " << info.name << " — " << qkv::vulkan::to_string(info.type) << ", Vulkan "
              << info.api_version_string << ", driver " << info.driver << ", subgroup " << info.subgroup_size << "\n"
              << "Timing: " << o.warmup << " warm-up + " << o.repeat << " timed calls per row; "
              << (info.timestamps ? "device timestamps per phase" : "host clock around each whole call (no timestamps)")
              << "\n\n";

    qkv::vulkan::testing::device_ceiling ceiling;
    if (!o.skip_ceiling) {
        std::cerr << "qkv bench: measuring the device's ceiling (FMA and copy shaders)\n";
        ceiling = qkv::vulkan::testing::measure_ceiling(ctx);
        std::cout << "Device ceiling, measured now: FMA " << sig3(ceiling.fma_gflops) << " GFLOP/s, copy "
                  << sig3(ceiling.copy_gb_per_s) << " GB/s, empty submit-and-wait " << fixed(ceiling.empty_submit_ms, 3)
                  << " ms\n";
    }
    std::cerr << "qkv bench: timing the tutorial's 3 x 4 example\n";
    const summary tiny = tiny_example(ctx, 50);
    std::cout << "Tutorial example (N=3, d_in=4, d=3), host call to result: median " << fixed(tiny.median, 3)
              << " ms (min " << fixed(tiny.min, 3) << ", max " << fixed(tiny.max, 3) << ")";
    if (!o.skip_ceiling)
        std::cout << "; an empty submit-and-wait takes " << fixed(ceiling.empty_submit_ms, 3) << " ms, so qkv adds "
                  << fixed(tiny.median - ceiling.empty_submit_ms, 3) << " ms per call";
    std::cout << "\n\n";

    std::vector<result> results;
    progress bar(configs.size());
    std::optional<qkv::vulkan::context> unsplit;  // decode with one chunk: its own context option
    const auto measure = [&](const config& c, std::size_t i) {
        if (!c.decode) return run_config(ctx, c, o.warmup, o.repeat, o.seed + i, ceiling.fma_gflops);
        if (c.host_kv) return run_sdpa_host(ctx, c, o.warmup, o.repeat, o.seed + c.kv_seq, ceiling.fma_gflops);
        if (!c.split && !unsplit) unsplit.emplace(open_context(o.device, false, {.max_decode_chunks = 1}));
        // The same seed for a shape with and without the split: the same data.
        return run_decode(c.split ? ctx : *unsplit, c, o.warmup, o.repeat, o.seed + c.kv_seq, ceiling.fma_gflops);
    };
    for (std::size_t i = 0; i < configs.size(); ++i) {
        const config& c = configs[i];
        bar.show(i + 1, describe(c));
        try {
            results.push_back(measure(c, i));
        } catch (const std::bad_alloc&) {  // the host's memory (the device's is a skipped row)
            throw std::runtime_error("out of host memory for " + describe(c));
        }
    }

    const json ratios = print_results(std::cout, o, info, results);

    if (!o.json_file.empty()) {
        json j;
        j["qkv_version"] = qkv::version_string;
        j["date"] = date;
        j["device"] = device_json(info);
        j["timing"] = {
            {"warmup", o.warmup}, {"repeat", o.repeat}, {"clock", info.timestamps ? "device timestamps" : "host"}};
        if (!o.skip_ceiling)
            j["ceiling"] = {{"fma_gflops", ceiling.fma_gflops},
                            {"copy_gb_per_s", ceiling.copy_gb_per_s},
                            {"empty_submit_ms", ceiling.empty_submit_ms},
                            {"device_timestamps", ceiling.device_timestamps}};
        j["tiny_example_call_ms"] = summary_json(tiny);
        j["results"] = results_json(o, info, results);
        j["fused_vs_staged"] = ratios["fused_vs_staged"];
        j["decode_split_vs_unsplit"] = ratios["decode_split_vs_unsplit"];
        j["window_vs_full"] = ratios["window_vs_full"];
        write_json(json_out, o.json_file, j);
    }
}

/// `qkv bench --context-parallel`: one configuration, the first value of each list; every option
/// flag honoured (causal by default, bottom-right).
context_parallel_bench context_parallel_config(bench_options o) {
    refuse_flags_beyond(o, mode::context_parallel);
    parse_sizes(o);
    for (const auto& [flag, count] :
         {std::pair{"--batch", o.batch.size()}, std::pair{"--heads", o.heads.size()}, std::pair{"--seq", o.seq.size()},
          std::pair{"--dim", o.dim.size()}, std::pair{"--kv-seq", o.kv_seq.size()},
          std::pair{"--kv-heads", o.kv_heads.size()}})
        if (count > 1)
            throw usage_error(std::string(flag) + ": --context-parallel times one configuration; give one value");
    const std::vector<qkv::sdpa_options> rows = option_sweep(o.flags, sdpa_base(), {{"causal", {"yes"}}});
    if (rows.size() > 1)
        throw usage_error("--context-parallel times one configuration: give each option flag one value");
    context_parallel_bench b;
    b.options = rows.front();
    if (!o.batch.empty()) b.batch = o.batch[0];
    if (!o.heads.empty()) b.heads = b.kv_heads = o.heads[0];
    if (!o.kv_heads.empty()) b.kv_heads = o.kv_heads[0];
    if (!o.seq.empty()) b.seq = o.seq[0];
    if (!o.kv_seq.empty()) b.kv_seq = o.kv_seq[0];
    if (!o.dim.empty()) b.dim = o.dim[0];
    b.device = o.device;
    b.json_file = o.json_file;
    if (o.repeat > 0) b.repeat = o.repeat;
    if (o.warmup >= 0) b.warmup = o.warmup;
    b.seed = o.seed;
    return b;
}

}  // namespace
}  // namespace bench

void add_bench(CLI::App& app) {
    using namespace bench;
    auto o = std::make_shared<bench_options>();
    CLI::App* cmd = app.add_subcommand(
        "bench", "Time attention on a Vulkan device over a sweep of shapes, against the device's own ceiling");
    cmd->add_option("--batch", o->batch_text, "Batch sizes B (comma-separated; default 1)")
        ->delimiter(',')
        ->type_name("B");
    cmd->add_option("--heads", o->heads_text, "Head counts H (default 1 on a CPU device, 8 on a GPU)")
        ->delimiter(',')
        ->type_name("H");
    cmd->add_option("--seq", o->seq_text,
                    "Sequence lengths N (default 128,512,1024 on a CPU device, 512..8192 on a GPU)")
        ->delimiter(',')
        ->type_name("N");
    cmd->add_option("--dim", o->dim_text, "Head widths d (default 64)")->delimiter(',')->type_name("d");
    cmd->add_option("--impl", o->impl, "staged, fused (default both)")
        ->delimiter(',')
        ->check(CLI::IsMember(
            std::vector<std::string>{name_of(qkv::implementation::staged), name_of(qkv::implementation::fused)}))
        ->type_name("staged|fused");
    cmd->add_flag("--decode", o->decode,
                  "Time sdpa against a kv_cache (K/V resident on the device): --seq query rows per head (default "
                  "1) against --kv-seq keys of --kv-heads K/V heads");
    cmd->add_flag("--backward", o->backward,
                  "Time the backward pass (context::sdpa_backward) beside the forward (context::sdpa) over host q, "
                  "k, v with L = S = --seq (default 1024,4096), --dim (default 64,128), causal no,yes: each one's "
                  "time and backward / forward");
    cmd->add_option("--layers", o->layers,
                    "With --decode: time one token of N layers (L = 1 against --kv-seq keys, default 1024; --heads "
                    "32, --kv-heads 8, --dim 128 by default) as N host calls and as one recorded sequence")
        ->check(CLI::Range(1, 4096));
    cmd->add_option("--varlen", o->varlen,
                    "Time a ragged batch of B causal sequences, lengths log-uniform in [16, --seq] (default 512; "
                    "--heads 8, --dim 64 by default): one ragged call, B separate calls, and padding to the longest, "
                    "in tokens/s")
        ->check(CLI::Range(1, 4096))
        ->type_name("B");
    cmd->add_option("--serve", o->serve,
                    "Time one decode step of B sequences (one new token each), cached lengths log-uniform in [16, "
                    "--seq] (default 2048; --heads 32, --kv-heads 8, --dim 128 by default): one batched paged call, "
                    "B separate calls against kv_caches, and a cache padded to the longest, in tokens/s")
        ->check(CLI::Range(1, 4096))
        ->type_name("B");
    cmd->add_option("--shared-prefix", o->shared_prefix,
                    "With --serve: every sequence begins with a common prompt of this many rows (whole pages of 16) "
                    "in shared pages, its drawn length after it; the batched call on the device is timed with "
                    "shared prefixes computed once per group (cascade) and without")
        ->check(CLI::Range(0, 1 << 20))
        ->type_name("ROWS");
    cmd->add_option("--prefix-tree", o->prefix_tree,
                    "With --serve and --shared-prefix: a second level of shared pages after the prompt, this many "
                    "rows (whole pages of 16), shared within each of --prefix-groups groups of consecutive sequences; "
                    "the batched call on the device is timed with the two-level cascade, with one level (the second "
                    "level's pages copied per sequence) and without")
        ->check(CLI::Range(0, 1 << 20))
        ->type_name("ROWS");
    cmd->add_option("--prefix-groups", o->prefix_groups,
                    "With --prefix-tree: the second level's groups of consecutive sequences (default 8)")
        ->check(CLI::Range(1, 4096))
        ->type_name("N");
    cmd->add_flag("--recorded", o->recorded,
                  "With --serve: also time the batched call against the device pool over device tensors "
                  "(paged_call: q and out as tensors, the step's table and lengths given per step), run and "
                  "recorded in a sequence, against the host call");
    cmd->add_option("--kv-seq", o->kv_seq_text,
                    "Keys and values per head S (default: --seq); without --decode, times sdpa with q, k, v from "
                    "the host (cross-attention, GQA)")
        ->delimiter(',')
        ->type_name("S");
    cmd->add_option("--kv-heads", o->kv_heads_text, "K/V heads Hkv, dividing --heads (default: --heads)")
        ->delimiter(',')
        ->type_name("Hkv");
    cmd->add_option("--split", o->split,
                    "Decode: on (the split-S kernels choose their chunks), off (one chunk), or on,off (default)")
        ->delimiter(',')
        ->check(CLI::IsMember({"on", "off"}))
        ->type_name("on|off");
    cmd->add_option("--dim-v", o->dim_v_text, "sdpa: value head widths Ev (default: --dim)")
        ->delimiter(',')
        ->type_name("Ev");
    cmd->add_flag("--sinks", o->sinks, "sdpa: one sink logit per query head (random, N(0, 1))");
    add_option_flags(*cmd, o->flags, option_command::bench, "Options (a list sweeps; causal no,yes by default)");
    cmd->add_option("--repeat", o->repeat, "Timed calls per row (default 5 on a CPU device, 20 on a GPU)")
        ->check(CLI::Range(1, 100000));
    cmd->add_option("--warmup", o->warmup, "Untimed calls before them (default 1 / 3)")->check(CLI::Range(0, 100000));
    cmd->add_option("--device", o->device, "Device index or part of its name (default: QKV_DEVICE, else the best)")
        ->type_name("INDEX|NAME");
    cmd->add_option("--json", o->json_file, "Also write every number to FILE as JSON")->type_name("FILE");
    cmd->add_flag("--no-ceiling", o->skip_ceiling, "Skip measuring the device's FMA and copy ceiling");
    cmd->add_option("--seed", o->seed, "Seed of the random inputs");
    auto parallel = std::make_shared<context_parallel_flags>();
    add_context_parallel_flags(*cmd, *parallel);
    cmd->callback([o, cmd, parallel] {
        refuse_empty_file_names(*cmd);  // --json "" is not "no JSON"
        for (const CLI::Option* opt : cmd->get_options())
            if (opt->count() > 0) o->given.push_back(opt->get_name());
        if (parallel->requested())
            run_bench_context_parallel(*parallel, context_parallel_config(*o));
        else
            run(*o);
    });
}

}  // namespace qkv::cli
