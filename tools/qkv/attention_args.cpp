// The options of `qkv attention` and their checks (see attention_args.hpp).
#include "attention_args.hpp"

#include <CLI/CLI.hpp>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>

#include "choice_option.hpp"
#include "common_flags.hpp"
#include "errors.hpp"
#include "flag_args.hpp"
#include "names.hpp"

namespace qkv::cli {

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
        throw usage_error(
            bad + "beyond the float32 range (the scale must be finite as a float32, |scale| <= " + "3.4028235e38)");
    const float scale = static_cast<float>(value);
    if (value != 0 && scale == 0) throw usage_error(bad + "rounds to 0 as a float32");
    if (!std::isfinite(scale)) throw usage_error(bad + "the scale must be finite as a float32");
    return scale;
}

std::size_t parse_heads(const std::string& text) { return parse_count("--heads", text); }

void check_usage(const attention_options& o) {
    refuse_empty_file_names(*o.command);  // --mask "" is not "no mask"
    if (o.scale_option->count() > 0) (void)parse_scale(o.scale);
    (void)parse_heads(o.heads);
    if (!o.weights.empty() && o.implementation == qkv::implementation::fused)
        throw usage_error(
            "--weights needs the staged implementation: --impl fused never materialises the "
            "attention weights (use --impl staged, or leave --impl auto)");
}

void add_attention_options(CLI::App& cmd, attention_options& o) {
    o.command = &cmd;
    const std::string inputs = "Inputs";
    cmd.add_option("--x", o.files.x, "The input sequence")->required()->type_name("X.npy")->group(inputs);
    cmd.add_option("--wq", o.files.wq, "Query weights")->required()->type_name("WQ.npy")->group(inputs);
    cmd.add_option("--wk", o.files.wk, "Key weights")->required()->type_name("WK.npy")->group(inputs);
    cmd.add_option("--wv", o.files.wv, "Value weights")->required()->type_name("WV.npy")->group(inputs);
    cmd.add_option("--bq", o.files.bq, "Query bias (optional)")->type_name("BQ.npy")->group(inputs);
    cmd.add_option("--bk", o.files.bk, "Key bias (optional)")->type_name("BK.npy")->group(inputs);
    cmd.add_option("--bv", o.files.bv, "Value bias (optional)")->type_name("BV.npy")->group(inputs);
    CLI::Option* wo =
        cmd.add_option("--wo", o.files.wo, "Output projection weights (optional)")->type_name("WO.npy")->group(inputs);
    cmd.add_option("--bo", o.files.bo, "Output projection bias (needs --wo)")
        ->type_name("BO.npy")
        ->needs(wo)
        ->group(inputs);
    add_mask_option(cmd, o.files.mask, "")->group(inputs);

    const std::string outputs = "Outputs";
    add_out_option(cmd, o.out)->group(outputs);
    o.weights_option =
        cmd.add_option("--weights", o.weights, "Also write the attention probabilities (needs --impl staged or auto)")
            ->type_name("W.npy")
            ->group(outputs);

    const std::string attention = "Attention";
    cmd.add_option("--heads", o.heads, "Number of heads; must divide d_k and d_v")
        ->type_name("H")
        ->default_str("1")
        ->group(attention);
    o.scale_option = cmd.add_option("--scale", o.scale,
                                    "Multiplies Q\u00b7K\u1d40 (any finite float32, negative and 0 "
                                    "included); --scale 1 is the tutorial's plain dot product")
                         ->type_name("S")
                         ->default_str("1/sqrt(d_k/H)")
                         ->group(attention);
    cmd.add_flag("--causal", o.causal, "Position i attends only to positions j <= i (combines with --mask)")
        ->group(attention);

    const std::string running = "Backend";
    add_backend_option(cmd, o.choice,
                       "vulkan, or cpu: the float64 CPU reference backend, which ignores --precision, --impl "
                       "and --device")
        ->group(running);
    add_choice<qkv::precision>(cmd, "--precision", o.precision, precision_names(),
                               "fp32, or fp16: Q, K, V stored in float16 (needs a device with 16-bit storage)")
        ->group(running);
    add_choice<qkv::implementation>(cmd, "--impl", o.implementation, implementation_names(),
                                    "auto (fused, or staged with --weights), staged (four passes, N x N scores in "
                                    "memory) or fused (one flash-attention pass)")
        ->group(running);
    add_choice<qkv::kernel_family>(
        cmd, "--kernel", o.kernel, kernel_names(),
        "kernel family: auto (row_tiles on a CPU device such as lavapipe, block_tiles elsewhere), row_tiles "
        "(rows on SIMD lanes, texel-buffer loads), block_tiles (shared-memory tiles) or coopmat (matrix units, "
        "fp16; fused only; refused on GPUs until one runs it right, QKV_COOP_UNVERIFIED=1 to try); cpu and gpu "
        "are the old names of row_tiles and block_tiles")
        ->group(running);
    add_device_option(cmd, o.device)->group(running);
}

}  // namespace qkv::cli
