// The layout of `qkv example`: numbered steps with their explanations, and each run-time matrix
// printed beside its compile-time value with a ✓ or ✗ verdict. Counts the verdicts.
#pragma once

#include <iosfwd>
#include <string_view>

#include "agreement.hpp"
#include "grid.hpp"

namespace qkv::cli {

class walkthrough {
public:
    explicit walkthrough(std::ostream& os) : os_(os) {}

    /// "Step <number> — <title>", then the explanation wrapped and indented.
    void step(int number, std::string_view title, std::string_view explanation);

    /// A paragraph, wrapped and indented.
    void text(std::string_view paragraph);

    /// `run` (left, headed `run_source`) beside `compiled` (right, headed `compiled_name`), one
    /// row per line, labelled `label 1`, `label 2`, ... (no labels when `label` is empty); the
    /// verdict goes on the first row.
    void compare(std::string_view caption, std::string_view label, std::string_view run_source, const grid& run,
                 std::string_view compiled_name, const grid& compiled, tolerance tol);

    /// The tutorial's step 7 layout: the rows of `parts` added up (in float), then their sum.
    void sum(const grid& parts, std::string_view result_name);

    [[nodiscard]] int checks() const { return checks_; }
    [[nodiscard]] int disagreements() const { return disagreements_; }

private:
    std::ostream& os_;
    int checks_ = 0;
    int disagreements_ = 0;
};

}  // namespace qkv::cli
