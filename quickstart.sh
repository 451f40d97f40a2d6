#!/usr/bin/env bash
# qkv's two commands, on a fresh Debian 12 / Ubuntu machine (as root, or a user with sudo):
#
#   bash quickstart.sh example   install what is missing, build, run `qkv example`
#   bash quickstart.sh test      install what is missing, build and run every test leg
#
# Both also make the Python package importable afterwards (`python3 -c "import qkv"`): a qkv.pth in
# the user site-packages of the interpreter CMake built it for names the build's python folder.
#
# `test` runs, in order: the clang-format and reference checks, GCC (shared library, -Werror; with
# the install/find_package consumer check), the GCC build's Vulkan and CLI tests again on a second
# driver (Mesa 25.0's lavapipe from bookworm-backports, unpacked under build/, never installed) and
# a third (Mesa 26.1's lavapipe from trixie-backports with its own libraries, loader and validation
# layers, unpacked under build/mesa26: the cooperative-matrix family), Clang (-Werror), the
# backend-neutral build (qkv::runtime without Vulkan), ASan+UBSan, the fuzzers, and the Windows
# executables under Wine. README's Testing section says which leg runs which tests. Each leg can
# also be run alone:
# bash quickstart.sh test format|gcc|mesa25|mesa26|clang|neutral|sanitize|fuzz|windows
# Set QKV_NO_INSTALL=1 to skip apt-get (everything must then be present already; the mesa25 and
# mesa26 roots are still downloaded, once each, unless build/mesa25 and build/mesa26 hold them).
set -euo pipefail
cd "$(dirname "$0")"
ROOT=$(pwd)
JOBS=${QKV_JOBS:-$(nproc)}

log() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

# CPU_NOW: the user + system CPU seconds of every command this script has waited for so far
# (bash's `times`, run in this shell: a command substitution would count its own children only).
cpu_now() {
    local file
    file=$(mktemp)
    times >"$file"
    CPU_NOW=$(awk 'NR == 2 { for (i = 1; i <= 2; ++i) { split($i, p, /[ms]/); t += p[1] * 60 + p[2] } printf "%d", t }' "$file")
    rm -f "$file"
}

# ---- system packages ------------------------------------------------------------------------
# python3-dev, pybind11-dev and libdlpack-dev build the Python package (python/); python3-numpy,
# python3-torch, python3-pytest and python3-mpi4py test it (under /usr/bin/python3, their interpreter).
BUILD_PACKAGES=(cmake ninja-build g++ libvulkan-dev libvulkan-volk-dev glslang-tools spirv-tools mesa-vulkan-drivers
                vulkan-validationlayers catch2 libcli11-dev nlohmann-json3-dev openmpi-bin libopenmpi-dev
                python3-dev pybind11-dev libdlpack-dev)
TEST_PACKAGES=(clang libclang-rt-14-dev clang-format-14 python3 python3-numpy python3-torch python3-pytest
               python3-mpi4py)
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

# link_python <build>: the Python package of <build> importable without PYTHONPATH, by the
# interpreter CMake built it for: qkv.pth (one line, <build>/python) in that interpreter's user
# site-packages (`python3 -m site --user-site`: no root needed; a venv's own site-packages where
# user sites are off). Another python3 of the same version (a pyenv one first on PATH) reads the
# same user folder. Nothing happens where the build has no Python package.
link_python() {
    local build=$ROOT/$1 python site other
    python=$(sed -n 's/^Python_EXECUTABLE:[A-Z]*=//p' "$build/CMakeCache.txt" 2>/dev/null)
    if [ -z "$python" ] || [ ! -f "$build/python/qkv/__init__.py" ]; then
        echo "no Python package in $build (see README, From Python)"
        return 0
    fi
    site=$("$python" -c 'import site, sys; print(site.getusersitepackages() if site.ENABLE_USER_SITE else site.getsitepackages()[0])')
    mkdir -p "$site"
    echo "$build/python" >"$site/qkv.pth"
    echo "$site/qkv.pth -> $build/python (remove the file to undo)"
    (cd / && "$python" -c 'import qkv; print("'"$python"': import qkv ->", qkv.__file__, qkv.devices())')
    other=$(command -v python3 || true)
    if [ -n "$other" ] && [ "$(readlink -f "$other")" != "$(readlink -f "$python")" ]; then
        (cd / && "$other" -c 'import qkv; print("'"$other"': import qkv ->", qkv.__file__)') 2>/dev/null ||
            echo "$other (first on PATH) cannot import qkv: it is not the $python the package was built for"
    fi
}

leg_format() {
    log "clang-format: every C++ file of the tree follows .clang-format"
    local files
    mapfile -t files < <(git ls-files '*.cpp' '*.hpp' '*.h' '*.inl')
    clang-format-14 --dry-run -Werror "${files[@]}"
    echo "${#files[@]} files formatted"
    log "References: every file and symbol the docs and comments cite exists (.ci/check_references.py)"
    python3 .ci/check_references.py
}

leg_gcc() {
    coopmat_tools  # the mesa26 leg's glslang 15, where that leg has fetched it already
    log "GCC: build (shared library, warnings as errors) and test"
    configure_build build/gcc -DCMAKE_CXX_COMPILER=g++ -DQKV_WERROR=ON -DBUILD_SHARED_LIBS=ON "${COOPMAT_TOOLS[@]}"
    if ldd build/gcc/src/libqkv_vulkan.so | grep -q libvulkan; then
        echo "libqkv_vulkan.so links libvulkan; it must load it at run time" >&2
        exit 1
    fi
    echo "ldd build/gcc/src/libqkv_vulkan.so: no libvulkan (the loader is opened at run time)"
    run_ctest build/gcc
    link_python build/gcc
}

# ---- The second driver: Mesa 25.0's lavapipe (Vulkan 1.4) from Debian's bookworm-backports -------
# Downloaded by apt-get through a private configuration (build/mesa25/apt: its own sources list,
# package lists and cache, and an empty dpkg status; the system's apt sources are neither read nor
# changed), unpacked with dpkg -x into build/mesa25/root, and chosen for the tests by
# VK_DRIVER_FILES (an ICD file of its own, naming the library by its full path) and LD_LIBRARY_PATH
# (for the newer libdrm it needs). The system's driver stays installed; every other leg uses it.
MESA25_EXPECT=25.0
MESA25=$ROOT/build/mesa25
MESA25_PACKAGES=(mesa-vulkan-drivers/bookworm-backports libdrm2/bookworm-backports)

# private_apt DIR SUITE...: an apt configuration of its own under DIR/apt (sources list, package
# lists, cache, an empty dpkg status) for Debian's SUITEs, its lists updated; APT_CONFIG names it.
# The system's apt sources and state are neither read nor changed.
private_apt() {
    local dir=$1 apt=$1/apt suite
    shift
    mkdir -p "$apt/sources.list.d" "$apt/preferences.d" "$apt/lists/partial" "$apt/cache/archives/partial"
    : >"$apt/status"
    : >"$apt/sources.list"
    for suite in "$@"; do
        echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $suite main" \
            >>"$apt/sources.list"
    done
    {
        echo "Dir::Etc::SourceList \"$apt/sources.list\";"
        echo "Dir::Etc::SourceParts \"$apt/sources.list.d\";"
        echo "Dir::Etc::Preferences \"$apt/preferences\";"
        echo "Dir::Etc::PreferencesParts \"$apt/preferences.d\";"
        echo "Dir::State::Lists \"$apt/lists\";"
        echo "Dir::State::status \"$apt/status\";"
        echo "Dir::Cache \"$apt/cache\";"
        echo "APT::Sandbox::User \"$(id -un)\";"
    } >"$apt/apt.conf"
    APT_CONFIG=$apt/apt.conf apt-get update -q
}

fetch_mesa25() {
    local root=$MESA25/root multiarch deb version
    if [ -f "$MESA25/ready" ] && [ "$(cat "$MESA25/ready")" = "$MESA25_EXPECT" ]; then return 0; fi
    if ! grep -q '^12' /etc/debian_version 2>/dev/null; then
        echo "mesa25 leg: needs Debian 12 (bookworm) for bookworm-backports; /etc/debian_version:" \
            "$(cat /etc/debian_version 2>/dev/null || echo none)" >&2
        exit 1
    fi
    log "Fetching Mesa $MESA25_EXPECT's lavapipe from bookworm-backports into $MESA25 (not installed)"
    rm -rf "${MESA25:?}"
    mkdir -p "$MESA25/debs" "$root"
    private_apt "$MESA25" bookworm-backports
    (cd "$MESA25/debs" && APT_CONFIG=$MESA25/apt/apt.conf apt-get download -q "${MESA25_PACKAGES[@]}")
    version=$(dpkg-deb -f "$MESA25"/debs/mesa-vulkan-drivers_*.deb Version)
    if [[ $version != "$MESA25_EXPECT".* ]]; then
        echo "mesa25 leg: bookworm-backports has mesa-vulkan-drivers $version, not $MESA25_EXPECT.x" >&2
        exit 1
    fi
    for deb in "$MESA25"/debs/*.deb; do dpkg -x "$deb" "$root"; done
    multiarch=$(gcc -print-multiarch)
    printf '{ "file_format_version": "1.0.0",\n  "ICD": { "library_path": "%s", "api_version": "1.4.0" } }\n' \
        "$root/usr/lib/$multiarch/libvulkan_lvp.so" >"$MESA25/lvp_icd.json"
    # Every library the driver needs resolves (the unpacked ones first), or the leg stops here.
    if LD_LIBRARY_PATH=$root/usr/lib/$multiarch ldd "$root/usr/lib/$multiarch/libvulkan_lvp.so" | grep 'not found'; then
        echo "mesa25 leg: libvulkan_lvp.so of mesa-vulkan-drivers $version needs libraries this machine lacks" >&2
        exit 1
    fi
    echo "$MESA25_EXPECT" >"$MESA25/ready"
    echo "mesa-vulkan-drivers $version unpacked into $root"
}

leg_mesa25() {
    fetch_mesa25
    # The gcc leg's build (built here when this leg runs alone; nothing to do after the gcc leg).
    configure_build build/gcc -DCMAKE_CXX_COMPILER=g++ -DQKV_WERROR=ON -DBUILD_SHARED_LIBS=ON
    log "Mesa $MESA25_EXPECT's lavapipe: the GCC build's tests labelled driver2 (every Vulkan call path, the CLI's Vulkan runs) on the second driver"
    local devices lib
    lib=$MESA25/root/usr/lib/$(gcc -print-multiarch)
    # Only in the environment of the commands below: the rest of the run keeps the system's driver.
    local -a driver=(env "VK_DRIVER_FILES=$MESA25/lvp_icd.json" "VK_ICD_FILENAMES=$MESA25/lvp_icd.json"
                     "LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
    # The tests must run on that driver and no other: `qkv devices` names the one the loader gave.
    devices=$("${driver[@]}" build/gcc/bin/qkv devices) || {
        echo "mesa25 leg: no Vulkan device through $MESA25/lvp_icd.json" >&2
        exit 1
    }
    echo "$devices"
    if ! grep -q "Mesa $MESA25_EXPECT\\." <<<"$devices" || grep -Eq "Mesa (1|2[0-4])[0-9]*\\." <<<"$devices"; then
        echo "mesa25 leg: the Vulkan device is not (only) Mesa $MESA25_EXPECT's lavapipe" >&2
        exit 1
    fi
    "${driver[@]}" ctest --test-dir build/gcc --output-on-failure -j "$JOBS" -L '^driver2$'
}

# ---- The third driver: Mesa 26.1's lavapipe, the first here to offer VK_KHR_cooperative_matrix ------
# Debian trixie-backports builds it against trixie (glibc 2.41, LLVM 19), so its packages and every
# library they need (the dependency closure, libc6 included) are fetched through a private apt
# configuration (private_apt) and unpacked with dpkg -x into build/mesa26/root, with trixie's
# glslang 15 and spirv-tools (which compile and validate GL_KHR_cooperative_matrix; bookworm's
# glslang 12 rejects it) and its Vulkan loader and validation layers (1.4.309; bookworm's 1.3.239
# predate the extension). Nothing is installed: a program runs on that root through the root's own
# dynamic loader, build/mesa26/run (`run PROGRAM ARGS...`), with the root's driver, layer and
# implicit layers chosen by the variables of mesa26_environment. The system's driver stays; every
# other leg uses it. build/mesa26/bin/glslangValidator and spirv-val are the root's tools, for
# CMake's QKV_GLSLANG_COOPMAT and QKV_SPIRV_VAL_COOPMAT.
MESA26_EXPECT=26.1
MESA26=$ROOT/build/mesa26
MESA26_PACKAGES=(mesa-vulkan-drivers/trixie-backports libvulkan1 vulkan-validationlayers glslang-tools spirv-tools)

fetch_mesa26() {
    local root=$MESA26/root lib deb version packages tool layer into
    if [ -f "$MESA26/ready" ] && [ "$(cat "$MESA26/ready")" = "$MESA26_EXPECT" ]; then return 0; fi
    if [ "$(dpkg --print-architecture 2>/dev/null)" != amd64 ]; then
        echo "mesa26: the private root holds Debian's amd64 packages; this machine is" \
            "$(dpkg --print-architecture 2>/dev/null || uname -m)" >&2
        exit 1
    fi
    log "Fetching Mesa $MESA26_EXPECT's lavapipe, glslang 15 and the validation layers of Debian trixie into $MESA26 (not installed)"
    rm -rf "${MESA26:?}"
    mkdir -p "$MESA26/debs" "$MESA26/bin" "$MESA26/layers" "$MESA26/implicit_layers" "$root"
    private_apt "$MESA26" trixie trixie-backports
    # The whole dependency closure as an empty system would install it: the root is self-contained.
    mapfile -t packages < <(APT_CONFIG=$MESA26/apt/apt.conf apt-get install -s -q --no-install-recommends \
        "${MESA26_PACKAGES[@]}" | awk '/^Inst /{ print $2 "=" substr($3, 2) }')
    (cd "$MESA26/debs" && APT_CONFIG=$MESA26/apt/apt.conf apt-get download -q "${packages[@]}")
    version=$(dpkg-deb -f "$MESA26"/debs/mesa-vulkan-drivers_*.deb Version)
    if [[ $version != "$MESA26_EXPECT".* ]]; then
        echo "mesa26: trixie-backports has mesa-vulkan-drivers $version, not $MESA26_EXPECT.x" >&2
        exit 1
    fi
    for deb in "$MESA26"/debs/*.deb; do dpkg -x "$deb" "$root"; done
    lib=$root/usr/lib/x86_64-linux-gnu
    rm -f "${lib:?}"/libSPIRV-Tools*.a  # spirv-tools' static libraries: 60 MB that nothing here links
    {
        echo '#!/bin/sh'
        echo '# Written by quickstart.sh (fetch_mesa26): runs an x86-64 program (not a script) through the'
        echo "# dynamic loader and libraries of the private root $root;"
        echo '# the program finds its own libraries by its RUNPATH as usual. The driver and the layers are'
        echo "# chosen by the environment (quickstart.sh's mesa26_environment)."
        echo "exec \"$lib/ld-linux-x86-64.so.2\" --library-path \"$lib\" \"\$@\""
    } >"$MESA26/run"
    for tool in glslangValidator spirv-val; do
        printf '#!/bin/sh\nexec "%s" "%s" "$@"\n' "$MESA26/run" "$root/usr/bin/$tool" >"$MESA26/bin/$tool"
    done
    chmod +x "$MESA26/run" "$MESA26/bin/glslangValidator" "$MESA26/bin/spirv-val"
    # The driver's and the layers' manifests, naming their libraries by full path in the root.
    printf '{ "file_format_version": "1.0.1",\n  "ICD": { "library_path": "%s", "api_version": "1.4.0" } }\n' \
        "$lib/libvulkan_lvp.so" >"$MESA26/lvp_icd.json"
    for layer in "$root"/usr/share/vulkan/explicit_layer.d/VkLayer_khronos_validation.json \
        "$root"/usr/share/vulkan/implicit_layer.d/*.json; do
        into=$MESA26/layers
        case $layer in */implicit_layer.d/*) into=$MESA26/implicit_layers ;; esac
        sed -E "s|\"library_path\"[ ]*:[ ]*\"([^/\"]*)\"|\"library_path\": \"$lib/\\1\"|" "$layer" \
            >"$into/$(basename "$layer")"
    done
    # Every library the driver and the layer need resolves inside the root, or this stops here.
    for tool in "$lib/libvulkan_lvp.so" "$lib/libVkLayer_khronos_validation.so"; do
        if "$lib/ld-linux-x86-64.so.2" --library-path "$lib" --list "$tool" | grep 'not found'; then
            echo "mesa26: $(basename "$tool") of the private root needs libraries the root lacks" >&2
            exit 1
        fi
    done
    "$MESA26/bin/glslangValidator" --version | head -n 1
    echo "$MESA26_EXPECT" >"$MESA26/ready"
    echo "mesa-vulkan-drivers $version and its libraries unpacked into $root"
}
# coopmat_tools: COOPMAT_TOOLS, CMake's flags for the root's glslang and spirv-val
# (cmake/qkv_shaders.cmake), with which a build compiles the cooperative-matrix shaders, where the
# root is there (fetched by the mesa26 leg, this run or an earlier one); else none. Only the mesa26
# leg fetches the root: the gcc, clang and sanitize legs use it where it is there, and without it
# they build and test as before (the family left out of the build and refused at run time, its
# tests skipped; the system's lavapipe does not offer the extension anyway).
coopmat_tools() {
    COOPMAT_TOOLS=()
    if [ -f "$MESA26/ready" ] && [ "$(cat "$MESA26/ready")" = "$MESA26_EXPECT" ]; then
        COOPMAT_TOOLS=("-DQKV_GLSLANG_COOPMAT=$MESA26/bin/glslangValidator"
                       "-DQKV_SPIRV_VAL_COOPMAT=$MESA26/bin/spirv-val")
    fi
}

# MESA26_ENV: the variables that put a program run by build/mesa26/run on the root's driver and
# layers (only the root's: VK_LAYER_PATH and VK_IMPLICIT_LAYER_PATH replace the system's).
mesa26_environment() {
    MESA26_ENV=(env "VK_DRIVER_FILES=$MESA26/lvp_icd.json" "VK_ICD_FILENAMES=$MESA26/lvp_icd.json"
                "VK_LAYER_PATH=$MESA26/layers" "VK_IMPLICIT_LAYER_PATH=$MESA26/implicit_layers")
}

leg_mesa26() {
    fetch_mesa26
    coopmat_tools
    # The gcc leg's build with the root's glslang: built here when this leg runs alone; after a gcc
    # leg that ran without the root, the cooperative-matrix shader, one test source and the links
    # are redone (tests/CMakeLists.txt keeps the build's facts out of the other test sources).
    configure_build build/gcc -DCMAKE_CXX_COMPILER=g++ -DQKV_WERROR=ON -DBUILD_SHARED_LIBS=ON "${COOPMAT_TOOLS[@]}"
    log "Mesa $MESA26_EXPECT's lavapipe: the GCC build's tests labelled interop (an application's own device) and coopmat (the cooperative-matrix family) through the private root, its validation layers on"
    local devices
    mesa26_environment
    # The tests must run on that driver and no other, with its cooperative matrices usable.
    devices=$("${MESA26_ENV[@]}" "$MESA26/run" build/gcc/bin/qkv devices) || {
        echo "mesa26 leg: no Vulkan device through $MESA26/lvp_icd.json" >&2
        exit 1
    }
    echo "$devices"
    if ! grep -q "Mesa $MESA26_EXPECT\." <<<"$devices" || grep -Eq "Mesa (1[0-9]|2[0-5])\." <<<"$devices" ||
        ! grep -q "cooperative matrices (VK_KHR_cooperative_matrix): " <<<"$devices"; then
        echo "mesa26 leg: the Vulkan device is not (only) Mesa $MESA26_EXPECT's lavapipe with usable cooperative matrices" >&2
        exit 1
    fi
    # Every test program through the root's loader (cmake/run_test_program.sh); the coopmat entries
    # run the parity suites with the cooperative-matrix family alone (tests/CMakeLists.txt).
    "${MESA26_ENV[@]}" "QKV_TEST_WRAPPER=$MESA26/run" \
        ctest --test-dir build/gcc --output-on-failure -j "$JOBS" -L '^(interop|coopmat)$'
}

leg_clang() {
    coopmat_tools
    log "Clang: build (warnings as errors; the Python module too) and test (not the labels variant, long, sweep, python, cli, nor consumer.subdirectory: the gcc leg runs them)"
    configure_build build/clang -DCMAKE_CXX_COMPILER=clang++ -DQKV_WERROR=ON "${COOPMAT_TOOLS[@]}"
    # consumer.subdirectory builds the sources this leg has just built with Clang once more, in a
    # project of its own (about 50 s with nothing beside it); consumer.package still builds a
    # project with Clang against the installed headers and libraries.
    run_ctest build/clang -E '^consumer\.subdirectory$' -LE '^(variant|long|sweep|python|cli)$'
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
    coopmat_tools
    log "Clang with AddressSanitizer + UndefinedBehaviorSanitizer: build and test"
    configure_build build/sanitize -DCMAKE_CXX_COMPILER=clang++ -DQKV_WERROR=ON -DQKV_SANITIZE=address,undefined \
        -DCMAKE_BUILD_TYPE=RelWithDebInfo "${COOPMAT_TOOLS[@]}"
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=1 \
    UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    LSAN_OPTIONS="suppressions=$ROOT/.ci/lsan.supp:print_suppressions=0" \
        run_ctest build/sanitize -E '^consumer\.' -LE '^(variant|long)$'
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
        log "The Python package: import qkv"
        link_python build/release
        ;;
    test)
        install_packages "${BUILD_PACKAGES[@]}" "${TEST_PACKAGES[@]}"
        legs=("${@:2}")
        [ ${#legs[@]} -eq 0 ] && legs=(format gcc mesa25 mesa26 clang neutral sanitize fuzz windows)
        start=$SECONDS
        for leg in "${legs[@]}"; do
            cpu_now
            leg_start=$SECONDS leg_cpu=$CPU_NOW
            "leg_$leg"
            # The CPU time tells a leg's cost on a shared machine, whose load the wall time includes.
            cpu_now
            echo "leg $leg: $((SECONDS - leg_start)) s ($((CPU_NOW - leg_cpu)) s of CPU; load average" \
                "$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo unknown))"
        done
        log "All test legs passed (${legs[*]}) in $((SECONDS - start)) s"
        ;;
    *)
        echo "usage: bash quickstart.sh example | test [format|gcc|mesa25|mesa26|clang|neutral|sanitize|fuzz|windows...]" >&2
        exit 2
        ;;
esac
