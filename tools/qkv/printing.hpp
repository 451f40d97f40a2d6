// Text layout for the terminal: paragraphs wrapped to a width, matrices with aligned columns,
// and plain tables. Widths count UTF-8 code points, so "·" and "✓" take one column.
#pragma once

#include <cstddef>
#include <iosfwd>
#include <string>
#include <string_view>
#include <vector>

#include "grid.hpp"

namespace qkv::cli {

/// Columns `text` takes on a terminal (one per UTF-8 code point).
std::size_t display_width(std::string_view text);

/// `text` followed by spaces up to `width` columns.
std::string pad_right(std::string_view text, std::size_t width);

/// Writes `text` wrapped at word boundaries to lines of at most `width` columns, each line
/// starting with `indent` spaces. A '\n' in `text` starts a new line.
void print_wrapped(std::ostream& os, std::string_view text, std::size_t indent, std::size_t width = 96);

/// Decimals that show every value of the grids honestly: 0 when all are whole numbers, else 4.
int decimals_for(const std::vector<const grid*>& grids);

/// One number: fixed-point with `decimals` decimals, "-0" shown as "0".
std::string format_number(double value, int decimals);

/// Width of each column's widest entry across `grids` (all with the same number of columns).
std::vector<std::size_t> column_widths(const std::vector<const grid*>& grids, int decimals);

/// The rows of `g` as "[a  b  c]", column c right-aligned to widths[c].
std::vector<std::string> format_rows(const grid& g, int decimals, const std::vector<std::size_t>& widths);

/// Row r of `g` inline, as "[a, b, c]"; whole numbers without decimals, others with 4.
std::string inline_row(const grid& g, std::size_t r);

/// A table with a header row, a dashed rule under it (none under an empty header), and
/// left-aligned columns.
void print_table(std::ostream& os, const std::vector<std::string>& header,
                 const std::vector<std::vector<std::string>>& rows, std::size_t indent = 0);

}  // namespace qkv::cli
