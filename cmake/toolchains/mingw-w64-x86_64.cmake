# Cross-compiles qkv for 64-bit Windows with MinGW-w64 (Debian/Ubuntu: apt-get install
# g++-mingw-w64-x86-64-posix, or the whole mingw-w64).
#
#   cmake -S . -B build/windows -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/toolchains/mingw-w64-x86_64.cmake \
#         -DCMAKE_FIND_ROOT_PATH=<a folder whose include/ holds the vulkan, catch2, ... headers>
#
# The compiler is the `-posix` thread model (std::thread and std::mutex need it). Headers and
# packages are searched only under the MinGW-w64 sysroot and CMAKE_FIND_ROOT_PATH, never in the
# host's /usr/include; programs (glslangValidator, spirv-val) are the host's. Programs and DLLs
# link libstdc++, libgcc and winpthread statically, so they run without MinGW's DLLs beside them.
# To run the tests on Linux, set CMAKE_CROSSCOMPILING_EMULATOR to a command that runs wine;
# .ci/windows.sh does all of this.
set(CMAKE_SYSTEM_NAME Windows)
set(CMAKE_SYSTEM_PROCESSOR x86_64)

set(QKV_MINGW_TRIPLE x86_64-w64-mingw32)
find_program(CMAKE_CXX_COMPILER NAMES ${QKV_MINGW_TRIPLE}-g++-posix REQUIRED)
find_program(CMAKE_C_COMPILER NAMES ${QKV_MINGW_TRIPLE}-gcc-posix)
find_program(CMAKE_RC_COMPILER NAMES ${QKV_MINGW_TRIPLE}-windres)

# Where the target's headers and libraries are: the MinGW-w64 sysroot, plus whatever the user
# passed in CMAKE_FIND_ROOT_PATH (the toolchain file is read more than once: append only once).
if(NOT "/usr/${QKV_MINGW_TRIPLE}" IN_LIST CMAKE_FIND_ROOT_PATH)
  list(APPEND CMAKE_FIND_ROOT_PATH "/usr/${QKV_MINGW_TRIPLE}")
endif()
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)  # host tools: glslangValidator, spirv-val
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

set(CMAKE_EXE_LINKER_FLAGS_INIT "-static")
set(CMAKE_SHARED_LINKER_FLAGS_INIT "-static")
set(CMAKE_MODULE_LINKER_FLAGS_INIT "-static")
