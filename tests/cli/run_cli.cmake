# Runs one CLI test case: `cmake -P case.cmake`, where case.cmake (written by qkv_cli_test in
# CMakeLists.txt) sets the variables below and includes this file.
#
#   QKV, NPY_COMPARE   the executables; EMULATOR: a command to run them through (may be empty)
#   WORK_DIR           emptied, then the working directory of the command (relative paths land here)
#   ARGS               the arguments of qkv
#   EXPECT_EXIT        the exit status qkv must return
#   STDOUT_MATCHES, STDERR_MATCHES   regular expressions that must all match
#   STDOUT_REJECTS, STDERR_REJECTS   regular expressions that must not match
#   COMPARE            pairs ACTUAL EXPECTED of .npy files that must agree (npy_compare, MAX_NMSE)
#   PRESENT            files that must exist afterwards
# After a failing run (EXPECT_EXIT != 0) WORK_DIR must still be empty: no output, partial or
# temporary, may be left behind.
cmake_minimum_required(VERSION 3.25)

function(fail what)
  string(JOIN " " command ${EMULATOR} "${QKV}" ${ARGS})
  message(FATAL_ERROR "${what}\ncommand: ${command}\nexit status: ${status}\n"
                      "--- stdout ---\n${stdout}\n--- stderr ---\n${stderr}")
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

execute_process(COMMAND ${EMULATOR} "${QKV}" ${ARGS} WORKING_DIRECTORY "${WORK_DIR}" RESULT_VARIABLE status
                OUTPUT_VARIABLE stdout ERROR_VARIABLE stderr)
message("${stdout}")
message("${stderr}")

if(NOT "${status}" STREQUAL "${EXPECT_EXIT}")
  fail("expected exit status ${EXPECT_EXIT}")
endif()
foreach(stream IN ITEMS stdout stderr)
  string(TOUPPER ${stream} STREAM)
  foreach(regex IN LISTS ${STREAM}_MATCHES)
    if(NOT "${${stream}}" MATCHES "${regex}")
      fail("${stream} does not match \"${regex}\"")
    endif()
  endforeach()
  foreach(regex IN LISTS ${STREAM}_REJECTS)
    if("${${stream}}" MATCHES "${regex}")
      fail("${stream} matches \"${regex}\", which it must not")
    endif()
  endforeach()
endforeach()

if(NOT EXPECT_EXIT EQUAL 0)
  if("${stderr}" STREQUAL "")
    fail("a failing run must explain itself on stderr")
  endif()
  file(GLOB_RECURSE left_behind LIST_DIRECTORIES false "${WORK_DIR}/*")
  if(left_behind)
    fail("the failed run left files behind: ${left_behind}")
  endif()
endif()

foreach(file IN LISTS PRESENT)
  if(NOT EXISTS "${WORK_DIR}/${file}")
    fail("${file} was not written")
  endif()
endforeach()

while(COMPARE)
  list(POP_FRONT COMPARE actual expected)
  execute_process(COMMAND ${EMULATOR} "${NPY_COMPARE}" "${actual}" "${expected}" --max-nmse ${MAX_NMSE}
                  WORKING_DIRECTORY "${WORK_DIR}" RESULT_VARIABLE compare_status OUTPUT_VARIABLE compare_out
                  ERROR_VARIABLE compare_err)
  message("${compare_out}${compare_err}")
  if(NOT compare_status EQUAL 0)
    fail("${actual} does not match ${expected}:\n${compare_out}${compare_err}")
  endif()
endwhile()
