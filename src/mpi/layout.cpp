// Slices of a sequence across ranks (qkv/mpi/layout.hpp).
#include "qkv/mpi/layout.hpp"

#include <limits>
#include <string>

#include "qkv/runtime/error.hpp"

namespace qkv::mpi {

sequence_slice slice_of(std::size_t length, int ranks, int rank, layout how) {
    if (ranks < 1)
        throw qkv::invalid_argument("slice_of: ranks must be at least 1 (it is " + std::to_string(ranks) + ")");
    if (rank < 0 || rank >= ranks)
        throw qkv::invalid_argument("slice_of: rank " + std::to_string(rank) + " is not in [0, " +
                                    std::to_string(ranks) + ")");
    const auto R = static_cast<std::size_t>(ranks), r = static_cast<std::size_t>(rank);
    sequence_slice s;
    const auto add = [&](row_range range) {
        if (range.size() > 0) s.ranges.push_back(range);
    };
    switch (how) {
        case layout::contiguous:
            add(chunk(length, R, r));
            return s;
        case layout::zigzag:
            add(chunk(length, 2 * R, r));
            add(chunk(length, 2 * R, 2 * R - 1 - r));
            return s;
    }
    throw qkv::invalid_argument("slice_of: unknown layout (" + std::to_string(static_cast<int>(how)) + ")");
}

std::string to_string(layout how) {
    switch (how) {
        case layout::contiguous:
            return "contiguous";
        case layout::zigzag:
            return "zigzag";
    }
    return "unknown";
}

namespace detail {

void check_rows(std::size_t whole_size, std::size_t outer, std::size_t length, std::size_t width,
                const sequence_slice& slice, const char* what) {
    const std::size_t max = std::numeric_limits<std::size_t>::max();
    if ((length != 0 && outer > max / length) || (width != 0 && outer * length > max / width))
        throw qkv::invalid_argument(std::string(what) + ": outer * length * width overflows");
    if (whole_size != outer * length * width)
        throw qkv::invalid_argument(
            std::string(what) + ": the whole tensor holds " + std::to_string(whole_size) +
            " elements, expected outer * length * width = " + std::to_string(outer * length * width));
    for (const row_range& r : slice.ranges)
        if (r.first > r.end || r.end > length)
            throw qkv::invalid_argument(std::string(what) + ": the range [" + std::to_string(r.first) + ", " +
                                        std::to_string(r.end) + ") is not within [0, " + std::to_string(length) + ")");
}

}  // namespace detail
}  // namespace qkv::mpi
