// Text layout for the terminal (see printing.hpp).
#include "printing.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ostream>

namespace qkv::cli {

std::size_t display_width(std::string_view text) {
    // Count the bytes that start a code point: everything but UTF-8 continuation bytes 10xxxxxx.
    return static_cast<std::size_t>(std::count_if(
        text.begin(), text.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0U) != 0x80U; }));
}

std::string pad_right(std::string_view text, std::size_t width) {
    std::string s(text);
    const std::size_t w = display_width(text);
    if (w < width) s.append(width - w, ' ');
    return s;
}

void print_wrapped(std::ostream& os, std::string_view text, std::size_t indent, std::size_t width) {
    const std::string margin(indent, ' ');
    while (true) {
        const std::size_t end_of_line = text.find('\n');
        std::string_view paragraph = text.substr(0, end_of_line);
        std::string line;
        while (!paragraph.empty()) {
            const std::size_t space = paragraph.find(' ');
            const std::string_view word = paragraph.substr(0, space);
            paragraph = space == std::string_view::npos ? std::string_view{} : paragraph.substr(space + 1);
            if (word.empty()) continue;
            if (!line.empty() && indent + display_width(line) + 1 + display_width(word) > width) {
                os << margin << line << '\n';
                line.clear();
            }
            if (!line.empty()) line += ' ';
            line += word;
        }
        os << margin << line << '\n';
        if (end_of_line == std::string_view::npos) return;
        text = text.substr(end_of_line + 1);
    }
}

int decimals_for(const std::vector<const grid*>& grids) {
    for (const grid* g : grids)
        for (double v : g->values)
            if (!std::isfinite(v) || v != std::round(v)) return 4;
    return 0;
}

std::string format_number(double value, int decimals) {
    if (value == 0) value = 0;  // no "-0"
    char buffer[64];
    std::snprintf(buffer, sizeof buffer, "%.*f", decimals, value);
    std::string s(buffer);
    if (s.find_first_not_of("-0.") == std::string::npos && s.front() == '-') s.erase(0, 1);  // "-0.0000"
    return s;
}

std::vector<std::size_t> column_widths(const std::vector<const grid*>& grids, int decimals) {
    std::vector<std::size_t> widths;
    for (const grid* g : grids) {
        widths.resize(std::max(widths.size(), g->cols), 0);
        for (std::size_t r = 0; r < g->rows; ++r)
            for (std::size_t c = 0; c < g->cols; ++c)
                widths[c] = std::max(widths[c], format_number((*g)(r, c), decimals).size());
    }
    return widths;
}

std::vector<std::string> format_rows(const grid& g, int decimals, const std::vector<std::size_t>& widths) {
    std::vector<std::string> rows;
    for (std::size_t r = 0; r < g.rows; ++r) {
        std::string line = "[";
        for (std::size_t c = 0; c < g.cols; ++c) {
            const std::string number = format_number(g(r, c), decimals);
            if (c > 0) line += "  ";
            line.append(widths[c] > number.size() ? widths[c] - number.size() : 0, ' ');
            line += number;
        }
        rows.push_back(line + "]");
    }
    return rows;
}

std::string inline_row(const grid& g, std::size_t r) {
    grid row(1, g.cols);
    for (std::size_t c = 0; c < g.cols; ++c) row(0, c) = g(r, c);
    const int decimals = decimals_for({&row});
    std::string s = "[";
    for (std::size_t c = 0; c < g.cols; ++c) s += (c ? ", " : "") + format_number(row(0, c), decimals);
    return s + "]";
}

void print_table(std::ostream& os, const std::vector<std::string>& header,
                 const std::vector<std::vector<std::string>>& rows, std::size_t indent) {
    std::vector<std::size_t> widths(header.size(), 0);
    for (std::size_t c = 0; c < header.size(); ++c) widths[c] = display_width(header[c]);
    for (const auto& row : rows)
        for (std::size_t c = 0; c < row.size() && c < widths.size(); ++c)
            widths[c] = std::max(widths[c], display_width(row[c]));

    const std::string margin(indent, ' ');
    const auto print_row = [&](const std::vector<std::string>& cells) {
        std::string line;
        for (std::size_t c = 0; c < cells.size() && c < widths.size(); ++c)
            line += (c + 1 < widths.size()) ? pad_right(cells[c], widths[c] + 2) : cells[c];
        while (!line.empty() && line.back() == ' ') line.pop_back();
        os << margin << line << '\n';
    };
    print_row(header);
    std::vector<std::string> rule;
    for (std::size_t c = 0; c < widths.size(); ++c) rule.emplace_back(widths[c], header[c].empty() ? ' ' : '-');
    print_row(rule);
    for (const auto& row : rows) print_row(row);
}

}  // namespace qkv::cli
