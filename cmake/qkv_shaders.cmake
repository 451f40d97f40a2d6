# Compiles GLSL compute shaders to SPIR-V with glslangValidator, validates each with spirv-val,
# and turns each into a C++ source holding the words, so the library carries its shaders.
#
#   qkv_add_shader(<out_sources_var> NAME <name> SOURCE <file.comp> [DEFINES <d>...])
#
# Dependencies come from glslang's depfile, so editing a shader or one of its includes rebuilds
# that shader's object alone.
find_program(QKV_GLSLANG glslangValidator HINTS "$ENV{VULKAN_SDK}/bin" "$ENV{VULKAN_SDK}/Bin" REQUIRED)
find_program(QKV_SPIRV_VAL spirv-val HINTS "$ENV{VULKAN_SDK}/bin" "$ENV{VULKAN_SDK}/Bin" REQUIRED)
set(QKV_SPIRV_ENV vulkan1.1)

function(qkv_add_shader out_var)
  cmake_parse_arguments(ARG "" "NAME;SOURCE" "DEFINES" ${ARGN})
  set(dir ${CMAKE_CURRENT_BINARY_DIR}/shaders)
  set(spv ${dir}/${ARG_NAME}.spv)
  set(cpp ${dir}/spv_${ARG_NAME}.cpp)
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
    COMMAND ${QKV_GLSLANG} -V --target-env ${QKV_SPIRV_ENV} ${defines} --depfile ${dir}/${ARG_NAME}.d -o ${spv} ${src}
    COMMAND ${QKV_SPIRV_VAL} --target-env ${QKV_SPIRV_ENV} ${spv}
    COMMAND ${CMAKE_COMMAND} -DSPV=${spv} -DOUT=${cpp} -DSYMBOL=qkv_spv_${ARG_NAME}
            -P ${PROJECT_SOURCE_DIR}/cmake/qkv_embed_spirv.cmake
    MAIN_DEPENDENCY ${src}
    DEPFILE ${dir}/${ARG_NAME}.d
    DEPENDS ${PROJECT_SOURCE_DIR}/cmake/qkv_embed_spirv.cmake
    COMMENT "Compiling shader ${ARG_NAME} (${ARG_SOURCE} ${ARG_DEFINES})"
    VERBATIM)
  set(${out_var} ${${out_var}} ${cpp} PARENT_SCOPE)
endfunction()
