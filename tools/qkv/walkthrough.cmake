# qkv_walkthrough: the tutorial's walkthrough (`qkv example`) as a library, shared by the qkv tool
# and the Python package's `python3 -m qkv example` (python/), so that both print the same text
# from the same code. Included by the top-level CMakeLists.txt, so that both directories see it.
include_guard(GLOBAL)

# CLI11 (header-only) is a dependency of the tools only (the walkthrough's --backend option).
# Debian's libcli11-dev ships a CMake config; elsewhere the bare header is enough.
find_package(CLI11 CONFIG QUIET)
if(NOT TARGET CLI11::CLI11)
  find_path(QKV_CLI11_INCLUDE_DIR CLI/CLI.hpp REQUIRED)
  add_library(CLI11::CLI11 INTERFACE IMPORTED)
  target_include_directories(CLI11::CLI11 INTERFACE ${QKV_CLI11_INCLUDE_DIR})
endif()

add_library(qkv_walkthrough STATIC
  ${CMAKE_CURRENT_LIST_DIR}/agreement.cpp
  ${CMAKE_CURRENT_LIST_DIR}/backend.cpp
  ${CMAKE_CURRENT_LIST_DIR}/example.cpp
  ${CMAKE_CURRENT_LIST_DIR}/example_values.cpp
  ${CMAKE_CURRENT_LIST_DIR}/printing.cpp
  ${CMAKE_CURRENT_LIST_DIR}/walkthrough.cpp)
# Linked into the Python extension module, a shared object, in static builds too.
set_target_properties(qkv_walkthrough PROPERTIES POSITION_INDEPENDENT_CODE ON)
target_include_directories(qkv_walkthrough PUBLIC ${CMAKE_CURRENT_LIST_DIR})
target_link_libraries(qkv_walkthrough PUBLIC qkv::vulkan PRIVATE CLI11::CLI11 qkv_project_options)
