# qkv_project_options: warnings (and sanitizers) for qkv's own targets. Not exported: users
# of the installed package choose their own flags.
add_library(qkv_project_options INTERFACE)
if(WIN32)
  # <windows.h> without its min and max macros (MSVC and MinGW-w64 alike). qkv's public headers
  # do not depend on this: tests/compile/windows_h_static.cpp includes them under the macros.
  target_compile_definitions(qkv_project_options INTERFACE NOMINMAX WIN32_LEAN_AND_MEAN)
endif()
if(MSVC)
  # /utf-8: the sources (and the CLI's ✓, —) are UTF-8, whatever the system code page.
  # /bigobj: Catch2 test files with many TEST_CASEs can exceed the default 2^16 COFF sections.
  target_compile_options(qkv_project_options INTERFACE /W4 /permissive- /Zc:__cplusplus /utf-8 /bigobj
                                                       $<$<BOOL:${QKV_WERROR}>:/WX>)
  # std::getenv, fopen and _wfopen are standard (or the portable spelling): no C4996 for them.
  target_compile_definitions(qkv_project_options INTERFACE _CRT_SECURE_NO_WARNINGS)
else()
  target_compile_options(qkv_project_options INTERFACE -Wall -Wextra -Wpedantic -Wshadow -Wconversion
                                                       -Wsign-conversion -Wnon-virtual-dtor -Wold-style-cast
                                                       $<$<BOOL:${QKV_WERROR}>:-Werror>)
  # GCC 12 reports impossible -Wrestrict overlaps inside std::string concatenation at -O2/-O3
  # (GCC bug 105651, fixed in GCC 13).
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
    target_compile_options(qkv_project_options INTERFACE -Wno-restrict)
  endif()
endif()
if(QKV_SANITIZE)
  # GCC 12 with sanitizers reports false -Wmaybe-uninitialized inside libstdc++'s <regex> (Catch2).
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    target_compile_options(qkv_project_options INTERFACE -Wno-maybe-uninitialized)
  endif()
  target_compile_options(qkv_project_options INTERFACE -fsanitize=${QKV_SANITIZE} -fno-sanitize-recover=all
                                                       -fno-omit-frame-pointer)
  target_link_options(qkv_project_options INTERFACE -fsanitize=${QKV_SANITIZE})
endif()
