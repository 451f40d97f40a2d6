// libFuzzer target for the shape and mask checks of `qkv attention` (tools/qkv/attention_inputs.cpp):
// a handful of .npy images (the input split at "\nNPY|") read as x, wq, wk, wv, bq, bk, bv, wo, bo
// and the mask; the first bytes pick which are given, the heads and the options. Invariants:
//   - bad input is a usage_error, never anything else;
//   - what the checks accept, qkv::validate accepts too, as float32 and as float64;
//   - on small shapes the CPU backend computes it, with outputs of the promised sizes, and a float64
//     problem of float32 values gives attention_f64's results bit for bit.
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "attention_inputs.hpp"
#include "errors.hpp"
#include "npy/npy.hpp"
#include "qkv/runtime/cpu.hpp"
#include "qkv/vulkan/error.hpp"

namespace {

[[noreturn]] void die(const char* what, const std::string& detail = {}) {
    std::fprintf(stderr, "attention_inputs_fuzz: invariant violated: %s %s\n", what, detail.c_str());
    std::abort();
}

void check(bool ok, const char* what, const std::string& detail = {}) {
    if (!ok) die(what, detail);
}

bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i)
        if (std::bit_cast<std::uint64_t>(a[i]) != std::bit_cast<std::uint64_t>(b[i])) return false;
    return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size < 3) return 0;
    const unsigned given = data[0];         // bit i: the i-th optional input (bq, bk, bv, wo, bo, mask)
    const std::size_t heads = data[1] % 5;  // 0 included: refused
    const unsigned flags = data[2];
    const std::string_view rest(reinterpret_cast<const char*>(data + 3), size - 3);

    std::map<std::string, std::string_view> images;
    const char* const names[] = {"x", "wq", "wk", "wv", "bq", "bk", "bv", "wo", "bo", "mask"};
    std::size_t start = 0;
    for (const char* name : names) {
        if (start > rest.size()) break;
        const std::size_t end = std::min(rest.find("\nNPY|", start), rest.size());
        images[name] = rest.substr(start, end - start);
        start = end + 5;
    }

    qkv::cli::attention_files files;
    files.x = "x", files.wq = "wq", files.wk = "wk", files.wv = "wv";
    std::string* optional[] = {&files.bq, &files.bk, &files.bv, &files.wo, &files.bo, &files.mask};
    for (std::size_t i = 0; i < 6; ++i)
        if (given & (1u << i)) *optional[i] = names[4 + i];
    const qkv::cli::npy_reader reader = [&images](const std::string& path) {
        const auto it = images.find(path);
        if (it == images.end()) throw qkv::npy::error(path + ": cannot open for reading: no such image");
        return qkv::npy::parse(std::as_bytes(std::span(it->second.data(), it->second.size())), path);
    };

    qkv::cli::attention_inputs in;
    try {
        in = qkv::cli::load_attention_inputs(files, heads, reader);
    } catch (const qkv::cli::usage_error& e) {
        check(std::strlen(e.what()) > 0, "an empty message");
        return 0;
    }

    qkv::run_options options;
    options.causal = (flags & 1) != 0;
    options.return_weights = (flags & 2) != 0;
    if (flags & 4) options.scale = 0.5f;
    const qkv::attention_shape& s = in.shape;
    const std::size_t rows = s.batch * s.seq;
    const bool small = rows <= 64 && s.seq <= 32 && s.d_in <= 64 && s.d_k <= 64 && s.d_v <= 64 && s.d_out <= 64;

    // float64: every input widened, nothing rounded.
    in.to_float64();
    const qkv::cpu::attention_problem_f64 p64 = in.problem_f64(options);
    try {
        qkv::cpu::validate(p64);
    } catch (const qkv::invalid_argument& e) {
        die("the CLI's checks accepted what validate (float64) refuses:", e.what());
    }

    // float32: narrowed, or refused as beyond the float32 range.
    bool narrowed = true;
    try {
        in.to_float32();
    } catch (const qkv::cli::usage_error& e) {
        check(std::string_view(e.what()).find("beyond the float32 range") != std::string_view::npos,
              "to_float32 failed otherwise:", e.what());
        narrowed = false;
    }
    if (narrowed) {
        const qkv::attention_problem p32 = in.problem(options);
        try {
            qkv::validate(p32);
        } catch (const qkv::invalid_argument& e) {
            die("the CLI's checks accepted what validate refuses:", e.what());
        }
        // Narrowing never made a finite value infinite.
        for (const qkv::cli::numeric_input* n :
             {&in.x, &in.wq, &in.wk, &in.wv, &in.bq, &in.bk, &in.bv, &in.wo, &in.bo, &in.additive_mask})
            for (std::size_t i = 0; i < n->f32.size(); ++i)
                check(std::isfinite(n->f32[i]) == std::isfinite(n->f64[i]),
                      "narrowing made a finite value infinite:", n->name);
    }

    if (!small) return 0;
    const qkv::cpu::attention_output_f64 r64 = qkv::cpu::attention(p64);
    check(r64.output.size() == rows * s.out_width(), "float64 output size");
    check(r64.weights.size() == (options.return_weights ? s.batch * s.heads * s.seq * s.seq : 0),
          "float64 weights size");
    if (narrowed && !in.any_float64()) {
        const qkv::cpu::attention_output_f64 r32 = qkv::cpu::attention_f64(in.problem(options));
        check(same_bits(r32.output, r64.output), "float64 problem of float32 values: output differs");
        check(same_bits(r32.weights, r64.weights), "float64 problem of float32 values: weights differ");
    }
    return 0;
}
