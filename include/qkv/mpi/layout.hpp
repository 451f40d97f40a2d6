// How a sequence is cut across the ranks of a communicator: which global positions (query rows,
// key rows) each rank holds. Pure functions, no MPI: every rank computes every rank's slice.
//
//   contiguous  rank r holds chunk r of R balanced chunks (sizes differ by at most one; the first
//               length % R chunks are the longer ones)
//   zigzag      the sequence is cut into 2R balanced chunks; rank r holds chunks r and 2R - 1 - r,
//               in that order. With a causal mask every rank then has the same work: an early
//               chunk (few keys visible) paired with a late one (many), as ring attention's
//               "zigzag" / Megatron's load-balanced context parallelism.
//
// A rank's local tensor holds its rows in the order of its ranges, for every leading index: a
// (B, H, N, D) tensor becomes (B, H, rows(), D). Some ranks may hold no rows (N < R or N < 2R).
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "qkv/mpi/export.hpp"
#include "qkv/runtime/error.hpp"

namespace qkv::mpi {

enum class layout {
    contiguous,  ///< rank r: chunk r of R
    zigzag,      ///< rank r: chunks r and 2R - 1 - r of 2R
};

/// Global positions [first, end).
struct row_range {
    std::size_t first = 0, end = 0;
    [[nodiscard]] constexpr std::size_t size() const { return end > first ? end - first : 0; }
    friend constexpr bool operator==(const row_range&, const row_range&) = default;
};

/// The rows one rank holds: its ranges in local order (empty ranges left out).
struct sequence_slice {
    std::vector<row_range> ranges;
    [[nodiscard]] std::size_t rows() const {
        std::size_t n = 0;
        for (const row_range& r : ranges) n += r.size();
        return n;
    }
    friend bool operator==(const sequence_slice&, const sequence_slice&) = default;
};

/// Chunk k of `parts` balanced chunks of [0, length): the first length % parts are one longer.
[[nodiscard]] constexpr row_range chunk(std::size_t length, std::size_t parts, std::size_t k) {
    const std::size_t base = length / parts, extra = length % parts;
    const std::size_t first = k * base + (k < extra ? k : extra);
    return {first, first + base + (k < extra ? 1 : 0)};
}

/// The slice of rank `rank` among `ranks` of a sequence of `length` positions. Throws
/// qkv::invalid_argument for ranks < 1 or a rank outside [0, ranks).
[[nodiscard]] QKV_MPI_API sequence_slice slice_of(std::size_t length, int ranks, int rank, layout how);

/// "contiguous" or "zigzag".
[[nodiscard]] QKV_MPI_API std::string to_string(layout how);

/// The rows of `slice` out of a whole tensor of shape (outer, length, width): a tensor of shape
/// (outer, slice.rows(), width). Throws qkv::invalid_argument when `whole` does not hold
/// outer · length · width elements or a range passes `length`.
template <class T>
[[nodiscard]] std::vector<T> take_rows(std::span<const T> whole, std::size_t outer, std::size_t length,
                                       std::size_t width, const sequence_slice& slice);

/// The inverse: writes `part`, shape (outer, slice.rows(), width), into its rows of `whole`,
/// shape (outer, length, width). Throws qkv::invalid_argument when the sizes do not fit.
template <class T>
void put_rows(std::span<const T> part, std::size_t outer, std::size_t length, std::size_t width,
              const sequence_slice& slice, std::span<T> whole);

// ---- implementation ----------------------------------------------------------------------------

namespace detail {
/// Throws qkv::invalid_argument unless whole_size == outer * length * width (without overflow) and
/// every range of `slice` lies in [0, length).
QKV_MPI_API void check_rows(std::size_t whole_size, std::size_t outer, std::size_t length, std::size_t width,
                            const sequence_slice& slice, const char* what);
}  // namespace detail

template <class T>
std::vector<T> take_rows(std::span<const T> whole, std::size_t outer, std::size_t length, std::size_t width,
                         const sequence_slice& slice) {
    const std::size_t rows = slice.rows();
    detail::check_rows(whole.size(), outer, length, width, slice, "take_rows");
    std::vector<T> part(outer * rows * width);
    T* to = part.data();
    for (std::size_t o = 0; o < outer; ++o)
        for (const row_range& r : slice.ranges) {
            const T* from = whole.data() + (o * length + r.first) * width;
            to = std::copy(from, from + r.size() * width, to);
        }
    return part;
}

template <class T>
void put_rows(std::span<const T> part, std::size_t outer, std::size_t length, std::size_t width,
              const sequence_slice& slice, std::span<T> whole) {
    const std::size_t rows = slice.rows();
    detail::check_rows(whole.size(), outer, length, width, slice, "put_rows");
    if (part.size() != outer * rows * width)
        throw qkv::invalid_argument(
            "put_rows: the part holds " + std::to_string(part.size()) +
            " elements, expected outer * rows * width = " + std::to_string(outer * rows * width));
    const T* from = part.data();
    for (std::size_t o = 0; o < outer; ++o)
        for (const row_range& r : slice.ranges) {
            std::copy(from, from + r.size() * width, whole.data() + (o * length + r.first) * width);
            from += r.size() * width;
        }
}

}  // namespace qkv::mpi
