// `--context-parallel` for `qkv sdpa` and `qkv bench`: the same command on every rank of an MPI job
// (mpirun -np R qkv sdpa --context-parallel ring ...), each rank reading the same files, computing
// its slice with qkv::mpi, rank 0 writing the outputs. Built with qkv::mpi when MPI is found; without
// it the flags still parse and a run exits 2 saying qkv was built without MPI.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backend.hpp"
#include "cli_fwd.hpp"
#include "qkv/runtime/sdpa.hpp"
#include "sdpa_inputs.hpp"

namespace qkv::cli {

/// The flags: --context-parallel [ring|allgather], --cp-slicing zigzag|contiguous, --mpi-timeout S.
struct context_parallel_flags {
    std::string mode;                ///< "ring" (also when the flag has no value) or "allgather"
    std::string slicing = "zigzag";  ///< how every rank cuts Q and K/V
    std::string timeout;             ///< seconds; empty: QKV_MPI_TIMEOUT, else 120
    CLI::Option* mode_option = nullptr;
    CLI::Option* slicing_option = nullptr;
    CLI::Option* timeout_option = nullptr;
    [[nodiscard]] bool requested() const;
};

/// Adds the flags to `command` (in the group "Context parallelism (MPI)").
void add_context_parallel_flags(CLI::App& command, context_parallel_flags& flags);

/// What `qkv sdpa` prepared on one rank: the whole inputs (float32), the options, where to run, and
/// the outputs rank 0 writes.
struct context_parallel_job {
    sdpa_inputs inputs;
    qkv::sdpa_options options;
    backend choice = backend::vulkan;
    std::string device;
    std::string out, lse;  ///< paths; lse empty: not written
};

/// `qkv sdpa --context-parallel`. `prepare` runs on every rank (the usual checks, reading and
/// validating the inputs; it may throw as `qkv sdpa` does); the outcome of every step is agreed
/// across the ranks, so a failure on any rank ends every rank with the same exception (its message
/// naming the rank), printed by rank 0. Throws usage_error when qkv was built without MPI.
void run_sdpa_context_parallel(const context_parallel_flags& flags,
                               const std::function<context_parallel_job()>& prepare);

/// `qkv bench --context-parallel`: times context-parallel sdpa on every rank and prints, on rank 0,
/// each rank's compute, communication, exposed communication and overlap.
struct context_parallel_bench {
    std::size_t batch = 1, heads = 8, kv_heads = 8, seq = 1024, kv_seq = 0, dim = 64;
    qkv::sdpa_options options{.causal = true, .alignment = qkv::causal_alignment::bottom_right};
    backend choice = backend::vulkan;
    std::string device, json_file;
    int repeat = 3, warmup = 1;
    std::uint64_t seed = 20261124;
};
void run_bench_context_parallel(const context_parallel_flags& flags, const context_parallel_bench& bench);

}  // namespace qkv::cli
