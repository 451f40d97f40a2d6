// `qkv attention`: self-attention over .npy files, on a Vulkan device or the CPU reference backend.
#include <CLI/CLI.hpp>

#include <filesystem>
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
#include "qkv/vulkan/problem.hpp"

#ifdef _WIN32
#include <windows.h>  // CompareStringOrdinal
#endif

namespace qkv::cli {
namespace {

struct attention_options {
    attention_files files;
    std::string out, weights;
    long long heads = 1;  // signed, so that --heads -1 is refused rather than wrapped
    float scale = 1;
    bool causal = false;
    backend choice = backend::vulkan;
    qkv::precision precision = qkv::precision::fp32;
    qkv::implementation implementation = qkv::implementation::automatic;
    qkv::kernel_family kernel = qkv::kernel_family::automatic;
    std::string device;
    const CLI::Option* scale_option = nullptr;  // to tell "--scale not given" from a value
};

bool same_file(const std::string& a, const std::string& b) {
    const auto resolved = [](const std::string& name) {
        const std::filesystem::path path = qkv::npy::path_from_utf8(name);
        std::error_code ec;
        const std::filesystem::path absolute = std::filesystem::absolute(path, ec);
        const std::filesystem::path canonical = std::filesystem::weakly_canonical(absolute, ec);
        return ec ? path.lexically_normal() : canonical;
    };
#ifdef _WIN32
    // Windows file names are case-insensitive: out.npy and OUT.npy are one file. Compare as the
    // file system does (ordinal, ignoring case), with one kind of separator.
    const std::wstring x = resolved(a).make_preferred().native(), y = resolved(b).make_preferred().native();
    return CompareStringOrdinal(x.c_str(), static_cast<int>(x.size()), y.c_str(), static_cast<int>(y.size()),
                                TRUE) == CSTR_EQUAL;
#else
    return resolved(a) == resolved(b);
#endif
}

/// Flag combinations that make no sense, before any file is read.
void check_usage(const attention_options& o) {
    if (o.heads < 1) throw usage_error("--heads must be at least 1 (it is " + std::to_string(o.heads) + ")");
    if (!o.weights.empty() && o.implementation == qkv::implementation::fused)
        throw usage_error(
            "--weights needs the staged implementation: --impl fused never materialises the "
            "attention weights (use --impl staged, or leave --impl auto)");
    if (!o.weights.empty() && same_file(o.out, o.weights))
        throw usage_error("--out and --weights name the same file (" + o.out + ")");
}

void run(const attention_options& o) {
    check_usage(o);
    const attention_inputs in = load_attention_inputs(o.files, static_cast<std::size_t>(o.heads));

    qkv::run_options options;
    if (o.scale_option->count() > 0) options.scale = o.scale;
    options.causal = o.causal;
    options.return_weights = !o.weights.empty();
    options.precision = o.precision;
    options.implementation = o.implementation;
    options.kernel = o.kernel;
    const qkv::attention_problem problem = in.problem(options);
    qkv::validate(problem);  // anything the checks above missed is still bad input (exit 2)

    const std::optional<std::string> device = o.device.empty() ? std::nullopt : std::optional(o.device);
    const backend_result r = run_attention(problem, o.choice, device);

    const qkv::attention_shape& s = in.shape;
    std::vector<std::size_t> out_shape{s.seq, s.out_width()};
    std::vector<std::size_t> weights_shape{s.heads, s.seq, s.seq};
    if (in.batched) {
        out_shape.insert(out_shape.begin(), s.batch);
        weights_shape.insert(weights_shape.begin(), s.batch);
    }
    write_all({{o.out, out_shape, r.result.output}, {o.weights, weights_shape, r.result.weights}});
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
    "  OUT is float32 (N, d) or (B, N, d) with d = d_out with --wo, else d_v; W is float32\n"
    "  (H, N, N) or (B, H, N, N).\n"
    "\nInputs are float32 or float64 .npy files in C order (M may also be bool). A row that may\n"
    "attend to no position gets zero weights and a zero attention output (then + Bo).\n"
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
    add_choice<qkv::kernel_family>(*cmd, "--kernel", o->kernel,
                                   {{"auto", qkv::kernel_family::automatic},
                                    {"cpu", qkv::kernel_family::cpu},
                                    {"gpu", qkv::kernel_family::gpu}},
                                   "fused kernel family: auto (cpu on a CPU device such as lavapipe, gpu elsewhere), "
                                   "cpu (rows on SIMD lanes, texel-buffer loads) or gpu (shared-memory tiles)")
        ->group(running);
    cmd->add_option("--device", o->device,
                    "Vulkan device: an index or a part of its name (see `qkv devices`); default: QKV_DEVICE, "
                    "else the best device")
        ->type_name("INDEX|NAME")
        ->group(running);

    cmd->callback([o] { run(*o); });
}

}  // namespace qkv::cli
