// Collective steps with a deadline: every wait of qkv::mpi on other ranks (a receive, a send, an
// agreement) is a non-blocking MPI call polled with MPI_Test against a deadline, so a rank that
// failed, hung or died makes the others fail with qkv::mpi::timeout instead of waiting forever.
//
//   qkv::mpi::environment mpi(argc, argv);      // MPI_Init_thread(FUNNELED) unless MPI is running
//   try { load_my_inputs(); } catch (...) { failure = std::current_exception(); }
//   qkv::mpi::agree(MPI_COMM_WORLD, failure);   // every rank: returns, or throws the same error
//
// Every call here is collective over its communicator: each rank must make it, in the same order.
// qkv::mpi communicates on a duplicate of the caller's communicator (MPI_Comm_idup, itself under
// the deadline), so its messages never mix with the caller's.
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <exception>
#include <span>
#include <vector>

#include "qkv/mpi/export.hpp"
#include "qkv/mpi/layout.hpp"

namespace qkv::mpi {

/// The default of comm_options::timeout: the environment variable QKV_MPI_TIMEOUT (seconds, a
/// positive number, fractions allowed) when set, else 120 s. Throws qkv::invalid_argument naming
/// the variable when it is set to anything else.
[[nodiscard]] QKV_MPI_API std::chrono::milliseconds default_timeout();

struct comm_options {
    /// The longest a rank waits on the others at any one point (for a message, for the completion
    /// of its sends, for an agreement) once it has nothing of its own left to compute there. Past
    /// it the call throws qkv::mpi::timeout naming the operation and the ranks it waited for.
    /// Choose it above the longest compute imbalance between ranks of one step.
    ///
    /// A timeout is for ending cleanly, not for carrying on: the rank that was late (hung, or
    /// just slow) may still enter the call the others have left, so after a qkv::mpi::timeout the
    /// ranks' collective calls on the communicator are no longer in step. End the job: do not
    /// make further qkv::mpi calls on that communicator, and do not call MPI_Finalize, which waits
    /// for every rank (a frozen one never comes): qkv::mpi::environment ends the job with
    /// MPI_Abort instead (see timed_out()). Every other failure leaves the ranks in step: later
    /// calls work.
    std::chrono::milliseconds timeout = default_timeout();
};

/// Whether a qkv::mpi call of this process has thrown qkv::mpi::timeout: its own wait ran out, or
/// another rank's did and the agreement reported it. The ranks are then out of step, and some
/// rank may never come back (frozen, blocked outside MPI, dead): MPI_Finalize, which waits for
/// every rank, could wait forever. A program that initialised MPI itself should then end the job
/// with MPI_Abort (qkv::mpi::environment does).
[[nodiscard]] QKV_MPI_API bool timed_out();

/// MPI for a program: MPI_Init_thread asking for MPI_THREAD_FUNNELED (qkv::mpi computes on a
/// worker thread while the thread that called MPI_Init polls the transfers) unless MPI is already
/// initialised. On destruction, if this object initialised MPI: MPI_Finalize. After a
/// qkv::mpi::timeout in this process (timed_out()), first every rank that timed out waits up to
/// finalize_grace() for the others to reach their environment's end too (a non-blocking barrier on
/// a duplicate of MPI_COMM_WORLD made at construction); if one does not (frozen, blocked outside
/// MPI, dead), MPI_Abort(MPI_COMM_WORLD, 1), which does not return: it ends every process of the
/// job, the late rank included (mpirun's exit status is then 1). So a timed-out job ends every
/// live rank within its timeout plus the grace (plus the launcher's time to end processes).
/// Report what the program must report before the environment goes out of scope.
/// Throws qkv::mpi::error if MPI cannot start, or has been finalised already.
class QKV_MPI_API environment {
public:
    environment(int& argc, char**& argv);
    /// Without the command line (MPI_Init_thread(nullptr, nullptr, ...)).
    environment();
    ~environment();
    environment(const environment&) = delete;
    environment& operator=(const environment&) = delete;

    /// Whether this object started MPI (and will finalise it).
    [[nodiscard]] bool owns() const { return owns_; }
    /// The thread level MPI provides (MPI_THREAD_SINGLE ... MPI_THREAD_MULTIPLE).
    [[nodiscard]] int thread_level() const { return level_; }
    /// How long, after a timeout, the destructor waits for every rank before MPI_Abort (default
    /// 10 s; a program whose late rank is known to come back later sets more).
    [[nodiscard]] std::chrono::milliseconds finalize_grace() const { return grace_; }
    void finalize_grace(std::chrono::milliseconds grace) { grace_ = grace; }

private:
    void start();
    bool owns_ = false;
    int level_ = 0;
    MPI_Comm world_ = MPI_COMM_NULL;  ///< for the barrier before MPI_Finalize after a timeout
    std::chrono::milliseconds grace_{10000};
};

/// Agreement on the outcome of a step that each rank ran on its own. `local` is this rank's
/// failure (null: success). Returns on every rank when no rank failed; otherwise throws on every
/// rank the failure of the lowest failing rank, as the same type (see error.hpp), its message
/// prefixed with "rank R of N: ". Throws qkv::mpi::timeout when not every rank arrives in time.
QKV_MPI_API void agree(MPI_Comm comm, std::exception_ptr local, const comm_options& options = {});

/// Each rank's slice of an (outer, length, width) tensor, gathered to `root` in global order: the
/// whole tensor on root, an empty vector elsewhere. `local` is (outer, slice.rows(), width) for this
/// rank's slice_of(length, size, rank, how). Collective; agreed (a bad size on any rank throws on
/// every rank).
[[nodiscard]] QKV_MPI_API std::vector<float> gather_rows(MPI_Comm comm, std::span<const float> local, std::size_t outer,
                                                         std::size_t length, std::size_t width, layout how,
                                                         int root = 0, const comm_options& options = {});

}  // namespace qkv::mpi
