// Writing the results of `qkv attention`, `sdpa`, `merge` and `bench --json`: all of them or none,
// never over an input, never over something that is not a plain file, and nothing left behind
// when interrupted.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace qkv::cli {

/// A file named on the command line: the flag (for messages) and the path (UTF-8).
struct named_file {
    std::string flag;  ///< "--out", "--x", ...
    std::string path;
};

/// Refuses (usage_error, exit 2) before any work:
///  - an output that names an input, or another output: the same path, or the same file through a
///    symbolic link, a hard link or another spelling (device and inode compared, where it exists);
///  - an output that exists and is not a regular file: a directory, a device node, a FIFO, a
///    socket, or a symbolic link (qkv never replaces a link, nor writes through one).
/// Outputs with an empty path are skipped (not requested); inputs with an empty path likewise.
void check_output_paths(std::span<const named_file> outputs, std::span<const named_file> inputs);

/// One result to write: float32 or float64 data as .npy (of `shape`), or text written as it is
/// (a JSON report; `shape` unused).
struct output_file {
    std::string path;  ///< UTF-8; empty: not requested
    std::vector<std::size_t> shape;
    std::variant<std::span<const float>, std::span<const double>, std::string_view> data;
};

/// The outputs of one run, written all or none:
///  1. reserve(): a temporary file is created for each output in the output's own directory (a
///     short fixed-length name, ".qkv-XXXXXXXXXXXXXXXX.tmp", that fits any file system's name
///     limit), before any work, so an output that cannot be created fails early;
///  2. commit(files): each temporary is written and synced; then, only when all succeeded, each
///     is renamed over its target. A pre-existing target is first hard-linked to a backup name,
///     so if a later rename fails the earlier targets are put back, byte-identical.
/// On any failure (an exception, or destruction without commit) every temporary and backup is
/// removed. While temporaries exist, SIGINT and SIGTERM remove them and then end the process as
/// the signal would have (the handler only calls unlink/DeleteFile and raise).
class output_set {
public:
    output_set();
    ~output_set();
    output_set(const output_set&) = delete;
    output_set& operator=(const output_set&) = delete;

    /// Creates the temporary file of each non-empty path (in order). Throws std::runtime_error
    /// naming the output path and the OS error.
    void reserve(const std::vector<std::string>& paths);

    /// Writes `files` (the same paths, in the same order, as reserve()) and renames them into
    /// place. Throws std::runtime_error naming the path at fault; nothing is changed then.
    void commit(const std::vector<output_file>& files);

private:
    struct impl;
    std::unique_ptr<impl> impl_;
};

}  // namespace qkv::cli
