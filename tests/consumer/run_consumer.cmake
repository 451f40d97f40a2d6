# cmake -DMODE=package|subdirectory -DQKV_BUILD=... -DQKV_SOURCE=... -DWORK=... -DCXX=... -DGENERATOR=...
#       [-DVULKAN=ON|OFF] -P run_consumer.cmake
# package: installs the qkv build into WORK/prefix, then configures, builds and runs the consumer
# against it with find_package(qkv CONFIG). subdirectory: builds qkv inside the consumer.
# VULKAN: whether qkv was built with its Vulkan backend (default ON); without it the consumer uses
# qkv::runtime alone.
file(REMOVE_RECURSE ${WORK})
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " cmd "${ARGN}")
    message(FATAL_ERROR "failed (${rc}): ${cmd}\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
endfunction()
set(consumer_args -S ${QKV_SOURCE}/tests/consumer -B ${WORK}/build -G ${GENERATOR} -DCMAKE_CXX_COMPILER=${CXX}
                  -DCMAKE_BUILD_TYPE=Release -DQKV_CONSUMER_MODE=${MODE})
if(MODE STREQUAL "package")
  run(${CMAKE_COMMAND} --install ${QKV_BUILD} --prefix ${WORK}/prefix)
  run(${CMAKE_COMMAND} ${consumer_args} -DCMAKE_PREFIX_PATH=${WORK}/prefix)
else()
  if(NOT DEFINED VULKAN)
    set(VULKAN ON)
  endif()
  run(${CMAKE_COMMAND} ${consumer_args} -DQKV_SOURCE_DIR=${QKV_SOURCE} -DQKV_BUILD_TESTS=OFF -DQKV_BUILD_TOOLS=OFF
      -DQKV_BUILD_VULKAN=${VULKAN})
endif()
run(${CMAKE_COMMAND} --build ${WORK}/build)
find_program(consumer NAMES consumer consumer.exe PATHS ${WORK}/build NO_DEFAULT_PATH REQUIRED)
if(EMULATOR)
  run(${EMULATOR} ${consumer})
else()
  run(${consumer})
endif()
