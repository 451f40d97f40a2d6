// `qkv attention`: self-attention over .npy files, on a Vulkan device or the CPU reference backend.
#include <CLI/CLI.hpp>

#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>

#include "attention_args.hpp"
#include "attention_inputs.hpp"
#include "backend.hpp"
#include "choice_option.hpp"
#include "commands.hpp"
#include "errors.hpp"
#include "npy/npy.hpp"
#include "output_files.hpp"
#include "qkv/runtime/cpu.hpp"
#include "qkv/runtime/problem.hpp"

namespace qkv::cli {
namespace {

void compute_and_write(const attention_options& o, attention_inputs& in);

std::string approximately(double count) {
    char text[32];
    std::snprintf(text, sizeof text, "%.4g", count);
    return text;
}

void run(const attention_options& o) {
    check_usage(o);
    const attention_files& f = o.files;
    const std::vector<named_file> outputs = {{"--out", o.out}, {"--weights", o.weights}};
    const std::vector<named_file> inputs = {{"--x", f.x},   {"--wq", f.wq},    {"--wk", f.wk}, {"--wv", f.wv},
                                            {"--bq", f.bq}, {"--bk", f.bk},    {"--bv", f.bv}, {"--wo", f.wo},
                                            {"--bo", f.bo}, {"--mask", f.mask}};
    check_output_paths(outputs, inputs);  // before any work: never over an input, a link or a device
    attention_inputs in = load_attention_inputs(f, parse_heads(o.heads));
    try {
        compute_and_write(o, in);
    } catch (const std::bad_alloc&) {
        const qkv::attention_shape& s = in.shape;
        throw std::runtime_error(
            "out of host memory for attention with B = " + std::to_string(s.batch) + ", N = " + std::to_string(s.seq) +
            ", d_in = " + std::to_string(s.d_in) + ", d_k = " + std::to_string(s.d_k) +
            ", d_v = " + std::to_string(s.d_v) + ", H = " + std::to_string(s.heads) +
            (o.weights.empty() ? std::string()
                               : " (--weights holds B x H x N x N = " +
                                     approximately(static_cast<double>(s.batch) * static_cast<double>(s.heads) *
                                                   static_cast<double>(s.seq) * static_cast<double>(s.seq)) +
                                     " values)"));
    }
}

void compute_and_write(const attention_options& o, attention_inputs& in) {
    qkv::run_options options;
    if (o.scale_option->count() > 0) options.scale = parse_scale(o.scale);
    options.causal = o.causal;
    options.return_weights = !o.weights.empty();
    options.precision = o.precision;
    options.implementation = o.implementation;
    options.kernel = o.kernel;
    // The CPU backend computes float64 inputs in float64 and writes float64; otherwise
    // everything is float32 (float64 inputs narrowed, refused when beyond the float32 range).
    const bool float64 = o.choice == backend::cpu && in.any_float64();
    if (float64) {
        in.to_float64();
        qkv::cpu::validate(in.problem_f64(options));  // anything the checks above missed: exit 2
    } else {
        in.to_float32();
        qkv::validate(in.problem(options));
    }

    const qkv::attention_shape& s = in.shape;
    std::vector<std::size_t> out_shape{s.seq, s.out_width()};
    std::vector<std::size_t> weights_shape{s.heads, s.seq, s.seq};
    if (in.batched) {
        out_shape.insert(out_shape.begin(), s.batch);
        weights_shape.insert(weights_shape.begin(), s.batch);
    }

    output_set files;
    files.reserve({o.out, o.weights});  // an output that cannot be created fails before the work
    if (float64) {
        const qkv::cpu::attention_output_f64 r = qkv::cpu::attention(in.problem_f64(options));
        files.commit({{o.out, out_shape, std::span<const double>(r.output)},
                      {o.weights, weights_shape, std::span<const double>(r.weights)}});
    } else {
        const std::optional<std::string> device = o.device.empty() ? std::nullopt : std::optional(o.device);
        const backend_result r = run_attention(in.problem(options), o.choice, device);
        files.commit({{o.out, out_shape, std::span<const float>(r.result.output)},
                      {o.weights, weights_shape, std::span<const float>(r.result.weights)}});
    }
}

constexpr const char* footer =
    "Computes, for each head:\n"
    "  Q = X\u00b7Wq + Bq, K = X\u00b7Wk + Bk, V = X\u00b7Wv + Bv\n"
    "  W = softmax of each row of scale\u00b7Q\u00b7K\u1d40 (+ M, if float) over the positions the mask and\n"
    "      --causal allow\n"
    "  OUT = W\u00b7V, the heads side by side, then \u00b7Wo + Bo if given\n"
    "\nShapes (the tutorial's convention: rows are positions):\n"
    "  X (N, d_in) or (B, N, d_in); Wq, Wk (d_in, d_k); Wv (d_in, d_v); Bq, Bk (d_k,); Bv (d_v,);\n"
    "  Wo (d_v, d_out); Bo (d_out,); M (N, N) or (B, N, N). H divides d_k and d_v; head h uses\n"
    "  columns [h\u00b7d_k/H, (h+1)\u00b7d_k/H) of Q and K and the matching columns of V.\n"
    "  OUT is (N, d) or (B, N, d) with d = d_out with --wo, else d_v; W is (H, N, N) or\n"
    "  (B, H, N, N).\n"
    "\nInputs are float32 or float64 .npy files in C order (M may also be bool). A row that may\n"
    "attend to no position gets zero weights and a zero attention output (then + Bo).\n"
    "\nTypes: --backend cpu computes in float64; when any input is float64 it reads every input\n"
    "without rounding and writes OUT and W as float64, else as float32. --backend vulkan computes\n"
    "in float32 (or fp16): float64 inputs are rounded to float32, and a finite value beyond the\n"
    "float32 range is refused (exit 2) rather than made infinite. OUT and W are float32.\n"
    "\nFiles: outputs are written to temporary files beside them and renamed into place only when\n"
    "all are complete; on failure or SIGINT/SIGTERM every existing file is left as it was. An\n"
    "output that names an input (by any path or link), a directory, a device, a FIFO or a\n"
    "symbolic link is refused (exit 2).\n"
    "\nExit status: 0 success, 2 bad input or usage, 1 device or run-time failure; on failure no\n"
    "output file is left behind.";

}  // namespace

void add_attention(CLI::App& app) {
    auto o = std::make_shared<attention_options>();
    CLI::App* cmd =
        app.add_subcommand("attention", "Compute (multi-head) self-attention over .npy files, on Vulkan or the CPU");
    cmd->footer(footer);

    add_attention_options(*cmd, *o);
    cmd->callback([o] { run(*o); });
}

}  // namespace qkv::cli
