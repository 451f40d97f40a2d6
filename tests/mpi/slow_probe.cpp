// A rank made slow at one chosen point, deterministically: MPI's profiling interface lets this
// executable define MPI_Iprobe (qkv::mpi's calls come here, MPI's own entry is PMPI_Iprobe). Once
// armed (hold_next_probe), the next probe waits until a message it matches has come, as a rank
// descheduled on a loaded machine would find it there when it next looks.
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "mpi/support.hpp"

namespace qkv_mpi_test {
namespace {
std::atomic<long long> held_ms{0};
}  // namespace

void hold_next_probe(std::chrono::milliseconds limit) { held_ms = limit.count(); }
}  // namespace qkv_mpi_test

extern "C" int MPI_Iprobe(int source, int tag, MPI_Comm comm, int* flag, MPI_Status* status) {
    const long long limit = qkv_mpi_test::held_ms.exchange(0);
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(limit);
    for (;;) {
        const int rc = PMPI_Iprobe(source, tag, comm, flag, status);
        if (rc != MPI_SUCCESS || *flag || std::chrono::steady_clock::now() >= until) return rc;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
}
