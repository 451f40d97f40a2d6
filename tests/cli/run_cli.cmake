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
#   COPY               pairs SOURCE NAME: files copied into WORK_DIR before the run
#   SYMLINK, HARDLINK  pairs TARGET NAME: links made in WORK_DIR before the run (after COPY)
#   UNCHANGED          files of WORK_DIR that must be byte-identical after the run
#   SKIP_IF_STDERR     a regular expression: a run that fails with it on stderr (the device or the
#                      build lacks what the case needs) ends the case as skipped (CTest's
#                      SKIP_REGULAR_EXPRESSION "qkv cli test skipped"), nothing else checked
# In ARGS, <EMPTY> stands for an empty argument (a CMake list cannot hold one).
# After a failing run (EXPECT_EXIT != 0) WORK_DIR must hold exactly what COPY, SYMLINK and
# HARDLINK put there, every file byte-identical: no output, partial or temporary, may be left
# behind, and nothing that was there may change.
cmake_minimum_required(VERSION 3.25)

function(fail what)
  string(JOIN " " command ${EMULATOR} "${QKV}" ${ARGS})
  message(FATAL_ERROR "${what}\ncommand: ${command}\nexit status: ${status}\n"
                      "--- stdout ---\n${stdout}\n--- stderr ---\n${stderr}")
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

while(COPY)
  list(POP_FRONT COPY source name)
  file(COPY_FILE "${source}" "${WORK_DIR}/${name}")
endwhile()
while(SYMLINK)
  list(POP_FRONT SYMLINK target name)
  file(CREATE_LINK "${target}" "${WORK_DIR}/${name}" SYMBOLIC)
endwhile()
while(HARDLINK)
  list(POP_FRONT HARDLINK target name)
  file(CREATE_LINK "${WORK_DIR}/${target}" "${WORK_DIR}/${name}")
endwhile()
# What was there before the run: names, and the hash of each file.
file(GLOB_RECURSE before LIST_DIRECTORIES false RELATIVE "${WORK_DIR}" "${WORK_DIR}/*")
set(hashes "")
# The content of a file, or where a symbolic link points.
function(fingerprint file out)
  if(IS_SYMLINK "${WORK_DIR}/${file}")
    file(READ_SYMLINK "${WORK_DIR}/${file}" target)
    set(${out} "link:${target}" PARENT_SCOPE)
  elseif(EXISTS "${WORK_DIR}/${file}")
    file(SHA256 "${WORK_DIR}/${file}" hash)
    set(${out} "${hash}" PARENT_SCOPE)
  else()
    set(${out} "missing" PARENT_SCOPE)
  endif()
endfunction()
foreach(file IN LISTS before UNCHANGED)
  fingerprint("${file}" hash)
  list(APPEND hashes "${file}=${hash}")
endforeach()

# The command, every argument a bracket argument, so that <EMPTY> can become an empty one.
set(command "execute_process(COMMAND")
foreach(arg IN LISTS EMULATOR ITEMS "${QKV}" LISTS ARGS)
  if(arg STREQUAL "<EMPTY>")
    set(arg "")
  endif()
  string(APPEND command " [==[${arg}]==]")
endforeach()
string(APPEND command " WORKING_DIRECTORY [==[${WORK_DIR}]==] RESULT_VARIABLE status OUTPUT_VARIABLE stdout"
                      " ERROR_VARIABLE stderr)")
cmake_language(EVAL CODE "${command}")
message("${stdout}")
message("${stderr}")
if(SKIP_IF_STDERR AND NOT status EQUAL 0 AND "${stderr}" MATCHES "${SKIP_IF_STDERR}")
  message("qkv cli test skipped: the run was refused with \"${CMAKE_MATCH_0}\"")
  return()
endif()

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
  file(GLOB_RECURSE after LIST_DIRECTORIES false RELATIVE "${WORK_DIR}" "${WORK_DIR}/*")
  set(left_behind ${after})
  if(before)
    list(REMOVE_ITEM left_behind ${before})
  endif()
  if(left_behind)
    fail("the failed run left files behind: ${left_behind}")
  endif()
endif()
foreach(entry IN LISTS hashes)
  string(REGEX MATCH "^(.*)=([^=]*)$" _ "${entry}")
  set(file "${CMAKE_MATCH_1}")
  set(old_hash "${CMAKE_MATCH_2}")
  if(NOT EXPECT_EXIT EQUAL 0 OR file IN_LIST UNCHANGED)
    fingerprint("${file}" new_hash)
    if(NOT new_hash STREQUAL old_hash)
      fail("${file} changed")
    endif()
  endif()
endforeach()

foreach(file IN LISTS PRESENT)
  if(NOT EXISTS "${WORK_DIR}/${file}")
    fail("${file} was not written")
  endif()
endforeach()

while(COMPARE)
  list(POP_FRONT COMPARE actual expected)
  # npy_compare always says something: a line on stdout (status 0 or 1) or a message on stderr
  # (status 2). A failure in silence means the program never ran: under an emulator (Wine), a
  # start that failed; that start is retried once, and said so.
  foreach(attempt RANGE 1)
    execute_process(COMMAND ${EMULATOR} "${NPY_COMPARE}" "${actual}" "${expected}" --max-nmse ${MAX_NMSE}
                    WORKING_DIRECTORY "${WORK_DIR}" RESULT_VARIABLE compare_status OUTPUT_VARIABLE compare_out
                    ERROR_VARIABLE compare_err)
    if(NOT EMULATOR OR NOT "${compare_out}${compare_err}" STREQUAL "" OR compare_status EQUAL 0)
      break()
    endif()
    message("npy_compare under ${EMULATOR} ended with status ${compare_status} and printed nothing: started again")
  endforeach()
  message("${compare_out}${compare_err}")
  if(NOT compare_status EQUAL 0)
    fail("${actual} does not match ${expected} (npy_compare status ${compare_status}):\n${compare_out}${compare_err}")
  endif()
endwhile()
