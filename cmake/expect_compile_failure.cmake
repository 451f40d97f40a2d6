# cmake -DCOMPILER=... -DCOMPILER_ID=... -DINCLUDE=... -DSOURCE=... -DEXPECT=regex -P expect_compile_failure.cmake
# Passes when SOURCE fails to compile AND the diagnostic matches EXPECT (so an unrelated error,
# say a typo in the test, does not count as the expected rejection).
if(COMPILER_ID STREQUAL "MSVC")
  set(args /nologo /std:c++20 /Zs /I${INCLUDE} ${SOURCE})
else()
  set(args -std=c++20 -fsyntax-only -I${INCLUDE} ${SOURCE})
endif()
execute_process(COMMAND ${COMPILER} ${args} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0)
  message(FATAL_ERROR "${SOURCE} compiled, but it must be rejected")
endif()
if(NOT "${out}${err}" MATCHES "${EXPECT}")
  message(FATAL_ERROR "${SOURCE} was rejected, but the diagnostic does not name '${EXPECT}':\n${out}${err}")
endif()
message(STATUS "${SOURCE}: rejected, diagnostic names '${EXPECT}'")
