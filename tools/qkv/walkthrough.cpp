// The layout of `qkv example` (see walkthrough.hpp).
#include "walkthrough.hpp"

#include <algorithm>
#include <ostream>
#include <string>

#include "printing.hpp"

namespace qkv::cli {

void walkthrough::step(int number, std::string_view title, std::string_view explanation) {
    os_ << "\nStep " << number << " \u2014 " << title << "\n";
    print_wrapped(os_, explanation, 2);
}

void walkthrough::text(std::string_view paragraph) { print_wrapped(os_, paragraph, 2); }

void walkthrough::compare(std::string_view caption, std::string_view label, std::string_view run_source,
                          const grid& run, std::string_view compiled_name, const grid& compiled, tolerance tol) {
    const agreement a = qkv::cli::compare(run, compiled, tol);
    ++checks_;
    if (!a.agrees) ++disagreements_;

    const int decimals = decimals_for({&run, &compiled});
    const auto widths = column_widths({&run, &compiled}, decimals);
    const auto left = format_rows(run, decimals, widths);
    const auto right = format_rows(compiled, decimals, widths);
    const std::size_t label_width = label.empty() ? 0 : display_width(label) + 5;
    std::size_t left_width = display_width(run_source), right_width = display_width(compiled_name);
    for (const auto& row : left) left_width = std::max(left_width, display_width(row));
    for (const auto& row : right) right_width = std::max(right_width, display_width(row));

    os_ << "\n";
    if (!caption.empty()) os_ << "  " << caption << "\n";
    os_ << "    " << std::string(label_width, ' ') << pad_right(run_source, left_width + 4) << compiled_name << "\n";
    for (std::size_t r = 0; r < run.rows; ++r) {
        const std::string name = label.empty() ? "" : std::string(label) + " " + std::to_string(r + 1);
        std::string line = "    " + pad_right(name, label_width) + pad_right(left[r], left_width + 4);
        line += r < right.size() ? right[r] : "";
        if (r == 0) line = pad_right(line, 4 + label_width + left_width + 4 + right_width + 4) + verdict(a);
        os_ << line << "\n";
    }
}

void walkthrough::sum(const grid& parts, std::string_view result_name) {
    grid total(1, parts.cols);
    for (std::size_t r = 0; r < parts.rows; ++r)
        for (std::size_t c = 0; c < parts.cols; ++c)
            total(0, c) = static_cast<double>(static_cast<float>(total(0, c)) + static_cast<float>(parts(r, c)));
    const int decimals = decimals_for({&parts, &total});
    const auto widths = column_widths({&parts, &total}, decimals);
    const auto rows = format_rows(parts, decimals, widths);
    os_ << "\n";
    for (std::size_t r = 0; r < rows.size(); ++r) os_ << "      " << (r == 0 ? "  " : "+ ") << rows[r] << "\n";
    os_ << "      " << std::string(display_width(rows.front()) + 2, '-') << "\n";
    os_ << "      = " << format_rows(total, decimals, widths).front() << "   " << result_name << "\n";
}

}  // namespace qkv::cli
