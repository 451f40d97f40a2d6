// The subcommands of the qkv tool. Each registers itself, its options and its action on the
// application; adding a subcommand is one declaration here and one call in main.cpp.
#pragma once

#include "cli_fwd.hpp"

namespace qkv::cli {

void add_example(CLI::App& app);    // example.cpp: the tutorial's worked example, step by step
void add_devices(CLI::App& app);    // devices.cpp: the Vulkan devices of this machine
void add_attention(CLI::App& app);  // attention.cpp: attention over .npy files
void add_bench(CLI::App& app);      // bench.cpp: timings over a sweep of shapes, against the device ceiling
void add_sdpa(CLI::App& app);       // sdpa.cpp: scaled dot-product attention over Q, K, V .npy files
void add_merge(CLI::App& app);      // merge.cpp: partial attention results merged by their log-sum-exp

}  // namespace qkv::cli
