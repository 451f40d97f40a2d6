# Decides whether the Python package (python/) is built, and for which interpreter (included before
# the libraries are defined, so that python/ may find Python's packages first).
#
# QKV_BUILD_PYTHON (default: on in a top-level build) builds it where an interpreter with its
# development files (Python.h) and pybind11 (Debian's pybind11-dev) are found, qkv::vulkan is built,
# nothing is cross-compiled and no sanitizer is on (an instrumented extension would need the
# sanitizer's runtime preloaded into the interpreter). Otherwise it says why and goes on without it.
#
# The interpreter: -DPython_EXECUTABLE=/path/to/python3 chooses it. Without it, the first python3
# on PATH if it can import numpy, else /usr/bin/python3 if that can (Debian's, which python3-numpy,
# python3-torch and python3-pytest serve), else whatever FindPython finds. The extension module is
# built for that interpreter's version and ABI.
option(QKV_BUILD_PYTHON "Build the Python package qkv (pybind11) when Python and pybind11 are found"
       ${PROJECT_IS_TOP_LEVEL})
set(QKV_WITH_PYTHON OFF)

function(qkv_python_has_numpy python result)
  execute_process(COMMAND "${python}" -c "import numpy" RESULT_VARIABLE status OUTPUT_QUIET ERROR_QUIET)
  if(status EQUAL 0)
    set(${result} ON PARENT_SCOPE)
  else()
    set(${result} OFF PARENT_SCOPE)
  endif()
endfunction()

if(QKV_BUILD_PYTHON)
  if(CMAKE_CROSSCOMPILING)
    message(STATUS "qkv: not building the Python package (cross-compiling: the build machine's Python is not the target's)")
  elseif(NOT QKV_BUILD_VULKAN)
    message(STATUS "qkv: not building the Python package (it needs qkv::vulkan, QKV_BUILD_VULKAN=ON)")
  elseif(QKV_SANITIZE)
    message(STATUS "qkv: not building the Python package with sanitizers (${QKV_SANITIZE}): the interpreter "
                   "would need the sanitizer runtime preloaded")
  else()
    if(NOT DEFINED Python_EXECUTABLE)
      find_program(QKV_PATH_PYTHON3 python3 NO_CACHE)
      foreach(candidate IN ITEMS "${QKV_PATH_PYTHON3}" /usr/bin/python3)
        if(candidate AND EXISTS "${candidate}")
          qkv_python_has_numpy("${candidate}" has_numpy)
          if(has_numpy)
            set(Python_EXECUTABLE "${candidate}" CACHE FILEPATH "The Python interpreter the qkv package is built for")
            break()
          endif()
        endif()
      endforeach()
    endif()
    find_package(Python 3.8 COMPONENTS Interpreter Development.Module QUIET)
    if(Python_FOUND)
      set(PYBIND11_FINDPYTHON ON)
      find_package(pybind11 2.6 CONFIG QUIET)
    endif()
    find_path(QKV_DLPACK_INCLUDE_DIR dlpack/dlpack.h)
    if(NOT Python_FOUND)
      message(STATUS "qkv: not building the Python package (no Python interpreter with its development files; "
                     "Debian: apt-get install python3-dev)")
    elseif(NOT pybind11_FOUND)
      message(STATUS "qkv: not building the Python package (no pybind11; Debian: apt-get install pybind11-dev)")
    elseif(NOT QKV_DLPACK_INCLUDE_DIR)
      message(STATUS "qkv: not building the Python package (no dlpack/dlpack.h; Debian: apt-get install libdlpack-dev)")
    else()
      set(QKV_WITH_PYTHON ON)
      message(STATUS "qkv: building the Python package for ${Python_EXECUTABLE} (Python ${Python_VERSION})")
    endif()
  endif()
endif()
