// `qkv sdpa`: scaled dot-product attention over Q, K and V .npy files (PyTorch's
// F.scaled_dot_product_attention semantics), on a Vulkan device or the float64 CPU backend.
#include <CLI/CLI.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "attention_args.hpp"
#include "backend.hpp"
#include "choice_option.hpp"
#include "commands.hpp"
#include "common_flags.hpp"
#include "context_parallel.hpp"
#include "errors.hpp"
#include "flag_args.hpp"
#include "option_flags.hpp"
#include "output_files.hpp"
#include "qkv/runtime/capabilities.hpp"
#include "qkv/runtime/cpu.hpp"
#include "qkv/runtime/element_type.hpp"
#include "qkv/runtime/error.hpp"
#include "qkv/runtime/sdpa.hpp"
#include "qkv/vulkan/context.hpp"
#include "qkv/vulkan/error.hpp"
#include "sdpa_inputs.hpp"

namespace qkv::cli {
namespace {

struct sdpa_command_options {
    sdpa_files files;
    std::string out;
    option_inputs options;  // every flag of sdpa_options (option_flags.hpp), --weights and --lse among them
    backend choice = backend::vulkan;
    std::string device;
    context_parallel_flags parallel;
    std::string cu_q, cu_k;  // a ragged batch's offsets (--cu-seqlens-q/--cu-seqlens-k): a list or a .npy file

    /// The file an output field's flag names ("": not asked for).
    [[nodiscard]] std::string output(std::string_view field) const {
        const std::size_t i = option_inputs::index_of(field);
        return options.given(i) && !options.values[i].empty() ? options.values[i].back() : std::string();
    }
};

/// q8_0 and q4_0 store blocks of 32 values along each row of K and V.
void check_kv_type(const qkv::sdpa_options& options, const qkv::sdpa_shape& s) {
    if (!options.kv_type || !qkv::is_quantized(*options.kv_type)) return;
    if (s.d_qk % 32 != 0 || s.d_v % 32 != 0)
        throw usage_error("--kv-type " + std::string(qkv::to_string(*options.kv_type)) +
                          ": stores blocks of 32 values along each row of K and V, so E (" + std::to_string(s.d_qk) +
                          ") and Ev (" + std::to_string(s.d_v) + ") must be multiples of 32");
}

/// K and V as --kv-type stores them (q8_0 and q4_0 take finite values only, f16 none beyond its
/// range), checked on the whole files before any work and before a context-parallel rank takes its
/// slice: the refusal names the file and the element's index in it (float32 data; the cpu
/// backend's float64 path is checked by the library on the whole arrays).
void check_storable(const qkv::sdpa_options& options, const sdpa_inputs& in) {
    if (!options.kv_type || *options.kv_type == qkv::element_type::f32) return;
    for (const auto& [flag, input] : {std::pair{"--k", &in.k}, std::pair{"--v", &in.v}}) {
        if (input->f32.empty()) continue;
        try {
            (void)qkv::round_trip(*options.kv_type, input->f32);
        } catch (const qkv::invalid_argument& e) {
            throw usage_error(std::string(flag) + " " + input->name + " stored as --kv-type " +
                              std::string(qkv::to_string(*options.kv_type)) + ": " + e.what() +
                              " (the index is into the whole file, in C order)");
        }
    }
}

/// What every run does first: the flags checked, the options built, the inputs read and validated
/// (float64 kept only where the cpu backend computes a single-process run in float64).
struct prepared {
    qkv::sdpa_options options;
    sdpa_inputs in;
    bool float64 = false;
};

/// The options of the flags, --causal-align refused where nothing uses it.
qkv::sdpa_options options_of(const sdpa_command_options& o) {
    const qkv::sdpa_options options = options_from_flags(o.options);
    // The alignment sets the offset of the causal diagonal, the window and ALiBi's distances.
    const bool windowed = options.window_left >= 0 || options.window_right >= 0;
    if (o.options.given(option_inputs::index_of("alignment")) && !options.causal && !windowed &&
        options.alibi_max_bias == 0)
        throw usage_error(
            "--causal-align needs --causal, --window or --alibi: it chooses where the causal diagonal (and the "
            "window's and ALiBi's position i + off) starts");
    return options;
}

prepared prepare(const sdpa_command_options& o) {
    const qkv::sdpa_options options = options_of(o);

    const sdpa_files& f = o.files;
    const std::string weights = o.output("return_weights"), lse = o.output("return_lse");
    const std::vector<named_file> outputs = {{"--out", o.out}, {"--weights", weights}, {"--lse", lse}};
    const std::vector<named_file> inputs = {
        {"--q", f.q}, {"--k", f.k}, {"--v", f.v}, {"--mask", f.mask}, {"--sinks", f.sinks}};
    check_output_paths(outputs, inputs);  // before any work: never over an input, a link or a device
    prepared p{.options = options, .in = load_sdpa_inputs(f)};
    check_kv_type(options, p.in.shape);

    // The CPU backend computes float64 inputs in float64 and writes float64; otherwise
    // everything is float32 (float64 inputs narrowed, refused when beyond the float32 range), as
    // in every context-parallel run.
    p.float64 = o.choice == backend::cpu && p.in.any_float64() && !o.parallel.requested();
    if (p.float64) {
        p.in.to_float64();
        qkv::validate(p.in.problem_f64(options));  // anything the checks above missed: exit 2
    } else {
        p.in.to_float32();
        qkv::validate(p.in.problem(options));
        check_storable(options, p.in);
    }
    return p;
}

/// A ragged batch (--cu-seqlens-q/--cu-seqlens-k): OUT (total_q, Hq, Ev), LSE (Hq, total_q).
void run_varlen(const sdpa_command_options& o) {
    if (o.cu_q.empty() || o.cu_k.empty())
        throw usage_error("--cu-seqlens-q and --cu-seqlens-k go together: the offsets of the queries and of the keys");
    if (o.parallel.requested())
        throw usage_error("--cu-seqlens-q: a ragged batch runs in one process (no --context-parallel)");
    if (!o.files.mask.empty()) throw usage_error("--mask: a ragged batch takes no mask (FlashAttention's varlen call)");
    const qkv::sdpa_options options = options_of(o);
    const sdpa_files& f = o.files;
    const std::string lse = o.output("return_lse"), weights = o.output("return_weights");
    const std::vector<named_file> outputs = {{"--out", o.out}, {"--weights", weights}, {"--lse", lse}};
    std::vector<named_file> inputs = {{"--q", f.q}, {"--k", f.k}, {"--v", f.v}, {"--sinks", f.sinks}};
    for (const auto& [flag, value] : {std::pair{"--cu-seqlens-q", &o.cu_q}, std::pair{"--cu-seqlens-k", &o.cu_k}})
        if (is_offsets_file(*value)) inputs.push_back({flag, *value});
    check_output_paths(outputs, inputs);  // before any work: never over an input, a link or a device
    varlen_inputs in = load_varlen_inputs(f, o.cu_q, o.cu_k);
    const bool float64 = o.choice == backend::cpu && in.any_float64();
    if (float64) {
        in.to_float64();
        qkv::validate(in.problem_f64(options));
    } else {
        in.to_float32();
        qkv::validate(in.problem(options));
    }
    // The table's refusals (weights) before any file is made.
    const qkv::entry_point entry =
        o.choice == backend::cpu ? qkv::entry_point::cpu_varlen : qkv::entry_point::context_varlen;
    qkv::require_supported(entry,
                           float64 ? qkv::features_of(in.problem_f64(options)) : qkv::features_of(in.problem(options)));
    output_set files;
    files.reserve({o.out, lse});
    if (float64) {
        const qkv::varlen_output_f64 r = qkv::cpu::sdpa(in.problem_f64(options));
        files.commit({{o.out, in.out_shape(), std::span<const double>(r.output)},
                      {lse, in.lse_shape(), std::span<const double>(r.lse)}});
        return;
    }
    const qkv::varlen_output r = o.choice == backend::cpu ? qkv::cpu::sdpa(in.problem(options))
                                                          : open_context(o.device).sdpa(in.problem(options));
    files.commit({{o.out, in.out_shape(), std::span<const float>(r.output)},
                  {lse, in.lse_shape(), std::span<const float>(r.lse)}});
}

void run(const sdpa_command_options& o) {
    if (!o.cu_q.empty() || !o.cu_k.empty()) return run_varlen(o);
    if (o.parallel.requested()) {
        run_sdpa_context_parallel(o.parallel, [&] {
            prepared p = prepare(o);
            return context_parallel_job{.inputs = std::move(p.in),
                                        .options = p.options,
                                        .choice = o.choice,
                                        .device = o.device,
                                        .out = o.out,
                                        .lse = o.output("return_lse")};
        });
        return;
    }
    prepared p = prepare(o);
    const qkv::sdpa_options& options = p.options;
    sdpa_inputs& in = p.in;
    const bool float64 = p.float64;
    const std::string weights = o.output("return_weights"), lse = o.output("return_lse");
    output_set files;
    files.reserve({o.out, weights, lse});  // an output that cannot be created fails before the work
    if (float64) {
        const qkv::sdpa_output_f64 r = qkv::cpu::sdpa(in.problem_f64(options));
        files.commit({{o.out, in.out_shape(), std::span<const double>(r.output)},
                      {weights, in.weights_shape(), std::span<const double>(r.weights)},
                      {lse, in.lse_shape(), std::span<const double>(r.lse)}});
        return;
    }
    const qkv::sdpa_output r = o.choice == backend::cpu ? qkv::cpu::sdpa(in.problem(options))
                                                        : open_context(o.device).sdpa(in.problem(options));
    files.commit({{o.out, in.out_shape(), std::span<const float>(r.output)},
                  {weights, in.weights_shape(), std::span<const float>(r.weights)},
                  {lse, in.lse_shape(), std::span<const float>(r.lse)}});
}

constexpr const char* footer =
    "Computes, as PyTorch's F.scaled_dot_product_attention(q, k, v, attn_mask, is_causal, scale,\n"
    "enable_gqa=True), for each batch element b and query head h:\n"
    "  W = softmax of each row of scale\u00b7Q\u00b7K\u1d40 (+ M, if float) over the keys the mask and\n"
    "      --causal allow; OUT = W\u00b7V, with K, V of K/V head h / (Hq / Hkv)\n"
    "\nShapes: Q (B, Hq, L, E), K (B, Hkv, S, E), V (B, Hkv, S, Ev); or all three (H, \u00b7, \u00b7) or\n"
    "(\u00b7, \u00b7). Hkv divides Hq (grouped-query attention). M broadcasts NumPy-style to\n"
    "(B, Hq, L, S). OUT has Q's leading dimensions and Ev columns; W has Q's leading dimensions and\n"
    "S columns. scale defaults to 1/sqrt(E).\n"
    "\nMasks: a bool M keeps the true entries; a float M is added to the scaled scores (-inf masks).\n"
    "--causal keeps key j for query i when j <= i (top-left, PyTorch's is_causal) or\n"
    "j <= i + S - L (bottom-right, the KV-cache convention: the last query sees every key); it\n"
    "combines with M. A query with no key to attend to gets zero weights and a zero output.\n"
    "\nBeyond PyTorch (qkv/runtime/sdpa.hpp): with off = 0 (top-left) or S - L (bottom-right), the\n"
    "score s = scale\u00b7q\u00b7k becomes C\u00b7tanh(s / C) (--softcap C), then s - slope_h\u00b7|i + off - j|\n"
    "(--alibi B: ggml's slopes over Hq heads), then s + M; --window LEFT,RIGHT keeps key j only\n"
    "where i + off - LEFT <= j <= i + off + RIGHT (-1: unbounded); --sinks adds one logit per query\n"
    "head to each row's denominator; --lse writes log sum_j e^(s_j) per row (sinks not included,\n"
    "-inf for a row with no key), Q's leading dimensions; --kv-type stores K and V as f32, f16, or\n"
    "ggml's q8_0 / q4_0 blocks (E and Ev multiples of 32; --backend cpu computes from the values\n"
    "as stored).\n"
    "\nRagged batches (FlashAttention's flash_attn_varlen_func): --cu-seqlens-q 0,L1,L1+L2,... and\n"
    "--cu-seqlens-k 0,S1,... (or each an int32 .npy file of shape (B + 1,), FlashAttention's\n"
    "cu_seqlens as np.save writes them) give the B + 1 offsets of each sequence's rows in Q\n"
    "(total_q, Hq, E) and in K, V (total_k, Hkv, E / Ev); each sequence is attended on its own\n"
    "with every option above (--causal-align bottom-right aligns each sequence's own S - L); OUT\n"
    "is (total_q, Hq, Ev), LSE (Hq, total_q); no --mask, no --weights.\n"
    "\nTypes: --backend cpu computes in float64; when any input is float64 it reads every input\n"
    "without rounding and writes OUT and W as float64, else as float32. --backend vulkan computes\n"
    "in float32 (or fp16): float64 inputs are rounded to float32, and a finite value beyond the\n"
    "float32 range is refused (exit 2).\n"
    "\nFiles: outputs are written to temporary files beside them and renamed into place only when\n"
    "all are complete; an output that names an input, a directory, a device, a FIFO or a symbolic\n"
    "link is refused (exit 2).\n"
    "\nExit status: 0 success, 2 bad input or usage, 1 device or run-time failure; on failure no\n"
    "output file is left behind.";

void add_options(CLI::App& cmd, sdpa_command_options& o) {
    const std::string inputs = "Inputs";
    cmd.add_option("--q", o.files.q, "Queries (B, Hq, L, E), (Hq, L, E) or (L, E)")
        ->required()
        ->type_name("Q.npy")
        ->group(inputs);
    cmd.add_option("--k", o.files.k, "Keys (B, Hkv, S, E), ...")->required()->type_name("K.npy")->group(inputs);
    cmd.add_option("--v", o.files.v, "Values (B, Hkv, S, Ev), ...")->required()->type_name("V.npy")->group(inputs);
    add_mask_option(cmd, o.files.mask, "broadcasting to (B, Hq, L, S)")->group(inputs);
    cmd.add_option("--cu-seqlens-q", o.cu_q,
                   "A ragged batch (FlashAttention's varlen): the B + 1 offsets of the sequences' rows in q, then "
                   "(total_q, Hq, E); k and v (total_k, Hkv, E / Ev); OUT (total_q, Hq, Ev), LSE (Hq, total_q). "
                   "A comma list, or an int32 .npy file (B + 1,)")
        ->type_name("0,L1,...|CU.npy")
        ->group(inputs);
    cmd.add_option("--cu-seqlens-k", o.cu_k,
                   "With --cu-seqlens-q: the B + 1 offsets of the sequences' rows in k and v (a list or an int32 .npy)")
        ->type_name("0,S1,...|CU.npy")
        ->group(inputs);

    const std::string outputs = "Outputs";
    add_out_option(cmd, o.out)->group(outputs);
    cmd.add_option("--sinks", o.files.sinks, "Sink logits, float (Hq,): each joins its head's softmax denominator")
        ->type_name("SINKS.npy")
        ->group(inputs);

    add_option_flags(cmd, o.options, option_command::sdpa, "Options");

    const std::string running = "Backend";
    add_backend_option(cmd, o.choice,
                       "vulkan, or cpu: the float64 CPU reference backend, which ignores --precision, --kernel "
                       "and --device")
        ->group(running);
    add_device_option(cmd, o.device)->group(running);
    add_context_parallel_flags(cmd, o.parallel);
}

}  // namespace

void add_sdpa(CLI::App& app) {
    auto o = std::make_shared<sdpa_command_options>();
    CLI::App* cmd = app.add_subcommand(
        "sdpa", "Scaled dot-product attention over Q, K, V .npy files (GQA, masks, causal), on Vulkan or the CPU");
    cmd->footer(footer);
    add_options(*cmd, *o);
    cmd->callback([o, cmd] {
        refuse_empty_file_names(*cmd);  // --mask "" is not "no mask", --out "" no file
        run(*o);
    });
}

}  // namespace qkv::cli
