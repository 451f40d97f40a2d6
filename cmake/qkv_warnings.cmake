# qkv_project_options: warnings (and sanitizers) for qkv's own targets. Not exported: users
# of the installed package choose their own flags.
add_library(qkv_project_options INTERFACE)
if(MSVC)
  target_compile_options(qkv_project_options INTERFACE /W4 /permissive- /Zc:__cplusplus /utf-8
                                                       $<$<BOOL:${QKV_WERROR}>:/WX>)
  target_compile_definitions(qkv_project_options INTERFACE NOMINMAX WIN32_LEAN_AND_MEAN)
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
