#!/usr/bin/env bash
# Measure how large an attention qkv can evaluate in a constant expression under a compiler's
# constexpr limits (GCC: -fconstexpr-ops-limit / -fconstexpr-loop-limit, Clang: -fconstexpr-steps).
#
# Usage:
#   tools/measure_constexpr_limits.sh [--heads H] COMPILER                    sweep (default limits)
#   tools/measure_constexpr_limits.sh [--heads H] COMPILER --count N D        smallest limit that compiles
#   tools/measure_constexpr_limits.sh COMPILER --count tutorial               ... for the worked example
#   tools/measure_constexpr_limits.sh [--heads H] COMPILER --time N D [LIMIT] one timed compile
#   tools/measure_constexpr_limits.sh --staged COMPILER --time N D [LIMIT]    ... of qkv::staged::self_attention
#   tools/measure_constexpr_limits.sh COMPILER --reach                        the reach proofs, timed
#
# --staged probes qkv::staged::self_attention<x, wq, wk, wv> (many small evaluations) instead of
# one evaluation of qkv::self_attention; it has no largest size, so only --time applies.
# --reach compiles the proofs tests/compile/reach_static.cpp (one evaluation of self_attention and
# the staged form at N = 64, d = 64) and tests/compile/reach_staged_256.cpp (staged, N = 256,
# d = 64), each against its float64 reference, under /usr/bin/time -v, and prints wall-clock and
# CPU seconds, peak RSS, the load average before the compile, and whether it met the budget
# (<= QKV_MAX_SECONDS wall-clock seconds, default 60, and <= QKV_MAX_MIB MiB, default
# 3072). The exit status is 1 when a proof fails to compile or exceeds the budget.
#
# COMPILER is a GCC or Clang C++ driver (g++, g++-12, clang++, clang++-14, ...).
#
# The probe TU: x is N x d, wq/wk/wv are d x d (d_in = d_k = d_v = d), float, default scale,
# element (i, j) = ((i*7 + j*3 + salt) % 11 - 5) * 0.1 with a different salt per matrix. Each input
# is its own constexpr variable (its own, cheap, constant evaluation), so the limit is spent on
#   constexpr auto r = qkv::self_attention(x, wq, wk, wv);      // or multi_head_attention<H>
#   static_assert(r.output(N - 1, d - 1) > -1e30f);
# alone. (A constexpr variable rather than a bare static_assert: GCC 12 names the exceeded limit
# only for the former.)
#
# Sweep: for each d in QKV_DS the largest N that compiles, and for each N in QKV_NS the largest d
# (a multiple of H with --heads), found by doubling then bisection; then the compile time (best of
# QKV_REPEAT runs) and peak RSS at the largest size, and what stops size + 1. Prints Markdown.
# --count bisects the limit flag itself: the smallest -fconstexpr-ops-limit (GCC) or
# -fconstexpr-steps (Clang) value that compiles, i.e. the size of that evaluation in the
# compiler's own units, to a relative precision QKV_PRECISION (0 = exact).
#
# Environment: QKV_DS ("4 8 16 32 64"), QKV_NS ("4 8 16 32 64"; either may be set empty to skip
# that half of the sweep), QKV_TIMEOUT (300 s per compile),
# QKV_REPEAT (2), QKV_PRECISION (0.001), QKV_CXXFLAGS (extra flags), QKV_INCLUDE (include dir).
# Each probe runs `timeout $QKV_TIMEOUT /usr/bin/time -f '%e %M' CXX -std=c++20 -fsyntax-only`;
# a timeout counts as a failure ("timeout"). Run one sweep at a time: timings assume an idle CPU.
set -euo pipefail

die() { echo "error: $*" >&2; exit 2; }

HEADS=0 STAGED=0
while [[ ${1:-} == --heads || ${1:-} == --staged ]]; do
    if [[ $1 == --heads ]]; then HEADS=${2:?--heads needs a value}; shift 2; else STAGED=1; shift; fi
done
CXX=${1:?usage: $0 [--heads H | --staged] COMPILER [--count N D | --count tutorial | --time N D [LIMIT] | --reach]}
shift
MODE=${1:-sweep}
((STAGED)) && [[ $MODE != --time ]] && die "--staged has no largest size or limit to find: use it with --time N D"

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
INCLUDE=${QKV_INCLUDE:-$here/../include}
[[ -f $INCLUDE/qkv/qkv.hpp ]] || die "qkv headers not found under $INCLUDE (set QKV_INCLUDE)"
DS=${QKV_DS-4 8 16 32 64}  # no colon: an empty list skips that half of the sweep
NS=${QKV_NS-4 8 16 32 64}
TIMEOUT=${QKV_TIMEOUT:-300}
REPEAT=${QKV_REPEAT:-2}
PRECISION=${QKV_PRECISION:-0.001}
read -r -a EXTRA <<<"${QKV_CXXFLAGS:-}"
[[ -x /usr/bin/time ]] || die "/usr/bin/time is required (GNU time)"
command -v "$CXX" >/dev/null || die "compiler $CXX not found"

if "$CXX" --version 2>/dev/null | grep -qi clang; then
    FAMILY=clang LIMIT_FLAG=-fconstexpr-steps DEFAULT_LIMIT=1048576
else
    FAMILY=gcc LIMIT_FLAG=-fconstexpr-ops-limit DEFAULT_LIMIT=33554432  # GCC 10+ (2^25)
fi
VERSION=$("$CXX" --version | head -n 1)

TMP=$(mktemp -d "${TMPDIR:-/tmp}/qkv_constexpr.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

# gen_tu N D H: the probe translation unit on stdout. N == tutorial: the README's worked example.
gen_tu() {
    local n=$1 d=$2 h=$3
    if [[ $n == tutorial ]]; then
        cat <<'CPP'
#include <qkv/tutorial.hpp>
namespace t = qkv::tutorial;
constexpr auto r = qkv::self_attention(t::inputs, t::w_query, t::w_key, t::w_value);
static_assert(r.output(2, 2) > -1e30f);
CPP
        return
    fi
    local call="qkv::self_attention(x, wq, wk, wv)"
    ((h > 0)) && call="qkv::multi_head_attention<$h>(x, wq, wk, wv)"
    ((STAGED)) && call="qkv::staged::self_attention<x, wq, wk, wv>"
    cat <<CPP
#include <cstddef>
#include <qkv/qkv.hpp>
constexpr std::size_t N = $n, D = $d;
template <std::size_t R, std::size_t C>
constexpr qkv::matrix<float, R, C> make(std::size_t salt) {
    return [salt] {
        qkv::matrix<float, R, C> m{};
        for (std::size_t i = 0; i < R; ++i)
            for (std::size_t j = 0; j < C; ++j)
                m.elems[i][j] = static_cast<float>(static_cast<int>((i * 7 + j * 3 + salt) % 11) - 5) * 0.1f;
        return m;
    }();
}
constexpr auto x = make<N, D>(0);
constexpr auto wq = make<D, D>(1);
constexpr auto wk = make<D, D>(2);
constexpr auto wv = make<D, D>(3);
constexpr auto r = $call;
static_assert(r.output(N - 1, D - 1) > -1e30f);
CPP
}

# probe N D H [LIMIT]: compile once. Sets P_OK (0/1), P_TIME (s), P_RSS (MiB), P_WHY.
probe() {
    local n=$1 d=$2 h=$3 limit=${4:-}
    local src=$TMP/probe.cpp flags=(-std=c++20 -fsyntax-only -I"$INCLUDE" "${EXTRA[@]}")
    [[ -n $limit ]] && flags+=("$LIMIT_FLAG=$limit")
    gen_tu "$n" "$d" "$h" >"$src"
    local rc=0
    timeout "$TIMEOUT" /usr/bin/time -f '%e %M' -o "$TMP/time" "$CXX" "${flags[@]}" "$src" \
        >"$TMP/out" 2>&1 || rc=$?
    local t=NA m=0
    if [[ -s $TMP/time ]]; then read -r t m < <(grep -E '^[0-9.]+ [0-9]+$' "$TMP/time" | tail -n 1) || true; fi
    P_TIME=${t:-NA} P_RSS=$(((${m:-0} + 1023) / 1024))
    if ((rc == 0)); then P_OK=1 P_WHY=; return; fi
    P_OK=0
    if ((rc == 124)); then P_WHY="timeout (${TIMEOUT} s)" P_TIME=">$TIMEOUT"
    elif grep -q 'operation count exceeds limit' "$TMP/out"; then P_WHY="-fconstexpr-ops-limit"
    elif grep -q 'loop iteration count exceeds limit' "$TMP/out"; then P_WHY="-fconstexpr-loop-limit"
    elif grep -q 'maximum step limit' "$TMP/out"; then P_WHY="-fconstexpr-steps"
    elif grep -qiE 'depth|recursion' "$TMP/out"; then P_WHY="-fconstexpr-depth"
    elif ((rc == 137)) || grep -qiE 'memory exhausted|out of memory|cannot allocate|Killed' "$TMP/out"; then P_WHY="memory"
    else P_WHY="error: $(grep -m 1 'error' "$TMP/out" | cut -c 1-120)"
    fi
}

log() { echo "  $*" >&2; }

# max_size VARY FIXED: largest value of the varied dimension (N or d) that compiles at default
# limits, in multiples of STEP. Sets M_MAX, M_TIME, M_RSS, M_WHY (why MAX + STEP fails).
max_size() {
    local vary=$1 fixed=$2 step=1 lo=0 hi k
    [[ $vary == d ]] && ((HEADS > 0)) && step=$HEADS
    local -A t=() r=() why=()
    try() {  # try K: probe the size K*step; returns 0 when it compiles
        local v=$(($1 * step)) n d
        if [[ $vary == N ]]; then n=$v d=$fixed; else n=$fixed d=$v; fi
        probe "$n" "$d" "$HEADS"
        log "N=$n d=$d H=$HEADS: $([[ $P_OK == 1 ]] && echo ok || echo "FAIL ($P_WHY)") ${P_TIME}s ${P_RSS}MiB"
        t[$1]=$P_TIME r[$1]=$P_RSS why[$1]=$P_WHY
        [[ $P_OK == 1 ]]
    }
    k=$(((8 + step - 1) / step))
    while try "$k"; do lo=$k; k=$((k * 2)); done
    hi=$k
    while ((hi - lo > 1)); do
        k=$(((lo + hi) / 2))
        if try "$k"; then lo=$k; else hi=$k; fi
    done
    if ((lo == 0)); then M_MAX=0 M_TIME=- M_RSS=- M_WHY=${why[1]}; return 0; fi
    M_MAX=$((lo * step)) M_TIME=${t[$lo]} M_RSS=${r[$lo]} M_WHY=${why[$hi]:-?}
    local i
    for ((i = 1; i < REPEAT; i++)); do  # best of REPEAT: other jobs on the machine only add time
        try "$lo" >/dev/null || true
        [[ $P_OK == 1 ]] && awk -v a="$P_TIME" -v b="$M_TIME" 'BEGIN { exit !(a < b) }' && M_TIME=$P_TIME
        ((P_RSS > M_RSS)) && M_RSS=$P_RSS
    done
    return 0
}

# min_limit N D H: smallest LIMIT_FLAG value that compiles. Sets L_MIN, L_TIME (at L_MIN).
min_limit() {
    local n=$1 d=$2 h=$3 lo=0 hi=1024 mid
    while :; do
        probe "$n" "$d" "$h" "$hi"
        log "$LIMIT_FLAG=$hi: $([[ $P_OK == 1 ]] && echo ok || echo "FAIL ($P_WHY)") ${P_TIME}s"
        [[ $P_OK == 1 ]] && break
        [[ $P_WHY == "$LIMIT_FLAG" ]] || die "N=$n d=$d fails for another reason: $P_WHY"
        lo=$hi hi=$((hi * 2))
    done
    L_TIME=$P_TIME
    while ((hi - lo > 1)); do
        local tol
        tol=$(awk -v h="$hi" -v p="$PRECISION" 'BEGIN { printf "%d", h * p }')
        ((hi - lo <= tol)) && break
        mid=$(((lo + hi) / 2))
        probe "$n" "$d" "$h" "$mid"
        log "$LIMIT_FLAG=$mid: $([[ $P_OK == 1 ]] && echo ok || echo "FAIL ($P_WHY)") ${P_TIME}s"
        if [[ $P_OK == 1 ]]; then hi=$mid L_TIME=$P_TIME; else lo=$mid; fi
    done
    L_MIN=$hi L_LO=$lo
}

what() {
    if ((STAGED)); then echo "staged::self_attention"
    elif ((HEADS > 0)); then echo "multi_head_attention<$HEADS>"
    else echo "self_attention"; fi
}

# reach FILE: compile one proof of tests/compile under /usr/bin/time -v; prints a table row.
reach() {
    local file=$1 tests=$here/../tests/compile load rc=0
    load=$(cut -d ' ' -f 1-3 /proc/loadavg)
    timeout "$TIMEOUT" /usr/bin/time -v -o "$TMP/time" "$CXX" -std=c++20 -fsyntax-only -I"$INCLUDE" -I"$tests" \
        "${EXTRA[@]}" "$tests/$file" >"$TMP/out" 2>&1 || rc=$?
    local wall cpu kib
    wall=$(awk -F': ' '/Elapsed \(wall clock\)/ { n = split($2, p, ":"); s = 0; for (i = 1; i <= n; i++) s = s * 60 + p[i]; print s }' "$TMP/time")
    cpu=$(awk -F': ' '/User time/ { u = $2 } /System time/ { s = $2 } END { printf "%.1f", u + s }' "$TMP/time")
    kib=$(awk -F': ' '/Maximum resident/ { print $2 }' "$TMP/time")
    local mib=$(((${kib:-0} + 1023) / 1024)) verdict
    if ((rc != 0)); then verdict="FAILS: $(grep -m 1 -E 'error|timeout' "$TMP/out" | cut -c 1-100)"; REACH_RC=1
    elif awk -v w="$wall" -v m="$mib" -v W="$MAX_SECONDS" -v M="$MAX_MIB" 'BEGIN { exit !(w <= W && m <= M) }'; then verdict="proves, within budget"
    else verdict="proves, OVER BUDGET"; REACH_RC=1; fi
    echo "| $VERSION | $file | ${wall:-?} | $cpu | $mib | $load | $verdict |"
}

case $MODE in
sweep)
    if ((${#EXTRA[@]})); then limits="default limits ($LIMIT_FLAG=$DEFAULT_LIMIT) unless overridden by: ${EXTRA[*]}"
    else limits="default limits ($LIMIT_FLAG=$DEFAULT_LIMIT)"; fi
    echo "### $VERSION: $(what), $limits"
    echo
    echo "| shape | largest that compiles | compile time (s) | peak RSS (MiB) | one step larger fails on |"
    echo "|---|---|---|---|---|"
    for d in $DS; do
        ((HEADS > 0 && d % HEADS != 0)) && continue
        log "max N for d=$d"
        max_size N "$d"
        echo "| d = $d | N = $M_MAX | $M_TIME | $M_RSS | $M_WHY |"
    done
    for n in $NS; do
        log "max d for N=$n"
        max_size d "$n"
        echo "| N = $n | d = $M_MAX | $M_TIME | $M_RSS | $M_WHY |"
    done
    ;;
--count)
    n=${2:?--count N D | --count tutorial}
    if [[ $n == tutorial ]]; then d=0 label="worked example (3x4 inputs, 4x3 weights)"
    else d=${3:?--count N D}; label="$(what) N=$n d=$d"; fi
    min_limit "$n" "$d" "$HEADS"
    exact=$([[ $((L_MIN - L_LO)) == 1 ]] && echo "exact" || echo "within $L_LO..$L_MIN")
    echo "| $VERSION | $label | $LIMIT_FLAG=$L_MIN ($exact) | $L_TIME s |"
    ;;
--time)
    n=${2:?--time N D [LIMIT]} d=${3:?--time N D [LIMIT]} limit=${4:-}
    probe "$n" "$d" "$HEADS" "$limit"
    echo "| $VERSION | $(what) N=$n d=$d | $([[ -n $limit ]] && echo "$LIMIT_FLAG=$limit" || echo "default limits") | $([[ $P_OK == 1 ]] && echo compiles || echo "fails: $P_WHY") | $P_TIME s | $P_RSS MiB |"
    ;;
--reach)
    MAX_SECONDS=${QKV_MAX_SECONDS:-60} MAX_MIB=${QKV_MAX_MIB:-3072} REACH_RC=0
    echo "| compiler | proof | wall-clock (s) | CPU (s) | peak RSS (MiB) | load average before | result (budget ${MAX_SECONDS} s, ${MAX_MIB} MiB) |"
    echo "|---|---|---|---|---|---|---|"
    reach reach_static.cpp
    reach reach_staged_256.cpp
    exit "$REACH_RC"
    ;;
*) die "unknown mode $MODE" ;;
esac
