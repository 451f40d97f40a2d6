// `qkv merge`: partial attention results over disjoint key sets (each part's output and
// log-sum-exp, as `qkv sdpa --out O.npy --lse LSE.npy` writes them, computed without sinks) merged
// into the whole (qkv::merge_attention, qkv/runtime/sdpa.hpp), with the sinks applied once.
#include <CLI/CLI.hpp>

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "commands.hpp"
#include "errors.hpp"
#include "npy/npy.hpp"
#include "numeric_input.hpp"
#include "output_files.hpp"
#include "qkv/runtime/sdpa.hpp"

namespace qkv::cli {
namespace {

struct merge_command_options {
    std::vector<std::string> parts;  // O1, LSE1, O2, LSE2, ...
    std::string sinks, out, lse;
    const CLI::Option* sinks_option = nullptr;
    const CLI::Option* lse_option = nullptr;
};

std::string dims(const std::vector<std::size_t>& shape) {
    std::string s = "(";
    for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + (shape.size() == 1 ? ",)" : ")");
}

numeric_input load(const std::string& path, const std::string& flag) {
    if (path.empty()) throw usage_error(flag + " names an empty path: name a .npy file");
    qkv::npy::array a;
    try {
        a = qkv::npy::read(qkv::npy::path_from_utf8(path));
    } catch (const qkv::npy::error& e) {
        throw usage_error(e.what());
    }
    if (a.type != qkv::npy::dtype::f32 && a.type != qkv::npy::dtype::f64)
        throw usage_error(a.name + " (" + flag + ") has dtype " + std::string(qkv::npy::dtype_name(a.type)) +
                          ": expected float");
    return numbers(a, flag);
}

void run(const merge_command_options& o) {
    if (o.out.empty()) throw usage_error("--out is empty: name the file to write the merged output to");
    if (o.lse_option->count() > 0 && o.lse.empty())
        throw usage_error("--lse is empty: name the file to write the merged log-sum-exp to, or leave --lse out");
    if (o.sinks_option->count() > 0 && o.sinks.empty())
        throw usage_error("--sinks is empty: name the .npy file of the sink logits, or leave --sinks out");
    if (o.parts.empty() || o.parts.size() % 2 != 0)
        throw usage_error("--part takes two files, the part's output and its log-sum-exp: --part O.npy LSE.npy (" +
                          std::to_string(o.parts.size()) + " file" + (o.parts.size() == 1 ? "" : "s") + " given)");

    std::vector<named_file> inputs;
    for (std::size_t i = 0; i < o.parts.size(); ++i) inputs.push_back({"--part", o.parts[i]});
    inputs.push_back({"--sinks", o.sinks});
    const std::vector<named_file> outputs = {{"--out", o.out}, {"--lse", o.lse}};
    check_output_paths(outputs, inputs);  // before any work: never over an input, a link or a device

    std::vector<numeric_input> outs, lses;
    for (std::size_t i = 0; i + 1 < o.parts.size(); i += 2) {
        outs.push_back(load(o.parts[i], "--part"));
        lses.push_back(load(o.parts[i + 1], "--part"));
    }
    // O is (L, Ev), (Hq, L, Ev) or (B, Hq, L, Ev); LSE has O's leading dimensions.
    const numeric_input& o0 = outs[0];
    if (o0.shape.size() < 2 || o0.shape.size() > 4)
        throw usage_error("--part " + o0.name + " " + dims(o0.shape) +
                          ": an output must be (L, Ev), (Hq, L, Ev) or (B, Hq, L, Ev)");
    for (std::size_t i = 0; i < outs.size(); ++i) {
        if (outs[i].shape != o0.shape)
            throw usage_error("--part " + outs[i].name + " " + dims(outs[i].shape) + " and " + o0.name + " " +
                              dims(o0.shape) + ": every part's output must have the same shape");
        const std::vector<std::size_t> want(o0.shape.begin(), o0.shape.end() - 1);
        if (lses[i].shape != want)
            throw usage_error("--part " + lses[i].name + " " + dims(lses[i].shape) + ": the log-sum-exp must have " +
                              outs[i].name + "'s leading dimensions " + dims(want));
    }
    std::vector<std::size_t> s4(4 - o0.shape.size(), 1);
    s4.insert(s4.end(), o0.shape.begin(), o0.shape.end());
    const qkv::merge_shape shape{.batch = s4[0], .q_heads = s4[1], .q_len = s4[2], .d_v = s4[3]};
    numeric_input sinks;
    if (!o.sinks.empty()) {
        sinks = load(o.sinks, "--sinks");
        if (sinks.shape != std::vector<std::size_t>{shape.q_heads})
            throw usage_error("--sinks " + sinks.name + " " + dims(sinks.shape) +
                              ": the sinks must be one logit per query head, (Hq,) = (" +
                              std::to_string(shape.q_heads) + ",)");
    }

    bool float64 = sinks.float64;
    for (std::size_t i = 0; i < outs.size(); ++i) float64 = float64 || outs[i].float64 || lses[i].float64;
    const std::vector<std::size_t> lse_shape(o0.shape.begin(), o0.shape.end() - 1);
    output_set files;
    files.reserve({o.out, o.lse});  // an output that cannot be created fails before the work
    if (float64) {                  // any float64 input: merged and written in float64
        std::vector<qkv::attention_part_f64> parts;
        widen(sinks);
        for (std::size_t i = 0; i < outs.size(); ++i) {
            widen(outs[i]), widen(lses[i]);
            parts.push_back({outs[i].f64, lses[i].f64});
        }
        const qkv::merged_attention_f64 m = qkv::merge_attention(parts, shape, sinks.f64);
        files.commit(
            {{o.out, o0.shape, std::span<const double>(m.out)}, {o.lse, lse_shape, std::span<const double>(m.lse)}});
        return;
    }
    std::vector<qkv::attention_part> parts;  // every input float32
    for (std::size_t i = 0; i < outs.size(); ++i) parts.push_back({outs[i].f32, lses[i].f32});
    const qkv::merged_attention m = qkv::merge_attention(parts, shape, sinks.f32);
    files.commit({{o.out, o0.shape, std::span<const float>(m.out)}, {o.lse, lse_shape, std::span<const float>(m.lse)}});
}

constexpr const char* footer =
    "Merges attention computed over disjoint key sets (shards, devices, machines): each part is the\n"
    "output O_p and the log-sum-exp LSE_p of `qkv sdpa --out O_p.npy --lse LSE_p.npy` over its keys,\n"
    "computed WITHOUT sinks. Per row, leaving out the parts whose LSE is -inf, with M = max_p LSE_p:\n"
    "  LSE = M + log sum_p e^(LSE_p - M)\n"
    "  O   = sum_p e^(LSE_p - M') O_p / (sum_p e^(LSE_p - M') + e^(sink_h - M')), M' = max(M, sink_h)\n"
    "(without --sinks the e^(sink_h - M') term is absent): the whole call's output (sinks applied\n"
    "once, here) and log-sum-exp (sinks not included). A row no part attends gets zeros and -inf.\n"
    "\nShapes: O (B, Hq, L, Ev), (Hq, L, Ev) or (L, Ev), the same for every part; LSE has O's\n"
    "leading dimensions; SINKS is (Hq,). float32 in, float32 out; any float64 input: float64.\n"
    "\nFiles and exit status as `qkv sdpa`: 0 success, 2 bad input or usage, 1 a run-time failure;\n"
    "no output file is left behind on failure.";

}  // namespace

void add_merge(CLI::App& app) {
    auto o = std::make_shared<merge_command_options>();
    CLI::App* cmd = app.add_subcommand(
        "merge", "Merge partial attention results over disjoint key sets by their log-sum-exp (qkv sdpa --lse)");
    cmd->footer(footer);
    cmd->add_option("--part", o->parts, "One part: its output and its log-sum-exp (repeat for every part)")
        ->required()
        ->expected(2)
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
        ->type_name("O.npy LSE.npy");
    o->sinks_option = cmd->add_option("--sinks", o->sinks, "Sink logits, float (Hq,), applied once to the merge")
                          ->type_name("SINKS.npy");
    cmd->add_option("--out", o->out, "Where to write the merged output")->required()->type_name("O.npy");
    o->lse_option = cmd->add_option("--lse", o->lse, "Also write the merged log-sum-exp")->type_name("LSE.npy");
    cmd->callback([o] { run(*o); });
}

}  // namespace qkv::cli
