#!/usr/bin/env bash
# qkv's two commands, on a fresh Debian 12 / Ubuntu machine (as root, or a user with sudo):
#
#   bash quickstart.sh example   install what is missing, build, run `qkv example`
#   bash quickstart.sh test      install what is missing, build and run every test leg
#
# `test` runs, in order: the clang-format check, GCC (shared library, -Werror), Clang (-Werror),
# the install/find_package consumer check, the backend-neutral build (qkv::runtime without Vulkan),
# ASan+UBSan, the fuzzers, and the Windows executables under Wine. Each leg can also be run alone:
# bash quickstart.sh test format|gcc|clang|neutral|sanitize|fuzz|windows
# Set QKV_NO_INSTALL=1 to skip apt-get (everything must then be present already).
set -euo pipefail
cd "$(dirname "$0")"
ROOT=$(pwd)
JOBS=${QKV_JOBS:-$(nproc)}

log() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

# ---- system packages ------------------------------------------------------------------------
BUILD_PACKAGES=(cmake ninja-build g++ libvulkan-dev glslang-tools spirv-tools mesa-vulkan-drivers
                vulkan-validationlayers catch2 libcli11-dev nlohmann-json3-dev openmpi-bin libopenmpi-dev)
TEST_PACKAGES=(clang libclang-rt-14-dev clang-format-14)
# The x86_64, POSIX-threads MinGW-w64 C++ compiler only (the mingw-w64 metapackage adds the i686
# and win32-thread ones, ~600 MB more); wine64 alone needs no i386 architecture.
WINDOWS_PACKAGES=(g++-mingw-w64-x86-64-posix wine64 xvfb xauth)

install_packages() {
    [ "${QKV_NO_INSTALL:-0}" = 1 ] && return 0
    local missing=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    log "Installing ${missing[*]}"
    local sudo=()
    [ "$(id -u)" -ne 0 ] && sudo=(sudo)
    "${sudo[@]}" apt-get update -q
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
}

# ---- builds -----------------------------------------------------------------------------------
# configure_build <dir> <cmake args...>
configure_build() {
    local dir=$1; shift
    cmake -S "$ROOT" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
    cmake --build "$dir" -j "$JOBS"
}

run_ctest() {
    ctest --test-dir "$1" --output-on-failure -j "$JOBS" "${@:2}"
}

leg_format() {
    log "clang-format: every C++ file of the tree follows .clang-format"
    local files
    mapfile -t files < <(git ls-files '*.cpp' '*.hpp' '*.h' '*.inl')
    clang-format-14 --dry-run -Werror "${files[@]}"
    echo "${#files[@]} files formatted"
}

leg_gcc() {
    log "GCC: build (shared library, warnings as errors) and test"
    configure_build build/gcc -DCMAKE_CXX_COMPILER=g++ -DQKV_WERROR=ON -DBUILD_SHARED_LIBS=ON
    if ldd build/gcc/src/libqkv_vulkan.so | grep -q libvulkan; then
        echo "libqkv_vulkan.so links libvulkan; it must load it at run time" >&2
        exit 1
    fi
    echo "ldd build/gcc/src/libqkv_vulkan.so: no libvulkan (the loader is opened at run time)"
    run_ctest build/gcc
}

leg_clang() {
    log "Clang: build (warnings as errors) and test"
    configure_build build/clang -DCMAKE_CXX_COMPILER=clang++ -DQKV_WERROR=ON
    run_ctest build/clang
}

leg_neutral() {
    log "Backend-neutral: qkv::runtime (problems, CPU backend) with -DQKV_BUILD_VULKAN=OFF, shared, and its tests"
    configure_build build/neutral -DCMAKE_CXX_COMPILER=g++ -DQKV_WERROR=ON -DQKV_BUILD_VULKAN=OFF \
        -DBUILD_SHARED_LIBS=ON
    # Proof that this configuration never looked for Vulkan or the shader tools: no cache entry
    # names them, no compile line searches a Vulkan include directory, nothing links libvulkan.
    if grep -Ei '^(QKV_VULKAN_INCLUDE_DIR|[A-Z_]*GLSLANG[A-Z_]*|[A-Z_]*SPIRV[A-Z_]*)[:=]' build/neutral/CMakeCache.txt ||
        grep -Eq -- '-isystem [^ ]*[Vv]ulkan' build/neutral/build.ninja ||
        ldd build/neutral/libqkv_runtime.so | grep -q libvulkan; then
        echo "the backend-neutral build looked for Vulkan or the shader tools" >&2
        exit 1
    fi
    echo "build/neutral: no Vulkan headers, no glslang, libqkv_runtime.so does not link libvulkan"
    # The constexpr reach test is the same in every configuration: the gcc and clang legs run it.
    run_ctest build/neutral -E '^constexpr_reach'
}

leg_sanitize() {
    log "Clang with AddressSanitizer + UndefinedBehaviorSanitizer: build and test"
    configure_build build/sanitize -DCMAKE_CXX_COMPILER=clang++ -DQKV_WERROR=ON -DQKV_SANITIZE=address,undefined \
        -DCMAKE_BUILD_TYPE=RelWithDebInfo
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=1 \
    UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    LSAN_OPTIONS="suppressions=$ROOT/.ci/lsan.supp:print_suppressions=0" \
        run_ctest build/sanitize -E '^consumer\.'
}

leg_fuzz() {
    # QKV_FUZZ_SECONDS (default 80) is shared: 3/8 each for the .npy reader and the shape/mask
    # checks, 2/8 for the command line.
    local seconds=${QKV_FUZZ_SECONDS:-80}
    log "libFuzzer on the .npy reader, the attention inputs' checks and the command line for $seconds s"
    configure_build build/fuzz -DCMAKE_CXX_COMPILER=clang++ -DQKV_BUILD_FUZZERS=ON -DQKV_BUILD_VULKAN=OFF \
        -DQKV_BUILD_TOOLS=OFF -DQKV_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo
    local fuzzer share corpus
    for fuzzer in npy:3 attention_inputs:3 cli_args:2; do
        share=${fuzzer#*:}
        fuzzer=${fuzzer%:*}
        corpus=$(mktemp -d)
        cp tests/fuzz/corpus/"$fuzzer"/* "$corpus"/
        log "${fuzzer}_fuzz for $((seconds * share / 8)) s"
        build/fuzz/tests/fuzz/"${fuzzer}"_fuzz -max_total_time=$((seconds * share / 8)) -print_final_stats=1 \
            "$corpus" 2>&1 | tail -n 12
        rm -rf "$corpus"
    done
}

leg_windows() {
    install_packages "${WINDOWS_PACKAGES[@]}"
    log "Windows: MinGW-w64 cross-build, tests under Wine"
    bash .ci/windows.sh build/windows
}

case "${1:-}" in
    example)
        install_packages "${BUILD_PACKAGES[@]}"
        log "Building"
        configure_build build/release
        log "qkv example"
        build/release/bin/qkv example
        ;;
    test)
        install_packages "${BUILD_PACKAGES[@]}" "${TEST_PACKAGES[@]}"
        legs=("${@:2}")
        [ ${#legs[@]} -eq 0 ] && legs=(format gcc clang neutral sanitize fuzz windows)
        start=$SECONDS
        for leg in "${legs[@]}"; do
            leg_start=$SECONDS
            "leg_$leg"
            echo "leg $leg: $((SECONDS - leg_start)) s"
        done
        log "All test legs passed (${legs[*]}) in $((SECONDS - start)) s"
        ;;
    *)
        echo "usage: bash quickstart.sh example | test [gcc|clang|...]" >&2
        exit 2
        ;;
esac
