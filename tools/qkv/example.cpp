// `qkv example`: the tutorial's worked example, step by step, computed now on the chosen backend
// and checked against the values the compiler computed when qkv was built (qkv::tutorial).
#include "example.hpp"

#include <CLI/CLI.hpp>

#include <array>
#include <cstddef>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "agreement.hpp"
#include "backend.hpp"
#include "commands.hpp"
#include "common_flags.hpp"
#include "example_values.hpp"
#include "grid.hpp"
#include "printing.hpp"
#include "qkv/tutorial.hpp"
#include "walkthrough.hpp"

namespace qkv::cli {
namespace {

using qkv::tutorial::plain;
using qkv::tutorial::scaled;

// The tutorial's "weighted values" of each query, evaluated by the compiler.
constexpr std::array plain_weighted{qkv::weighted_values(plain, 0), qkv::weighted_values(plain, 1),
                                    qkv::weighted_values(plain, 2)};
constexpr std::array scaled_weighted{qkv::weighted_values(scaled, 0), qkv::weighted_values(scaled, 1),
                                     qkv::weighted_values(scaled, 2)};

struct example_options {
    backend choice = backend::vulkan;
    bool scaled = false;
};

std::string number(double value) { return format_number(value, 4); }

/// Query 1 · each key, unscaled: the tutorial's first scores.
grid first_query_dot_products(const example_values& v) {
    grid g(1, v.keys.rows);
    for (std::size_t j = 0; j < v.keys.rows; ++j)
        for (std::size_t c = 0; c < v.keys.cols; ++c) g(0, j) += v.queries(0, c) * v.keys(j, c);
    return g;
}

}  // namespace

example_verdict print_example(std::ostream& os, backend choice, bool scale_scores) {
    const example_options opt{.choice = choice, .scaled = scale_scores};
    const example_values v = compute_example(opt.choice, opt.scaled);
    const auto& ct = opt.scaled ? scaled : plain;
    const auto& ct_weighted = opt.scaled ? scaled_weighted : plain_weighted;
    const std::string ct_name = opt.scaled ? "qkv::tutorial::scaled" : "qkv::tutorial::plain";
    const std::string backend_name = opt.choice == backend::cpu ? "CPU backend" : "Vulkan device";
    const std::string on_backend = "run time, " + backend_name;
    const std::string on_host = "run time, host";

    walkthrough w(os);
    os << "Self-attention, step by step\n============================\n";
    w.text(std::string("The worked example of the tutorial qkv grew from: three inputs of width 4, and keys, "
                       "queries and values of width 3. ") +
           (opt.scaled ? "Scores are scaled by 1/sqrt(3), as in \"Attention Is All You Need\"."
                       : "Plain dot-product scores (scale 1), as in the tutorial; --scaled shows the scaled "
                         "version."));
    os << "\n";
    w.text(
        "Every matrix is shown twice. On the left, the value computed just now, at run time: the attention "
        "weights and outputs by the " +
        std::string(opt.choice == backend::cpu ? "CPU reference backend" : "Vulkan device") +
        ", and the keys, queries, values and scores (which the backend does not hand back) by plain loops "
        "on the host. On the right, the same matrix as the C++ compiler computed it while building qkv (" +
        ct_name +
        "). \u2713 marks agreement: exact for the whole-number steps, within 1e-6 (relative) for "
        "the others; \u2717 marks a disagreement.");

    w.step(1, "Prepare the inputs",
           "We start with 3 inputs, one per row, each with 4 numbers. In a language model each input would be "
           "the embedding of one token of the sentence.");
    w.compare("", "Input", "the tutorial's numbers", v.inputs, "qkv::tutorial::inputs", to_grid(qkv::tutorial::inputs),
              tolerance::exact);

    w.step(2, "Initialise the weights",
           "Every input gets three representations: a key, a query and a value. Each is made by multiplying "
           "the input by a weight matrix. Inputs have 4 numbers and we want representations of 3, so each "
           "weight matrix is 4 x 3. A real network starts from small random numbers and learns them; the "
           "tutorial picks small whole numbers.");
    w.compare("Weights for key", "", "the tutorial's numbers", v.w_key, "qkv::tutorial::w_key",
              to_grid(qkv::tutorial::w_key), tolerance::exact);
    w.compare("Weights for query", "", "the tutorial's numbers", v.w_query, "qkv::tutorial::w_query",
              to_grid(qkv::tutorial::w_query), tolerance::exact);
    w.compare("Weights for value", "", "the tutorial's numbers", v.w_value, "qkv::tutorial::w_value",
              to_grid(qkv::tutorial::w_value), tolerance::exact);

    w.step(3, "Derive the keys, queries and values",
           "Multiply the inputs by each weight matrix: keys = inputs \u00b7 W_key, queries = inputs \u00b7 W_query, "
           "values = inputs \u00b7 W_value. Row i of each result belongs to input i; for example input 1's key "
           "is [1, 0, 1, 0] \u00b7 W_key = " +
               inline_row(v.keys, 0) + ". (In practice a bias vector may be added as well.)");
    w.compare("Keys", "Input", on_host, v.keys, ct_name + ".keys", to_grid(ct.keys), tolerance::exact);
    w.compare("Queries", "Input", on_host, v.queries, ct_name + ".queries", to_grid(ct.queries), tolerance::exact);
    w.compare("Values", "Input", on_host, v.values, ct_name + ".values", to_grid(ct.values), tolerance::exact);

    std::string scores_text =
        "Each input's query is compared with every key, its own included, by a dot product: score(i, j) = "
        "query i \u00b7 key j. A large score means input i should pay much attention to input j. All at once: "
        "scores = queries \u00b7 keys\u1d40, one row per query. For query 1: " +
        inline_row(v.queries, 0) + " \u00b7 keys\u1d40 = " + inline_row(first_query_dot_products(v), 0) + ".";
    if (opt.scaled)
        scores_text += " Then every score is multiplied by 1/sqrt(3) = " + number(v.scale) +
                       " (3 is the width of the keys), which keeps softmax from saturating when keys are wide.";
    w.step(4, "Calculate the attention scores", scores_text);
    w.compare("Scores", "Query", on_host, v.scores, ct_name + ".scores", to_grid(ct.scores),
              opt.scaled ? tolerance::close : tolerance::exact);

    std::string softmax_text =
        "Softmax turns each row of scores into attention weights: exp(score) divided by the sum of exp over "
        "the row. The weights of a row are positive and add up to 1, and the highest score gets the largest "
        "share.";
    if (!opt.scaled)
        softmax_text +=
            " The tutorial rounds softmax([2, 4, 4]) to [0.0, 0.5, 0.5] for readability; these are "
            "the unrounded numbers.";
    w.step(5, "Calculate the softmax", softmax_text);
    w.compare("Attention weights", "Query", on_backend, v.weights, ct_name + ".weights", to_grid(ct.weights),
              tolerance::close);

    w.step(6, "Multiply the values by the weights",
           "For query i, the value of every input j is multiplied by the weight query i gives input j. The "
           "tutorial calls these vectors the weighted values (yellow in its figures). For query 1: " +
               number(v.weights(0, 0)) + " \u00b7 " + inline_row(v.values, 0) + ", " + number(v.weights(0, 1)) +
               " \u00b7 " + inline_row(v.values, 1) + " and " + number(v.weights(0, 2)) + " \u00b7 " +
               inline_row(v.values, 2) + ". Computed on the host from the " + backend_name + "'s weights.");
    for (std::size_t q = 0; q < v.weighted_values.size(); ++q)
        w.compare(
            "Weighted values of query " + std::to_string(q + 1), "Input", on_host, v.weighted_values[q],
            "qkv::weighted_values(" + std::string(opt.scaled ? "scaled" : "plain") + ", " + std::to_string(q) + ")",
            to_grid(ct_weighted[q]), tolerance::close);

    w.step(7, "Sum the weighted values to get the outputs",
           "Adding up the weighted values of query i, element by element, gives output i. For query 1:");
    w.sum(v.weighted_values.front(), "Output 1");
    os << "\n";
    w.text("The " + backend_name + " does steps 6 and 7 for every query in one go: outputs = weights \u00b7 " +
           "values." +
           std::string(opt.scaled ? ""
                                  : " (The tutorial, with its weights rounded, gets [2.0, 7.0, 1.5] for "
                                    "output 1.)"));
    w.compare("Outputs", "Output", on_backend, v.output, ct_name + ".output", to_grid(ct.output), tolerance::close);

    os << "\n";
    if (w.disagreements() == 0)
        os << "\u2713 All " << w.checks() << " matrices agree with the values computed at compile time.\n";
    else
        os << "\u2717 " << w.disagreements() << " of " << w.checks()
           << " matrices differ from the values computed at compile time.\n";
    os << "Ran on " << v.ran_on << "\n";
    os.flush();
    return {.checks = w.checks(), .disagreements = w.disagreements()};
}

namespace {

void run_example(const example_options& opt) {
    const example_verdict verdict = print_example(std::cout, opt.choice, opt.scaled);
    if (verdict.disagreements != 0)
        throw std::runtime_error(std::to_string(verdict.disagreements) + " of " + std::to_string(verdict.checks) +
                                 " matrices differ from the compile-time values (marked \u2717 above)");
}

}  // namespace

void add_example(CLI::App& app) {
    auto opt = std::make_shared<example_options>();
    CLI::App* cmd =
        app.add_subcommand("example",
                           "Walk through the tutorial's worked example step by step, computed now and checked against "
                           "the compile-time values");
    add_backend_option(*cmd, opt->choice,
                       "Where to compute the attention weights and outputs: vulkan (the default device, or "
                       "QKV_DEVICE) or cpu (the float64 reference backend)");
    cmd->add_flag("--scaled", opt->scaled, "Scale the scores by 1/sqrt(3) instead of 1");
    cmd->callback([opt] { run_example(*opt); });
}

}  // namespace qkv::cli
