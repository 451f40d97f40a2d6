#!/usr/bin/env bash
# The Windows leg: cross-compiles qkv for x86_64 Windows with MinGW-w64 (the library, the qkv CLI
# and every test, as .exe) and runs the tests under Wine, whose vulkan-1.dll hands Vulkan on to
# this machine's driver (lavapipe). `bash quickstart.sh test windows` installs what it needs and
# runs it; alone:
#
#   .ci/windows.sh [BUILD_DIR]     default build/windows; QKV_JOBS sets the parallelism
#
# Needs g++-mingw-w64-x86-64-posix wine64 xvfb xauth, and from the native build the host's glslangValidator and
# spirv-val, the Vulkan headers, Catch2, CLI11 and nlohmann-json (headers only), lavapipe and the
# Khronos validation layer. Everything Wine writes stays in BUILD_DIR/wineprefix (~/.wine is not
# touched).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD=$(realpath -m "${1:-build/windows}")
JOBS=${QKV_JOBS:-$(nproc)}
CXX=x86_64-w64-mingw32-g++-posix

log() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

# Debian's wine64 package puts the loader in /usr/lib/wine; the `wine` package adds /usr/bin/wine.
WINE=$(command -v wine || command -v wine64 || echo /usr/lib/wine/wine64)
WINESERVER=$(command -v wineserver || echo /usr/lib/wine/wineserver)
for tool in "$CXX" "$WINE" "$WINESERVER" xvfb-run xauth glslangValidator spirv-val; do
    command -v "$tool" >/dev/null || { echo "windows leg: $tool not found (apt-get install g++-mingw-w64-x86-64-posix wine64 xvfb xauth)" >&2; exit 1; }
done

# ---- The third-party headers, staged from the host ---------------------------------------------
# Vulkan's, volk's (volk.h holds the implementation too), Catch2's, CLI11's and nlohmann-json's:
# header-only and platform-independent. The cross compiler sees these and the MinGW-w64 sysroot
# only, never the host's /usr/include.
STAGE=$BUILD/stage
mkdir -p "$STAGE/include/catch2" "$BUILD/wine"
for dir in vulkan vk_video CLI nlohmann; do
    cp -a "/usr/include/$dir" "$STAGE/include/"  # -a: unchanged headers keep their times, nothing rebuilds
done
cp -a /usr/include/catch2/catch.hpp "$STAGE/include/catch2/"
cp -a /usr/include/volk.h /usr/include/volk.c "$STAGE/include/"  # the interop example's application side

# write_if_changed FILE: stdin to FILE, leaving FILE (and its time) alone when the content is the same.
write_if_changed() {
    local tmp
    tmp=$(mktemp)
    cat >"$tmp"
    if cmp -s "$tmp" "$1"; then rm -f "$tmp"; else mv "$tmp" "$1"; fi
}
# A CMake package of one header-only target, in place of the host's configs (which point at /usr).
stage_package() {
    local package=$1 target=$2
    mkdir -p "$STAGE/lib/cmake/$package"
    write_if_changed "$STAGE/lib/cmake/$package/${package}Config.cmake" <<EOF
# Staged by .ci/windows.sh: $target, the header-only library's headers in ../../../include.
if(NOT TARGET $target)
  get_filename_component(_qkv_stage_include "\${CMAKE_CURRENT_LIST_DIR}/../../../include" ABSOLUTE)
  add_library($target INTERFACE IMPORTED)
  set_target_properties($target PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "\${_qkv_stage_include}")
endif()
EOF
}
stage_package Catch2 Catch2::Catch2
stage_package CLI11 CLI11::CLI11
stage_package nlohmann_json nlohmann_json::nlohmann_json

# ---- Wine: the prefix, the emulator CTest runs the tests with, the validation shim ---------------
export WINEPREFIX=$BUILD/wineprefix WINEDEBUG=-all
SHIM=$BUILD/wine/qkv_wine_vulkan.dll
if [ ! "$SHIM" -nt .ci/wine/validation_shim.cpp ]; then
    "$CXX" -std=c++20 -O2 -Wall -Wextra -shared -static -I"$STAGE/include" .ci/wine/validation_shim.cpp -o "$SHIM"
fi
EMULATOR=$BUILD/wine/run.sh
write_if_changed "$EMULATOR" <<EOF
#!/bin/sh
# CMAKE_CROSSCOMPILING_EMULATOR of this build, written by .ci/windows.sh: runs a Windows program
# under Wine in this build's prefix. Wine's Vulkan needs an X display: run ctest under xvfb-run -a.
# qkv's tests turn the validation layer on; under Wine that is the host's, enabled in the host's
# loader by VK_INSTANCE_LAYERS and announced to qkv by the shim (.ci/wine/validation_shim.cpp).
# A test that sets QKV_VULKAN_LIBRARY itself (no loader) keeps its value.
export WINEPREFIX='$WINEPREFIX'
export WINEDEBUG="\${WINEDEBUG:--all}"
export QKV_VULKAN_LIBRARY="\${QKV_VULKAN_LIBRARY-Z:$SHIM}"
export VK_INSTANCE_LAYERS="\${VK_INSTANCE_LAYERS-VK_LAYER_KHRONOS_validation}"
export QKV_HOST_VK_INSTANCE_LAYERS="\$VK_INSTANCE_LAYERS"  # Wine hides VK_* from Windows programs
export VK_LAYER_ENABLES="\${VK_LAYER_ENABLES-VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT}"
exec '$WINE' "\$@"
EOF
chmod +x "$EMULATOR"

# ---- Build ---------------------------------------------------------------------------------------
log "MinGW-w64: cross-build for x86_64 Windows in $BUILD"
build_start=$SECONDS
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_TOOLCHAIN_FILE="$ROOT/cmake/toolchains/mingw-w64-x86_64.cmake" -DCMAKE_FIND_ROOT_PATH="$STAGE" \
    -DCMAKE_CROSSCOMPILING_EMULATOR="$EMULATOR" -DQKV_WERROR=ON >/dev/null
cmake --build "$BUILD" -j "$JOBS"
if grep -Eq -- '(-I|-isystem) ?/usr/(local/)?include' "$BUILD/build.ninja"; then
    echo "windows leg: the cross build searches the host's /usr/include" >&2
    exit 1
fi
exes=$(find "$BUILD" -name '*.exe' -not -path "$WINEPREFIX/*" -printf '%P\n' | sort | tr '\n' ' ')
echo "Windows executables: $exes"
echo "windows leg: build $((SECONDS - build_start)) s"
test_start=$SECONDS

# ---- Test under Wine -----------------------------------------------------------------------------
if [ ! -f "$WINEPREFIX/system.reg" ]; then
    log "Creating the Wine prefix $WINEPREFIX"
    WINEDLLOVERRIDES="mscoree,mshtml=" "$WINE" wineboot -i >/dev/null 2>&1
fi
# A Wine server started without a display would serve the tests one without Vulkan: wait for
# wineboot's (or a previous run's) to end, then run every test under one X server.
"$WINESERVER" -w
log "Windows tests under Wine ($("$WINE" --version 2>/dev/null || echo wine)), Vulkan through Wine's vulkan-1.dll"
# One Wine server and one set of Wine's own background processes (services, desktop) for the whole
# run, started here with their output to /dev/null: started by a test, they would inherit its
# output pipe and CTest would wait for them to end. The labels variant and long (shader variants and
# long sequences: what the driver decides, not the platform) are the gcc and mesa25 legs' (README).
xvfb-run -a -s "-screen 0 640x480x24" bash -c '
    trap "\"\$1\" -k" EXIT
    "$1" -p
    "$2" wineboot </dev/null >/dev/null 2>&1
    ctest --test-dir "$3" --output-on-failure -j "$4" -LE "^(variant|long)\$"' ctest-under-wine "$WINESERVER" "$WINE" \
    "$BUILD" "$JOBS"
echo "windows leg: tests under Wine $((SECONDS - test_start)) s (the prefix included)"
