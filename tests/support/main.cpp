// The Catch2 main shared by all of qkv's test executables (v2 and v3).
#if __has_include(<catch2/catch_session.hpp>)
#include <catch2/catch_session.hpp>
#else
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#endif

#include "end_of_run.hpp"

int main(int argc, char* argv[]) {
    const int status = Catch::Session().run(argc, argv);
    qkv_test::end_of_run();
    return status;
}
