# `qkv sdpa --context-parallel` in a qkv built without MPI: exit status 2 and a message saying so.
# cmake -DQKV=... -DARGS=... [-DEMULATOR=...] -P without_mpi.cmake (EMULATOR runs qkv: wine for the
# Windows build, empty otherwise)
cmake_minimum_required(VERSION 3.25)
execute_process(COMMAND ${EMULATOR} "${QKV}" sdpa ${ARGS} RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT status EQUAL 2 OR NOT err MATCHES "--context-parallel: this qkv was built without MPI")
  message(FATAL_ERROR "expected exit status 2 and the message; got ${status}\n${out}\n${err}")
endif()
