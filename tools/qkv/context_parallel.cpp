// The --context-parallel flags, and what a build without MPI does with them.
#include "context_parallel.hpp"

#include <CLI/CLI.hpp>

#include "errors.hpp"

namespace qkv::cli {

bool context_parallel_flags::requested() const { return mode_option != nullptr && mode_option->count() > 0; }

void add_context_parallel_flags(CLI::App& command, context_parallel_flags& flags) {
    const std::string group = "Context parallelism (MPI)";
    flags.mode_option = command
                            .add_option("--context-parallel", flags.mode,
                                        "Run under mpirun across ranks: ring (K/V blocks travel around the ranks; "
                                        "the default) or allgather (the queries travel: decode, short queries)")
                            ->expected(0, 1)
                            ->type_name("[ring|allgather]")
                            ->group(group);
    flags.slicing_option =
        command
            .add_option("--cp-slicing", flags.slicing,
                        "How the sequence is cut across ranks: zigzag (chunks r and 2R-1-r: causal work balanced) "
                        "or contiguous")
            ->type_name("zigzag|contiguous")
            ->default_str("zigzag")
            ->group(group);
    flags.timeout_option = command
                               .add_option("--mpi-timeout", flags.timeout,
                                           "Seconds a rank waits on the others at any one point before it fails "
                                           "(default: QKV_MPI_TIMEOUT, else 120)")
                               ->type_name("SECONDS")
                               ->group(group);
}

#if !defined(QKV_CLI_WITH_MPI)

namespace {
[[noreturn]] void no_mpi() {
    throw usage_error(
        "--context-parallel: this qkv was built without MPI (qkv::mpi); install an MPI (e.g. Debian's "
        "libopenmpi-dev) and rebuild to run attention across ranks");
}
}  // namespace

void run_sdpa_context_parallel(const context_parallel_flags&, const std::function<context_parallel_job()>&) {
    no_mpi();
}
void run_bench_context_parallel(const context_parallel_flags&, const context_parallel_bench&) { no_mpi(); }

#endif

}  // namespace qkv::cli
