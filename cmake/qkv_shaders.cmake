# Compiles GLSL compute shaders to SPIR-V with glslangValidator, validates each with spirv-val,
# and turns each into a C++ source holding the words, so the library carries its shaders.
#
#   qkv_add_shader(<out_sources_var> NAME <name> SOURCE <file.comp> [DEFINES <d>...] [COOPMAT])
#
# COOPMAT: the shader uses GL_KHR_cooperative_matrix, which needs glslang 13 or newer and a
# spirv-val that knows SPV_KHR_cooperative_matrix (Debian 12's glslang 12 and SPIRV-Tools 2023.1
# do not). qkv_probe_coopmat() finds out, once per configuration, whether the tools at hand do:
# QKV_GLSLANG_COOPMAT and QKV_SPIRV_VAL_COOPMAT name other tools for these shaders alone
# (quickstart.sh passes trixie's, from build/mesa26/bin). Without such tools the shader is left out:
# its embedded SPIR-V is empty, and the library refuses its kernels at run time (unavailable).
#
# Dependencies come from glslang's depfile, so editing a shader or one of its includes rebuilds
# that shader's object alone.
find_program(QKV_GLSLANG glslangValidator HINTS "$ENV{VULKAN_SDK}/bin" "$ENV{VULKAN_SDK}/Bin" REQUIRED)
find_program(QKV_SPIRV_VAL spirv-val HINTS "$ENV{VULKAN_SDK}/bin" "$ENV{VULKAN_SDK}/Bin" REQUIRED)
set(QKV_SPIRV_ENV vulkan1.1)
set(QKV_GLSLANG_COOPMAT "" CACHE FILEPATH
    "glslangValidator for the cooperative-matrix shaders (empty: QKV_GLSLANG, if it compiles them)")
set(QKV_SPIRV_VAL_COOPMAT "" CACHE FILEPATH
    "spirv-val for the cooperative-matrix shaders (empty: QKV_SPIRV_VAL, if it validates them)")

# Sets QKV_COOPMAT_SHADERS (ON/OFF, a cache entry the tests read too), and QKV_COOPMAT_GLSLANG /
# QKV_COOPMAT_SPIRV_VAL to the tools qkv_add_shader(... COOPMAT) uses: a small cooperative-matrix
# shader (cmake/coopmat_probe.comp) compiled and validated with them.
function(qkv_probe_coopmat)
  set(glslang ${QKV_GLSLANG})
  set(spirv_val ${QKV_SPIRV_VAL})
  if(QKV_GLSLANG_COOPMAT)
    set(glslang ${QKV_GLSLANG_COOPMAT})
  endif()
  if(QKV_SPIRV_VAL_COOPMAT)
    set(spirv_val ${QKV_SPIRV_VAL_COOPMAT})
  endif()
  set(spv ${CMAKE_CURRENT_BINARY_DIR}/coopmat_probe.spv)
  execute_process(COMMAND ${glslang} -V --target-env ${QKV_SPIRV_ENV} -o ${spv}
                          ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/coopmat_probe.comp
                  RESULT_VARIABLE compiled OUTPUT_VARIABLE out ERROR_VARIABLE out)
  set(why "")
  if(NOT compiled EQUAL 0)
    set(why "${glslang} does not compile GL_KHR_cooperative_matrix (glslang 13 or newer does)")
  else()
    execute_process(COMMAND ${spirv_val} --target-env ${QKV_SPIRV_ENV} ${spv}
                    RESULT_VARIABLE valid OUTPUT_VARIABLE out ERROR_VARIABLE out)
    if(NOT valid EQUAL 0)
      set(why "${spirv_val} does not validate SPV_KHR_cooperative_matrix (SPIRV-Tools 2023.4 or newer does)")
    endif()
  endif()
  if(why)
    message(STATUS "qkv: the cooperative-matrix kernels (shaders/flash_coop.comp) are left out: ${why}. "
                   "Pass -DQKV_GLSLANG_COOPMAT=... and -DQKV_SPIRV_VAL_COOPMAT=... (bash quickstart.sh test "
                   "mesa26 fetches Debian trixie's into build/mesa26/bin); without them kernel = coopmat is "
                   "refused at run time (qkv::vulkan::unavailable)")
    set(QKV_COOPMAT_SHADERS OFF CACHE INTERNAL "whether the cooperative-matrix shaders are compiled")
  else()
    message(STATUS "qkv: cooperative-matrix kernels compiled with ${glslang}, validated with ${spirv_val}")
    set(QKV_COOPMAT_SHADERS ON CACHE INTERNAL "whether the cooperative-matrix shaders are compiled")
  endif()
  set(QKV_COOPMAT_GLSLANG ${glslang} PARENT_SCOPE)
  set(QKV_COOPMAT_SPIRV_VAL ${spirv_val} PARENT_SCOPE)
endfunction()

function(qkv_add_shader out_var)
  cmake_parse_arguments(ARG "COOPMAT" "NAME;SOURCE" "DEFINES" ${ARGN})
  set(dir ${CMAKE_CURRENT_BINARY_DIR}/shaders)
  set(spv ${dir}/${ARG_NAME}.spv)
  set(cpp ${dir}/spv_${ARG_NAME}.cpp)
  set(glslang ${QKV_GLSLANG})
  set(spirv_val ${QKV_SPIRV_VAL})
  if(ARG_COOPMAT AND NOT QKV_COOPMAT_SHADERS)
    # Left out (qkv_probe_coopmat): no words, which the library reads as "not built".
    set(stub ${dir}/spv_${ARG_NAME}_absent.cpp)
    file(CONFIGURE OUTPUT ${stub} @ONLY
         CONTENT "// ${ARG_NAME} was left out of this build: no glslang for GL_KHR_cooperative_matrix \
(cmake/qkv_shaders.cmake).
#include <cstddef>
#include <cstdint>
extern \"C\" const std::uint32_t qkv_spv_${ARG_NAME}[] = {0u};
extern \"C\" const std::size_t qkv_spv_${ARG_NAME}_words = 0;
")
    set(${out_var} ${${out_var}} ${stub} PARENT_SCOPE)
    return()
  elseif(ARG_COOPMAT)
    set(glslang ${QKV_COOPMAT_GLSLANG})
    set(spirv_val ${QKV_COOPMAT_SPIRV_VAL})
  endif()
  set(defines)
  foreach(d IN LISTS ARG_DEFINES)
    list(APPEND defines -D${d})
  endforeach()
  get_filename_component(src ${ARG_SOURCE} ABSOLUTE)
  # The .spv first: glslang's depfile names it, and Ninja checks the depfile against the first
  # output (otherwise every build compiles every shader again).
  add_custom_command(
    OUTPUT ${spv} ${cpp}
    COMMAND ${CMAKE_COMMAND} -E make_directory ${dir}
    COMMAND ${glslang} -V --target-env ${QKV_SPIRV_ENV} ${defines} --depfile ${dir}/${ARG_NAME}.d -o ${spv} ${src}
    COMMAND ${spirv_val} --target-env ${QKV_SPIRV_ENV} ${spv}
    COMMAND ${CMAKE_COMMAND} -DSPV=${spv} -DOUT=${cpp} -DSYMBOL=qkv_spv_${ARG_NAME}
            -P ${PROJECT_SOURCE_DIR}/cmake/qkv_embed_spirv.cmake
    MAIN_DEPENDENCY ${src}
    DEPFILE ${dir}/${ARG_NAME}.d
    DEPENDS ${PROJECT_SOURCE_DIR}/cmake/qkv_embed_spirv.cmake
    COMMENT "Compiling shader ${ARG_NAME} (${ARG_SOURCE} ${ARG_DEFINES})"
    VERBATIM)
  set(${out_var} ${${out_var}} ${cpp} PARENT_SCOPE)
endfunction()
