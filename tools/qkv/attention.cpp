// `qkv attention`: self-attention over .npy files, on a Vulkan device or the CPU reference backend.
#include <CLI/CLI.hpp>

#include <cctype>
#include <charconv>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <system_error>

#include "attention_inputs.hpp"
#include "backend.hpp"
#include "choice_option.hpp"
#include "commands.hpp"
#include "errors.hpp"
#include "npy/npy.hpp"
#include "output_files.hpp"
#include "qkv/vulkan/cpu.hpp"
#include "qkv/vulkan/problem.hpp"

namespace qkv::cli {
namespace {

struct attention_options {
    attention_files files;
    std::string out, weights;
    std::string heads = "1";  // parsed by parse_heads: CLI11 saturates 99999999999999999999 silently
    std::string scale;    // parsed by parse_scale: CLI11's float conversion accepts "" as 0 and 1e39 as inf
    bool causal = false;
    backend choice = backend::vulkan;
    qkv::precision precision = qkv::precision::fp32;
    qkv::implementation implementation = qkv::implementation::automatic;
    std::string device;
    const CLI::Option* scale_option = nullptr;    // to tell "--scale not given" from a value
    const CLI::Option* weights_option = nullptr;  // to tell "--weights not given" from --weights ""
};

/// --scale as a float32: a decimal or hexadecimal number, finite as float32 (1e39 is not: it
/// would be infinite), and not a nonzero value that rounds to 0.
float parse_scale(const std::string& text) {
    const std::string bad = "--scale " + (text.empty() ? std::string("\"\"") : text) + ": ";
    if (text.empty()) throw usage_error(bad + "expected a number");
    const char* begin = text.c_str();
    char* end = nullptr;
    errno = 0;
    const double value = std::strtod(begin, &end);
    if (end == begin || *end != '\0' || std::isspace(static_cast<unsigned char>(text.front())))
        throw usage_error(bad + "expected a number");
    if (!std::isfinite(value)) throw usage_error(bad + "the scale must be finite");
    if (std::fabs(value) > static_cast<double>(std::numeric_limits<float>::max()))
        throw usage_error(bad + "beyond the float32 range (the scale must be finite as a float32, |scale| <= " +
                          "3.4028235e38)");
    const float scale = static_cast<float>(value);
    if (value != 0 && scale == 0) throw usage_error(bad + "rounds to 0 as a float32");
    if (!std::isfinite(scale)) throw usage_error(bad + "the scale must be finite as a float32");
    return scale;
}

/// --heads: a decimal count of at least 1 that fits a std::size_t.
std::size_t parse_heads(const std::string& text) {
    const std::string shown = text.empty() ? std::string("\"\"") : text;
    std::size_t value = 0;
    const char* end = text.data() + text.size();
    const auto [at, ec] = std::from_chars(text.data(), end, value);
    if (!text.empty() && text.front() == '-' && text.find_first_not_of("-0123456789") == std::string::npos)
        throw usage_error("--heads must be at least 1 (it is " + text + ")");
    if (ec == std::errc::result_out_of_range) throw usage_error("--heads " + shown + ": out of range");
    if (ec != std::errc() || at != end) throw usage_error("--heads " + shown + ": expected a whole number");
    if (value < 1) throw usage_error("--heads must be at least 1 (it is " + text + ")");
    return value;
}

/// Flag combinations that make no sense, before any file is read.
void check_usage(const attention_options& o) {
    if (o.out.empty()) throw usage_error("--out is empty: name the file to write the attention output to");
    if (o.weights_option->count() > 0 && o.weights.empty())
        throw usage_error("--weights is empty: name the file to write the weights to, or leave --weights out");
    if (o.scale_option->count() > 0) (void)parse_scale(o.scale);
    (void)parse_heads(o.heads);
    if (!o.weights.empty() && o.implementation == qkv::implementation::fused)
        throw usage_error(
            "--weights needs the staged implementation: --impl fused never materialises the "
            "attention weights (use --impl staged, or leave --impl auto)");
}

void run(const attention_options& o) {
    check_usage(o);
    const attention_files& f = o.files;
    const std::vector<named_file> outputs = {{"--out", o.out}, {"--weights", o.weights}};
    const std::vector<named_file> inputs = {{"--x", f.x},   {"--wq", f.wq}, {"--wk", f.wk}, {"--wv", f.wv},
                                            {"--bq", f.bq}, {"--bk", f.bk}, {"--bv", f.bv}, {"--wo", f.wo},
                                            {"--bo", f.bo}, {"--mask", f.mask}};
    check_output_paths(outputs, inputs);  // before any work: never over an input, a link or a device
    attention_inputs in = load_attention_inputs(f, parse_heads(o.heads));

    qkv::run_options options;
    if (o.scale_option->count() > 0) options.scale = parse_scale(o.scale);
    options.causal = o.causal;
    options.return_weights = !o.weights.empty();
    options.precision = o.precision;
    options.implementation = o.implementation;
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

    const std::string inputs = "Inputs";
    cmd->add_option("--x", o->files.x, "The input sequence")->required()->type_name("X.npy")->group(inputs);
    cmd->add_option("--wq", o->files.wq, "Query weights")->required()->type_name("WQ.npy")->group(inputs);
    cmd->add_option("--wk", o->files.wk, "Key weights")->required()->type_name("WK.npy")->group(inputs);
    cmd->add_option("--wv", o->files.wv, "Value weights")->required()->type_name("WV.npy")->group(inputs);
    cmd->add_option("--bq", o->files.bq, "Query bias (optional)")->type_name("BQ.npy")->group(inputs);
    cmd->add_option("--bk", o->files.bk, "Key bias (optional)")->type_name("BK.npy")->group(inputs);
    cmd->add_option("--bv", o->files.bv, "Value bias (optional)")->type_name("BV.npy")->group(inputs);
    CLI::Option* wo = cmd->add_option("--wo", o->files.wo, "Output projection weights (optional)")
                          ->type_name("WO.npy")
                          ->group(inputs);
    cmd->add_option("--bo", o->files.bo, "Output projection bias (needs --wo)")
        ->type_name("BO.npy")
        ->needs(wo)
        ->group(inputs);
    cmd->add_option("--mask", o->files.mask,
                    "Mask: bool (true = may attend) or float32/float64 (added to the scaled scores; "
                    "-inf masks)")
        ->type_name("M.npy")
        ->group(inputs);

    const std::string outputs = "Outputs";
    cmd->add_option("--out", o->out, "Where to write the attention output")
        ->required()
        ->type_name("OUT.npy")
        ->group(outputs);
    o->weights_option =
        cmd->add_option("--weights", o->weights, "Also write the attention probabilities (needs --impl staged or auto)")
            ->type_name("W.npy")
            ->group(outputs);

    const std::string attention = "Attention";
    cmd->add_option("--heads", o->heads, "Number of heads; must divide d_k and d_v")
        ->type_name("H")
        ->default_str("1")
        ->group(attention);
    o->scale_option = cmd->add_option("--scale", o->scale,
                                      "Multiplies Q\u00b7K\u1d40; --scale 1 is the tutorial's plain "
                                      "dot product")
                          ->type_name("S")
                          ->default_str("1/sqrt(d_k/H)")
                          ->group(attention);
    cmd->add_flag("--causal", o->causal, "Position i attends only to positions j <= i (combines with --mask)")
        ->group(attention);

    const std::string running = "Backend";
    add_backend_option(*cmd, o->choice,
                       "vulkan, or cpu: the float64 CPU reference backend, which ignores --precision, --impl "
                       "and --device")
        ->group(running);
    add_choice<qkv::precision>(*cmd, "--precision", o->precision,
                               {{"fp32", qkv::precision::fp32}, {"fp16", qkv::precision::fp16}},
                               "fp32, or fp16: Q, K, V stored in float16 (needs a device with 16-bit storage)")
        ->group(running);
    add_choice<qkv::implementation>(*cmd, "--impl", o->implementation,
                                    {{"auto", qkv::implementation::automatic},
                                     {"staged", qkv::implementation::staged},
                                     {"fused", qkv::implementation::fused}},
                                    "auto (fused, or staged with --weights), staged (four passes, N x N scores in "
                                    "memory) or fused (one flash-attention pass)")
        ->group(running);
    cmd->add_option("--device", o->device,
                    "Vulkan device: an index or a part of its name (see `qkv devices`); default: QKV_DEVICE, "
                    "else the best device")
        ->type_name("INDEX|NAME")
        ->group(running);

    cmd->callback([o] { run(*o); });
}

}  // namespace qkv::cli
