// Work the test programs do when their run ends, before exit() runs the static destructors: the
// shared Vulkan context (gpu.hpp) is destroyed here. The Khronos validation layer of Debian trixie
// (1.4.309, the mesa26 leg) tears its own state down during exit() before a context that lives in a
// static would be, and the context's vkDestroy* calls then crashed inside the layer. Every test
// main (support/main.cpp, mpi/main.cpp) calls end_of_run() after its Catch2 session.
#pragma once

#include <vector>

namespace qkv_test {

inline std::vector<void (*)()>& end_of_run_work() {
    static std::vector<void (*)()> work;
    return work;
}

/// Registers `f` to run at the end of the test run (once, in reverse order of registration).
inline void at_end_of_run(void (*f)()) { end_of_run_work().push_back(f); }

/// Runs what at_end_of_run registered: main() after the run, or a program before it exits early.
inline void end_of_run() {
    auto& work = end_of_run_work();
    while (!work.empty()) {
        void (*f)() = work.back();
        work.pop_back();
        f();
    }
}

}  // namespace qkv_test
