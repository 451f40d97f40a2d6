# QKV_TEST_LAUNCHER: the command every test program of qkv's own (Catch2 executables, the examples,
# the qkv tool in the cli.* tests) is run through.
#   - a cross build: CMAKE_CROSSCOMPILING_EMULATOR (Wine, for the Windows executables);
#   - a native Unix build: cmake/run_test_program.sh, which runs the program as it is, or through
#     the wrapper that the environment variable QKV_TEST_WRAPPER names (quickstart.sh's mesa26 leg:
#     build/mesa26/run, the private root's dynamic loader, libraries, driver and validation layer),
#     so that one build's tests run on another driver without configuring anything again;
#   - otherwise (MSVC): nothing.
if(CMAKE_CROSSCOMPILING)
  set(QKV_TEST_LAUNCHER ${CMAKE_CROSSCOMPILING_EMULATOR})
elseif(CMAKE_HOST_UNIX)
  set(QKV_TEST_LAUNCHER /bin/sh ${CMAKE_CURRENT_LIST_DIR}/run_test_program.sh)
else()
  set(QKV_TEST_LAUNCHER "")
endif()
