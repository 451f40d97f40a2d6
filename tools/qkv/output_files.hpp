// Writing the results of `qkv attention`: all of them or none.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <vector>

namespace qkv::cli {

struct output_file {
    std::string path;  ///< UTF-8; empty: not requested
    std::vector<std::size_t> shape;
    std::span<const float> data;
};

/// Writes each requested file as float32 .npy (each write is atomic). If one fails, the files
/// already written by this call are removed and the error (naming the path) is rethrown as a
/// std::runtime_error: a run never leaves some of its outputs behind.
void write_all(const std::vector<output_file>& files);

}  // namespace qkv::cli
