#!/usr/bin/env bash
# qkv on an NVIDIA GPU inside one short lease (at most 8 minutes; QKV_CHECK_SECONDS, default 470):
# first the numbers, then the correctness checks. `qkv bench` over N = 1024, 4096, 16384, d = 64 and 128,
# fp16 and fp32, causal and not, a decode step at S = 65,536, a serving step of 64 paged sequences,
# and PyTorch's CUDA scaled_dot_product_attention (flash backend) on the same shapes in the same run; training:
# `qkv bench --backward` at N = 4096, d = 64 and 128, fp16 and fp32, causal and not, scalar and
# cooperative-matrix kernels (QKV_COOP_UNVERIFIED=1: on GPUs the family's gate refuses it otherwise), beside PyTorch's SDPA forward and backward (torch.autograd.grad); the
# held-out PyTorch-semantics fixtures of tests/data/sdpa on each family; then the Vulkan suite's call
# paths and the per-family parity suites on every kernel family the GPU has (the cooperative-matrix
# one included), in the time left (where the minutes run short, they are what is cut); one JSON file
# of it all.
#
#   bash bench/gpu/check.sh build           here: build/gpu-check/bundle (the qkv tool, qkv_npy_compare and
#                                           the Vulkan test programs, a Release build with the
#                                           cooperative-matrix shaders) and, in .gl/, Debian's
#                                           Vulkan loader and validation layer packages for a machine
#                                           without them, in .gl2/ libglvnd (NVIDIA's driver links its
#                                           libGLdispatch); carry all three (build/gpu-check/bundle,
#                                           .gl, .gl2: about 50 MiB with the repository's 14)
#   bash bench/gpu/check.sh run [--quick]   there: everything above. --quick: small sizes and few
#                                           calls, each step cut at 30 s, for a dry run of every step
#                                           on any Vulkan device (lavapipe)
#   bash bench/gpu/check.sh probe           there: only the cooperative-matrix probe (coop_probe); with
#                                           serve and coop-tests (any of the three, in the order given):
#                                           the serving step at [16, 2048] and [16, 32768], and
#                                           qkv_coop_vulkan_tests, for a short second call
#
# It finds what is missing and says so (and in the JSON), running what it can: no NVIDIA GPU or no
# NVIDIA Vulkan driver (VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json is used
# where that file exists), no Vulkan loader (the carried .gl/libvulkan1_*.deb is unpacked under the
# work folder, never into /; where NVIDIA's driver is still not found that way, bookworm's loader
# and libglvnd from .gl2 are unpacked into / and the machine's own C library runs the programs), no
# validation layer (the test programs need it; the carried
# vulkan-validationlayers package likewise), no CUDA PyTorch. QKV_CHECK_WRAPPER (optional) runs every
# qkv program through a wrapper, e.g. build/mesa26/run for a dry run on Mesa 26.1's lavapipe.
#
# Writes $OUT/gpu-check.json (else build/gpu-check/gpu-check.json) and $OUT/gpu-check.log; the
# table of qkv beside PyTorch goes to the log and the terminal.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
BUNDLE=$ROOT/build/gpu-check/bundle
START=$SECONDS

log() { printf '\n== %s (%d s)\n' "$*" $((SECONDS - START)); }

build() {
    local glslang=${QKV_GLSLANG_COOPMAT:-$ROOT/build/mesa26/bin/glslangValidator}
    local spirv_val=${QKV_SPIRV_VAL_COOPMAT:-$ROOT/build/mesa26/bin/spirv-val}
    [ -x "$glslang" ] || {
        echo "check.sh build: no glslang for GL_KHR_cooperative_matrix at $glslang (bash quickstart.sh test mesa26 fetches one)" >&2
        exit 1
    }
    set -e
    cmake -S "$ROOT" -B build/gpu-check/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
        -DQKV_BUILD_MPI=OFF -DQKV_BUILD_EXAMPLES=OFF "-DQKV_GLSLANG_COOPMAT=$glslang" "-DQKV_SPIRV_VAL_COOPMAT=$spirv_val" \
        ${CMAKE_CXX_COMPILER_LAUNCHER:+"-DCMAKE_CXX_COMPILER_LAUNCHER=$CMAKE_CXX_COMPILER_LAUNCHER"} >/dev/null
    local programs=(qkv_vulkan_tests qkv_sdpa_vulkan_tests qkv_sdpa_features_vulkan_tests qkv_coop_vulkan_tests
                    qkv_kv_cache_tests qkv_tensor_tests qkv_guarantee_tests qkv_numerics_tests)
    cmake --build build/gpu-check/build -j "${QKV_JOBS:-$(nproc)}" --target qkv_cli qkv_npy_compare "${programs[@]}"
    rm -rf "$BUNDLE"
    mkdir -p "$BUNDLE"
    cp build/gpu-check/build/bin/qkv build/gpu-check/build/tests/cli/qkv_npy_compare "$BUNDLE/"
    for p in "${programs[@]}"; do cp "build/gpu-check/build/tests/$p" "$BUNDLE/"; done
    strip "$BUNDLE"/*
    # Debian trixie's C library, C++ runtime, Vulkan loader and validation layer (1.4.309, which knows
    # VK_KHR_cooperative_matrix; bookworm's 1.3.239 reports the extension's structures as unknown),
    # and the X client libraries NVIDIA's Vulkan driver links: the packages the mesa26 root is made of
    # (quickstart.sh, fetch_mesa26). The programs run there through that C library's own loader, as
    # the mesa26 leg runs them, so nothing depends on the GPU machine's libraries but its driver.
    [ -d build/mesa26/debs ] || {
        echo "check.sh build: no build/mesa26/debs (bash quickstart.sh test mesa26 fetches them)" >&2
        exit 1
    }
    rm -rf .gl
    mkdir -p .gl
    local p
    for p in libc6 libstdc++6 libgcc-s1 gcc-14-base libvulkan1 vulkan-validationlayers libx11-6 libx11-data \
        libx11-xcb1 libxcb1 libxau6 libxdmcp6 libbsd0 libmd0; do
        cp build/mesa26/debs/"${p}"_*.deb .gl/
    done
    # NVIDIA's Vulkan driver (libGLX_nvidia.so.0) links libglvnd's libGLdispatch: without it the
    # loader finds the driver but its vk_icdGetInstanceProcAddr gives no vkCreateInstance (seen on
    # an H200, driver 580.159.04). Debian's libglvnd packages and bookworm's Vulkan loader, in .gl2:
    # the first go into the root, all of them into / on the fallback route (other_routes).
    rm -rf .gl2
    mkdir -p .gl2/partial
    local apt=(-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 "-oDir::State::Lists=$ROOT/.gl2/partial")
    apt-get "${apt[@]}" update -qq
    (cd .gl2 && apt-get "${apt[@]}" download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
    rm -rf .gl2/partial
    set +e
    du -sh "$BUNDLE" .gl .gl2
    echo "carry: build/gpu-check/bundle .gl .gl2; then: bash bench/gpu/check.sh run"
}

# ---- run -------------------------------------------------------------------------------------------
QUICK=0
# The benchmarks' sizes (bench, backward_bench; --quick makes them small).
sizes=(1024 4096 16384) repeat=4 warmup=1 tokens=16384 heads=16 decode=65536 dims=64,128
backward=4096 backward_repeat=3
WORK=
JSON=
STEPS=()  # JSON objects, one per step

# step NAME SECONDS COMMAND...: runs the command under a time limit (never past QKV_CHECK_SECONDS),
# records its status and duration; its output goes to the log.
step() {
    local name=$1 limit=$2
    shift 2
    local left=$((${QKV_CHECK_SECONDS:-470} - (SECONDS - START)))
    if ((left < 15)); then
        echo "-- $name: skipped, the ${QKV_CHECK_SECONDS:-470} s are nearly spent"
        STEPS+=("{\"step\": \"$name\", \"status\": \"skipped: out of time\"}")
        return 0
    fi
    ((limit > left)) && limit=$left
    # --quick (a dry run on lavapipe, whose test programs take minutes): every step gets a short
    # turn, so that the run reaches the benchmarks and the summary
    ((QUICK && limit > 30)) && limit=30
    local t=$SECONDS status
    echo "-- $name (limit $limit s)"
    if [ "$1" = program ]; then  # a program of the bundle: its command (cmd) under the limit
        cmd "$2"
        local program_args=("${@:3}")
        timeout --kill-after=5 "$limit" "${CMD[@]}" "${program_args[@]}"
    else
        timeout --kill-after=5 "$limit" "$@"
    fi
    status=$?
    local how=passed
    ((status == 124 || status == 137)) && how="timed out after $limit s"
    ((status != 0 && status != 124 && status != 137)) && how="failed ($status)"
    echo "-- $name: $how in $((SECONDS - t)) s"
    STEPS+=("{\"step\": \"$name\", \"status\": \"$how\", \"seconds\": $((SECONDS - t))}")
    return 0
}

# missing WHAT: says what is missing and records it.
MISSING=()
missing() {
    echo "MISSING: $*"
    MISSING+=("$*")
}

# RUN: what every qkv program runs through (QKV_CHECK_WRAPPER's, or the carried root's loader).
RUN=()

# cmd NAME: CMD becomes the command that runs the program NAME of the bundle (or of build/gcc
# where there is none: a dry run here) through RUN.
CMD=()
cmd() {
    local path
    for path in "$BUNDLE/$1" "$ROOT/build/gcc/bin/$1" "$ROOT/build/gcc/tests/$1" "$ROOT/build/gcc/tests/cli/$1"; do
        if [ -x "$path" ]; then
            CMD=("${RUN[@]}" "$path")
            return 0
        fi
    done
    echo "no $1: run bash bench/gpu/check.sh build here and carry build/gpu-check/bundle" >&2
    CMD=(false)
    return 127
}

# program NAME ARGS...: runs it (cmd).
program() {
    cmd "$1" || return 127
    shift
    "${CMD[@]}" "$@"
}

# other_routes: where the carried root's loader finds no device, the machine's own C library with
# Debian bookworm's Vulkan loader and libglvnd (.gl2) unpacked into / (the recipe the device notes
# give), the programs run directly, tried with `qkv devices`; the validation layer then is whatever
# the machine has (the root's needs the root's C library).
other_routes() {
    local deb
    if ls .gl2/*.deb >/dev/null 2>&1; then
        for deb in .gl2/*.deb; do dpkg -x "$deb" /; done
        ldconfig
        RUN=()
        export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/nvidia/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
        unset VK_ADD_LAYER_PATH
        HAVE_LAYER=0
        local dir
        for dir in /usr/share/vulkan/explicit_layer.d /etc/vulkan/explicit_layer.d; do
            compgen -G "$dir/*validation*.json" >/dev/null && HAVE_LAYER=1
        done
        echo "route: the machine's C library, bookworm's Vulkan loader and libglvnd in / (validation layer: $HAVE_LAYER)"
        program qkv devices && return 0
        VK_LOADER_DEBUG=error,warn program qkv devices 2>&1 | head -6
    fi
    return 1
}

environment() {
    log "What this machine has"
    uname -a
    if command -v nvidia-smi >/dev/null && nvidia-smi -L; then
        nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
    else
        missing "no NVIDIA GPU (nvidia-smi): the numbers below are of another device"
    fi
    local icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
    if [ -z "${VK_DRIVER_FILES:-}" ] && [ -f "$icd" ]; then
        export VK_DRIVER_FILES=$icd VK_ICD_FILENAMES=$icd
        echo "Vulkan driver: $icd"
    elif [ -z "${VK_DRIVER_FILES:-}" ]; then
        missing "no NVIDIA Vulkan driver manifest at $icd: the loader's default drivers are used"
    fi
    # The carried root (.gl): trixie's C library and loader run the programs, with its Vulkan loader
    # and validation layer; the machine's own libraries (its driver's) after the root's.
    HAVE_LAYER=0
    if [ -n "${QKV_CHECK_WRAPPER:-}" ]; then
        RUN=("$QKV_CHECK_WRAPPER")
        echo "programs run through $QKV_CHECK_WRAPPER"
    elif ls .gl/libc6_*.deb >/dev/null 2>&1; then
        mkdir -p "$WORK/root" "$WORK/layers"
        local deb lib=$WORK/root/usr/lib/x86_64-linux-gnu manifest
        for deb in .gl/*.deb .gl2/*.deb; do
            case $deb in .gl2/libvulkan1_*) continue ;; esac  # the root's own (newer) loader stays
            dpkg -x "$deb" "$WORK/root"
        done
        RUN=("$lib/ld-linux-x86-64.so.2" --library-path "$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}:/usr/local/nvidia/lib64:/usr/local/nvidia/lib")
        for manifest in "$WORK"/root/usr/share/vulkan/explicit_layer.d/*validation*.json; do
            sed -E "s|\"library_path\"[ ]*:[ ]*\"([^/\"]*)\"|\"library_path\": \"$lib/\\1\"|" "$manifest" \
                >"$WORK/layers/$(basename "$manifest")"
        done
        export VK_ADD_LAYER_PATH=$WORK/layers${VK_ADD_LAYER_PATH:+:$VK_ADD_LAYER_PATH}
        echo "programs run through the carried root's loader ($(ls .gl | wc -l) packages): trixie's libc, Vulkan loader and validation layer"
    else
        missing "no carried root in .gl (bash bench/gpu/check.sh build): the machine's own Vulkan loader and layers are used"
    fi
    local dir dirs=(/usr/share/vulkan/explicit_layer.d /etc/vulkan/explicit_layer.d)
    local -a extra
    IFS=: read -r -a extra <<<"${VK_LAYER_PATH:-}:${VK_ADD_LAYER_PATH:-}"
    for dir in "${dirs[@]}" "${extra[@]}"; do
        [ -n "$dir" ] && compgen -G "$dir/*validation*.json" >/dev/null && HAVE_LAYER=1
    done
    ((HAVE_LAYER)) || missing "no Khronos validation layer: the test programs (validation on) cannot run"
    if program qkv devices; then :; else
        echo "the loader's own account (VK_LOADER_DEBUG=error,warn,driver):"
        VK_LOADER_DEBUG=error,warn,driver program qkv devices 2>&1 | grep -v "^\[Vulkan Loader\] DRIVER: " | head -12
        ls /usr/local/nvidia/lib64 2>&1 | grep -i "GLdispatch\|vulkan\|GLX_nvidia\|glvkspirv\|gpucomp" | tr '\n' ' '
        echo
        other_routes || missing "qkv devices found no usable Vulkan device on any route"
    fi
    if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
        TORCH=cuda
    elif python3 -c 'import torch' 2>/dev/null; then
        TORCH=cpu
        missing "PyTorch without CUDA: its timings run on the CPU and compare nothing"
    else
        TORCH=none
        missing "no PyTorch (python3 -c 'import torch')"
    fi
}

tests() {
    if ((HAVE_LAYER == 0)); then
        echo "-- tests: skipped (no validation layer)"
        STEPS+=('{"step": "tests", "status": "skipped: no validation layer"}')
        return
    fi
    log "The Vulkan suite's call paths, and the parity suites with every family this device has"
    step "qkv_vulkan_tests [tutorial],[families]" 90 program qkv_vulkan_tests "[tutorial],[families]~[long]"
    step "qkv_sdpa_vulkan_tests [families]" 60 program qkv_sdpa_vulkan_tests "[families]"
    local features="[families]"
    ((QUICK)) && features="[families]~[grid]"  # lavapipe compiles the grid's wide heads for minutes
    step "qkv_sdpa_features_vulkan_tests $features" 90 program qkv_sdpa_features_vulkan_tests "$features"
    step "qkv_coop_vulkan_tests" 60 program qkv_coop_vulkan_tests
    step "qkv_kv_cache_tests" 60 program qkv_kv_cache_tests
    step "qkv_tensor_tests" 60 program qkv_tensor_tests
    step "qkv_guarantee_tests" 60 program qkv_guarantee_tests
    # The random sweep's sampled subset on every family, and the long case (N = 16,384, d = 64: about
    # 69 GFLOP per family, minutes of emulated matrix products on lavapipe, well under a second here).
    step "qkv_numerics_tests [family_sweep]" 60 program qkv_numerics_tests "[family_sweep]"
    ((QUICK)) || step "qkv_vulkan_tests N = 16384" 60 program qkv_vulkan_tests "N = 16384*"
}

# Where the cooperative-matrix family goes wrong on a GPU (docs/devices.md: every result wrong on an
# H200): a few held-out fixtures through `--kernel coopmat` under several tilings (QKV_COOP_TILES:
# subgroups per workgroup, keys per tile; "auto" the plan's own), each line the nmse against the
# PyTorch-semantics reference (at most 1e-5 is right). `single` is one query against one key, so its
# output is V's row whatever the scores are: wrong there means the P·V product, the rescale or the
# write-out, not Q·Kᵀ. The last two lines of each fixture take steps off the matrix units
# (QKV_COOP_ISOLATE, contract/coop.h): isolate=pv does P·V and O's rescale per element in float32,
# isolate=rescale only the rescale; right there and wrong on auto names the step at fault. About 40
# short runs (lavapipe: minutes, each tiling a pipeline to compile). QKV_PROBE_FIXTURES and
# QKV_PROBE_TILINGS (space-separated) choose fewer, for a short second call.
coop_probe() {
    log "Cooperative-matrix probe (QKV_COOP_UNVERIFIED=1): nmse of held-out fixtures per tiling"
    mkdir -p "$WORK/probe"
    local name tiles dir flags out line
    for name in ${QKV_PROBE_FIXTURES:-single plain_2d gqa_4d_scale causal_bottom_right_gqa decode_5000}; do
        dir=tests/data/sdpa/$name
        [ -f "$dir/args.txt" ] || continue
        read -r -a flags <"$dir/args.txt"
        # block_tiles in fp16 first: the float16 rounding of the inputs alone (decode_5000's scores
        # are large: 8e-2 on every family), the line each tiling is to be read against
        for tiles in ${QKV_PROBE_TILINGS:-block_tiles auto 1,16 1,32 2,32 4,64 isolate=pv isolate=rescale}; do
            ((SECONDS - START > ${QKV_CHECK_SECONDS:-470} - 30)) && return 0
            out=$WORK/probe/${name}_${tiles//[,=]/_}.npy
            cmd qkv || return 0
            line=$( (kernel=coopmat
                if [ "$tiles" = block_tiles ]; then kernel=block_tiles
                elif [ "${tiles%%=*}" = isolate ]; then export QKV_COOP_ISOLATE=${tiles#isolate=}
                elif [ "$tiles" != auto ]; then export QKV_COOP_TILES=$tiles
                fi
                timeout 30 "${CMD[@]}" sdpa --q "$dir/q.npy" --k "$dir/k.npy" --v "$dir/v.npy" --out "$out" \
                    --backend vulkan --kernel "$kernel" --precision fp16 "${flags[@]}" 2>&1 >/dev/null
                status=$?
                ((status == 124)) && echo "timed out after 30 s") | tail -1)
            if [ -f "$out" ] && cmd qkv_npy_compare; then
                line=$(timeout 10 "${CMD[@]}" "$out" "$dir/expected_out.npy" --max-nmse 1e-5 2>&1 | grep -o "nmse [^ ]*" | head -1)
            fi
            printf '   %-24s %-11s %s\n' "$name" "$tiles" "${line:0:150}"
        done
    done
    STEPS+=('{"step": "coop probe", "status": "ran: see the log"}')
}

# The PyTorch-semantics fixtures (tests/data/sdpa, made by make_sdpa_fixtures.py) on each family.
parity_case() {
    local dir=$1 family=$2
    local precision=fp32 nmse=1e-9 out=$WORK/parity/$(basename "$dir")_$family.npy
    [ "$family" = coopmat ] && precision=fp16 nmse=1e-5  # the family multiplies float16
    local args=(sdpa --q "$dir/q.npy" --k "$dir/k.npy" --v "$dir/v.npy" --out "$out" --backend vulkan --kernel "$family"
                --precision "$precision")
    [ -f "$dir/mask.npy" ] && args+=(--mask "$dir/mask.npy")
    local flags
    read -r -a flags <"$dir/args.txt"
    program qkv "${args[@]}" "${flags[@]}" && program qkv_npy_compare "$out" "$dir/expected_out.npy" --max-nmse "$nmse"
}

parity() {
    log "Held-out parity: tests/data/sdpa's PyTorch-semantics references on every family"
    mkdir -p "$WORK/parity"
    local family dir status failed
    for family in row_tiles block_tiles coopmat; do
        failed=0
        for dir in tests/data/sdpa/*/; do
            dir=${dir%/}
            [ -f "$dir/args.txt" ] && [ -f "$dir/expected_out.npy" ] || continue  # the parity cases
            [ "$(basename "$dir")" = float64 ] && continue                        # float64 inputs: the cpu backend's
            parity_case "$dir" "$family" >>"$WORK/parity/$family.log" 2>&1
            status=$?
            ((status != 0)) && failed=$((failed + 1)) && echo "   $family $(basename "$dir"): failed ($status)"
        done
        if [ "$family" = coopmat ] && grep -q "unavailable\|does not offer\|refused" "$WORK/parity/$family.log"; then
            echo "-- parity, coopmat: refused on this device ($(grep -m1 -o 'sdpa: .*' "$WORK/parity/$family.log" | head -c 160))"
            STEPS+=("{\"step\": \"parity $family\", \"status\": \"refused on this device\"}")
            continue
        fi
        echo "-- parity, $family: $failed failed"
        STEPS+=("{\"step\": \"parity $family\", \"status\": \"$( ((failed)) && echo "$failed failed" || echo passed)\"}")
    done
}

bench() {
    log "qkv bench (sdpa over q, k, v: L = S = N; B = 16384 / N, 16 heads) and a decode step, block_tiles"
    local n
    step "qkv bench ceiling" 30 program qkv bench --seq 64 --kv-seq 64 --heads 1 --dim 16 --precision fp32 \
        --causal no --kernel block_tiles --repeat 1 --warmup 0 --json "$WORK/qkv_bench_ceiling.json"
    for n in "${sizes[@]}"; do
        step "qkv bench N = $n" 75 program qkv bench --seq "$n" --kv-seq "$n" --batch $((tokens / n > 0 ? tokens / n : 1)) \
            --heads "$heads" --dim "$dims" --precision fp16,fp32 --causal no,yes --kernel block_tiles --no-ceiling \
            --repeat "$repeat" --warmup "$warmup" --json "$WORK/qkv_bench_n$n.json"
    done
    step "qkv bench decode S = $decode" 40 program qkv bench --decode --seq 1 --kv-seq "$decode" --heads 32 \
        --kv-heads 8 --dim 128 --precision fp16,fp32 --causal no --kernel block_tiles --split on --no-ceiling \
        --repeat "$repeat" --warmup "$warmup" --json "$WORK/qkv_bench_decode.json"
    if [ "$TORCH" = none ]; then
        STEPS+=('{"step": "torch", "status": "skipped: no PyTorch"}')
    else
        log "PyTorch's scaled_dot_product_attention on the same shapes (flash backend for fp16), forward and backward"
        local seqs
        seqs=$(IFS=,; echo "${sizes[*]}")
        step "torch sdpa" 120 python3 bench/gpu/torch_sdpa.py --seq "$seqs" --dim "$dims" --tokens "$tokens" \
            --heads "$heads" --decode "$decode" --backward "$backward" --repeat "$repeat" --warmup "$warmup" \
            --json "$WORK/torch.json"
    fi
    # The cooperative-matrix family apart (QKV_COOP_UNVERIFIED=1, set by run: its GPU gate refuses it
    # otherwise), fp16 only: where it computes a NaN the bench stops, and only these rows are lost.
    log "qkv bench, the cooperative-matrix family (fp16)"
    for n in "${sizes[@]}"; do
        step "qkv bench coopmat N = $n" 40 program qkv bench --seq "$n" --kv-seq "$n" \
            --batch $((tokens / n > 0 ? tokens / n : 1)) --heads "$heads" --dim "$dims" --precision fp16 --causal no,yes \
            --kernel coopmat --no-ceiling --repeat "$repeat" --warmup "$warmup" --json "$WORK/qkv_bench_coop_n$n.json"
    done
    step "qkv bench coopmat decode S = $decode" 30 program qkv bench --decode --seq 1 --kv-seq "$decode" --heads 32 \
        --kv-heads 8 --dim 128 --precision fp16 --causal no --kernel coopmat --split on --no-ceiling \
        --repeat "$repeat" --warmup "$warmup" --json "$WORK/qkv_bench_coop_decode.json"
}

# Serving (the paged K/V pool): one decode step of 64 sequences, cached lengths log-uniform in
# [16, --seq] (Hq = 32, Hkv = 8, d = 128, fp16), as one batched paged call (host call, over tensors,
# recorded in a sequence) against 64 separate calls and padding to the longest. The batched call's
# target is >= 3x the separate calls, which lavapipe's 2 cores cannot show (bench/RESULTS.md). `run`
# times [16, 2048]; `serve` also the issue's [16, 32768] (297,137 keys: the host-side forms, the pool
# uploaded per call and the padded cache, take most of its minutes).
serve_bench() {
    local seq
    for seq in "$@"; do
        log "qkv bench --serve 64 (lengths log-uniform in [16, $seq])"
        step "qkv bench --serve 64 --seq $seq" $((seq > 4096 ? 150 : 45)) program qkv bench --serve 64 --seq "$seq" \
            --recorded --precision fp16 --repeat $((seq > 4096 ? 2 : 5)) --warmup 1 --no-ceiling \
            --json "$WORK/qkv_serve_$seq.json"
    done
}

# Training: the backward pass (context::sdpa_backward) beside the forward, at N = 4096 with the
# forward rows' batch and heads: the scalar kernels (block_tiles) one step per precision, then the
# cooperative-matrix kernels (fp16 only), so that what finished is kept if the lease runs short.
# About 0.55 TFLOP per forward at d = 128 (1.4 per backward).
backward_bench() {
    log "qkv bench --backward (sdpa_backward beside sdpa: L = S = $backward, B = $((tokens / backward)), $heads heads)"
    local precision
    for precision in fp16 fp32; do
        step "qkv bench --backward N = $backward $precision" 60 program qkv bench --backward --seq "$backward" \
            --batch $((tokens / backward > 0 ? tokens / backward : 1)) --heads "$heads" --dim "$dims" \
            --precision "$precision" --causal no,yes --kernel block_tiles --repeat "$backward_repeat" --warmup 1 \
            --json "$WORK/qkv_backward_$precision.json"
    done
    step "qkv bench --backward N = $backward coopmat" 45 program qkv bench --backward --seq "$backward" \
        --batch $((tokens / backward > 0 ? tokens / backward : 1)) --heads "$heads" --dim "$dims" \
        --precision fp16 --causal no,yes --kernel coopmat --repeat "$backward_repeat" --warmup 1 \
        --json "$WORK/qkv_backward_coop.json"
}

run() {
    [ "${1:-}" = --quick ] && QUICK=1
    # The cooperative-matrix family where asked for, on GPUs too (its gate refuses it there until a
    # GPU run of this script sees it right; src/kernels/flash_coop_plan.cpp): the tests and the
    # coopmat bench steps measure it. The automatic choice is unchanged.
    export QKV_COOP_UNVERIFIED=1
    if ((QUICK)); then
        sizes=(128 256) repeat=2 warmup=1 tokens=256 heads=2 decode=4096 dims=16,64 backward=128 backward_repeat=2
    fi
    local out_dir=${OUT:-$ROOT/build/gpu-check}
    mkdir -p "$out_dir"
    WORK=$(mktemp -d)
    JSON=$out_dir/gpu-check.json
    {
        echo "bash bench/gpu/check.sh run${1:+ $1}: $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
        environment
        coop_probe
        serve_bench 2048
        bench
        backward_bench
        parity
        tests
        log "Summary"
        {
            printf '{"quick": %s, "seconds": %d, "missing": [' "$QUICK" $((SECONDS - START))
            local first=1 m
            for m in "${MISSING[@]+"${MISSING[@]}"}"; do
                ((first)) || printf ', '
                first=0
                printf '"%s"' "${m//\"/\'}"
            done
            printf '], "steps": ['
            first=1
            for m in "${STEPS[@]+"${STEPS[@]}"}"; do
                ((first)) || printf ', '
                first=0
                printf '%s' "$m"
            done
            printf ']}\n'
        } >"$WORK/steps.json"
        python3 bench/gpu/summarize.py --work "$WORK" --out "$JSON"
        echo "wrote $JSON in $((SECONDS - START)) s"
    } 2>&1 | tee "$out_dir/gpu-check.log"
    rm -rf "$WORK"
}

case "${1:-}" in
    build) build ;;
    run) run "${2:-}" ;;
    probe | serve | coop-tests)  # short calls of a lease, in the order given: bash check.sh probe serve
        export QKV_COOP_UNVERIFIED=1
        WORK=$(mktemp -d)
        environment
        for mode in "$@"; do
            case "$mode" in
                probe) coop_probe ;;  # the cooperative-matrix probe
                serve) serve_bench 2048 32768 ;;
                coop-tests) step "qkv_coop_vulkan_tests" 90 program qkv_coop_vulkan_tests ;;
                *) echo "check.sh: unknown mode $mode" >&2 ;;
            esac
        done
        rm -rf "$WORK"
        ;;
    *)
        echo "usage: bash bench/gpu/check.sh build | run [--quick] | probe | serve | coop-tests (the last three in any order, together)" >&2
        exit 2
        ;;
esac
