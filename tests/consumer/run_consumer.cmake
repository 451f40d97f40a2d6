# cmake -DMODE=package|subdirectory -DQKV_BUILD=... -DQKV_SOURCE=... -DWORK=... -DCXX=... -DGENERATOR=...
#       [-DVULKAN=ON|OFF] [-DPYTHON=...] -P run_consumer.cmake
# package: installs the qkv build into a prefix, moves that prefix elsewhere (installed binaries
# must find their libraries relative to themselves, wherever the prefix is), then configures and
# builds the consumer against it with find_package(qkv CONFIG) and runs, with a clean environment
# (no LD_LIBRARY_PATH; only PATH, HOME and the Vulkan driver's variables), the installed
# `qkv --version`, `qkv example --backend cpu` and `qkv devices`, the consumer, and
# consumer_vulkan_only (linked against qkv::vulkan alone, so that libqkv_vulkan.so has to find
# libqkv_runtime.so by itself), and `import qkv` from the installed Python package (with PYTHON,
# the interpreter it was built for). subdirectory: builds qkv inside the consumer and runs it.
# VULKAN: whether qkv was built with its Vulkan backend (default ON); without it the consumer uses
# qkv::runtime alone.
file(REMOVE_RECURSE ${WORK})
if(NOT DEFINED VULKAN)
  set(VULKAN ON)
endif()
# run(<command...>): must exit 0. run_status(<var> <command...>): the status, output and errors.
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " cmd "${ARGN}")
    message(FATAL_ERROR "failed (${rc}): ${cmd}\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
endfunction()

# Unix: `env -i` with PATH, HOME and what a Vulkan driver is chosen by, nothing else; above all no
# LD_LIBRARY_PATH (or DYLD_LIBRARY_PATH). Elsewhere (Windows finds DLLs beside the executable) as is.
set(clean_env "")
if(UNIX)
  find_program(ENV_PROGRAM env REQUIRED)
  set(clean_env ${ENV_PROGRAM} -i "PATH=$ENV{PATH}" "HOME=$ENV{HOME}")
  foreach(var IN ITEMS VK_DRIVER_FILES VK_ICD_FILENAMES VK_ADD_DRIVER_FILES VK_LAYER_PATH XDG_RUNTIME_DIR)
    if(DEFINED ENV{${var}})
      list(APPEND clean_env "${var}=$ENV{${var}}")
    endif()
  endforeach()
endif()

set(consumer_args -S ${QKV_SOURCE}/tests/consumer -B ${WORK}/build -G ${GENERATOR} -DCMAKE_CXX_COMPILER=${CXX}
                  -DCMAKE_BUILD_TYPE=Release -DQKV_CONSUMER_MODE=${MODE})
if(MODE STREQUAL "package")
  run(${CMAKE_COMMAND} --install ${QKV_BUILD} --prefix ${WORK}/installed)
  # Any prefix: the installed tree is moved before anything uses it.
  file(MAKE_DIRECTORY ${WORK}/moved)
  file(RENAME ${WORK}/installed ${WORK}/moved/prefix)
  set(prefix ${WORK}/moved/prefix)
  run(${CMAKE_COMMAND} ${consumer_args} -DCMAKE_PREFIX_PATH=${prefix})
else()
  run(${CMAKE_COMMAND} ${consumer_args} -DQKV_SOURCE_DIR=${QKV_SOURCE} -DQKV_BUILD_TESTS=OFF -DQKV_BUILD_TOOLS=OFF
      -DQKV_BUILD_VULKAN=${VULKAN})
endif()
run(${CMAKE_COMMAND} --build ${WORK}/build)

set(programs consumer)
if(VULKAN)
  list(APPEND programs consumer_vulkan_only)
endif()
foreach(program IN LISTS programs)
  find_program(path_${program} NAMES ${program} ${program}.exe PATHS ${WORK}/build NO_DEFAULT_PATH NO_CACHE REQUIRED)
  run(${clean_env} ${path_${program}})
endforeach()

if(MODE STREQUAL "package" AND VULKAN)
  # consumer_vulkan_only proves libqkv_vulkan.so's own search path only if it does not itself
  # record libqkv_runtime.so (which its RUNPATH would then find first). Shared builds only: a
  # static qkv is linked into the programs.
  find_program(READELF readelf)
  file(GLOB_RECURSE shared_vulkan ${prefix}/lib*/libqkv_vulkan.so*)
  if(READELF AND shared_vulkan AND CMAKE_HOST_SYSTEM_NAME STREQUAL "Linux")
    execute_process(COMMAND ${READELF} -d ${path_consumer_vulkan_only} OUTPUT_VARIABLE dynamic RESULT_VARIABLE rc)
    if(NOT rc EQUAL 0 OR NOT dynamic MATCHES "libqkv_vulkan\\.so" OR dynamic MATCHES "libqkv_runtime\\.so")
      message(FATAL_ERROR "consumer_vulkan_only must record libqkv_vulkan.so and not libqkv_runtime.so:\n${dynamic}")
    endif()
  endif()
  # The installed tool, when this build has it (QKV_BUILD_TOOLS).
  find_program(installed_qkv NAMES qkv qkv.exe PATHS ${prefix}/bin NO_DEFAULT_PATH NO_CACHE)
  if(installed_qkv)
    run(${clean_env} ${installed_qkv} --version)
    run(${clean_env} ${installed_qkv} example --backend cpu)
    # 0, or 1 where this machine has no Vulkan: either way the tool started and loaded its libraries.
    execute_process(COMMAND ${clean_env} ${installed_qkv} devices RESULT_VARIABLE rc OUTPUT_VARIABLE out
                    ERROR_VARIABLE err)
    if(NOT (rc EQUAL 0 OR (rc EQUAL 1 AND err MATCHES "Vulkan")))
      message(FATAL_ERROR "failed (${rc}): qkv devices\n${out}\n${err}")
    endif()
    message(STATUS "${out}${err}")
  endif()
  # The installed Python package, when this build has it (QKV_BUILD_PYTHON): the moved prefix's
  # site-packages on PYTHONPATH, nothing else, and the module finds its libraries by itself.
  file(GLOB python_packages ${prefix}/lib*/python*/*-packages/qkv/__init__.py)
  if(python_packages AND PYTHON)
    list(GET python_packages 0 package)
    get_filename_component(site ${package} DIRECTORY)
    get_filename_component(site ${site} DIRECTORY)
    # (Lines, not semicolons: a CMake list would split the program.)
    run(${clean_env} "PYTHONPATH=${site}" ${PYTHON} -c "import array, qkv
x = memoryview(array.array('f', [0.5, 1.0])).cast('B').cast('f', (1, 2))
print(qkv.__file__, qkv.devices(), qkv.scaled_dot_product_attention(x, x, x, device='cpu').shape)")
  endif()
endif()
