// The Catch2 main of the MPI tests: MPI up (qkv::mpi::environment) around the session, so the
// same executable runs alone or under mpirun with any number of ranks. Every rank runs the same
// test cases in the same order (they are collective); a failure on any rank fails the run. After
// the [hang] case's timeout the environment waits finalize_grace() (10 s) for every rank before
// MPI_Finalize: the sleeping rank wakes after 3 s and comes, so each rank's own result stands.
#if __has_include(<catch2/catch_session.hpp>)
#include <catch2/catch_session.hpp>
#else
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#endif

#include <qkv/mpi/collective.hpp>

#include "support/end_of_run.hpp"

int main(int argc, char* argv[]) {
    qkv::mpi::environment mpi(argc, argv);
    const int status = Catch::Session().run(argc, argv);
    qkv_test::end_of_run();  // the shared context, before MPI and exit() (support/end_of_run.hpp)
    return status;
}
