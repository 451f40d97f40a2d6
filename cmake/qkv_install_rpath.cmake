# qkv_install_rpath(<target> <dir>): the installed <target>, which `install(TARGETS)` puts in <dir>
# (relative to the prefix, e.g. ${CMAKE_INSTALL_BINDIR}), finds qkv's shared libraries in
# ${CMAKE_INSTALL_LIBDIR} relative to itself: its RUNPATH is $ORIGIN/<the way from dir to libdir>
# (@loader_path/... on macOS). So `PREFIX/bin/qkv` and a program linking only qkv::vulkan run from
# any prefix, moved or not, without LD_LIBRARY_PATH (libqkv_vulkan.so finds libqkv_runtime.so the
# same way). The build tree keeps CMake's own absolute build RPATH. Nothing is set in a static
# build (qkv_runtime static: nothing of qkv's is found at run time), on Windows (DLLs are found beside the executable or on
# PATH; PE files have no RPATH), or when CMAKE_SKIP_INSTALL_RPATH is set (CMake then ignores it).
# tests/consumer (consumer.package) installs the shared build, moves the prefix and runs both.
function(qkv_install_rpath target dir)
  get_target_property(runtime_type qkv_runtime TYPE)
  if(WIN32 OR runtime_type STREQUAL "STATIC_LIBRARY")
    return()
  endif()
  if(APPLE)
    set(origin "@loader_path")
  else()
    set(origin "\$ORIGIN")
  endif()
  if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
    set(rpath "${CMAKE_INSTALL_LIBDIR}")  # the packager fixed the library directory: not relocatable
  elseif(IS_ABSOLUTE "${dir}")
    set(rpath "${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}")
  else()
    # Both relative to the same prefix: the way from one to the other ("../lib", "" for lib itself).
    file(RELATIVE_PATH way "/qkv-prefix/${dir}" "/qkv-prefix/${CMAKE_INSTALL_LIBDIR}")
    if(way STREQUAL "")
      set(rpath "${origin}")
    else()
      set(rpath "${origin}/${way}")
    endif()
  endif()
  set_target_properties(${target} PROPERTIES INSTALL_RPATH "${rpath}")
endfunction()
