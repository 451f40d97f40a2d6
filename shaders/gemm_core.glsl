// Matrix product shared by the project, scores and aggregate stages, in two families.
//
// GPU family (default): each workgroup computes a BM x BN tile of C = A · B for one (batch, head)
// pair; each invocation keeps TM x TN accumulators in registers; BK columns of A and BK rows of B
// at a time stream through shared memory; the workgroup size is (BM/TM)·(BN/TN).
//
// CPU family (QKV_GEMM_CPU), for llvmpipe-like drivers that run a workgroup on one CPU thread with
// the invocations as the lanes of one SIMD vector: a workgroup is WG invocations (the subgroup
// size, queried by the host), with no shared memory and no barriers. Lane l owns the columns
// col0 + l + WG·j (j < TN) of BM rows. Per k, every lane gathers TN values of B (a lane-dependent
// address) and reads BM values of A at addresses that depend only on the workgroup and the loop
// counter, which the driver loads once and broadcasts; then BM·TN vector multiply-adds. The k loop
// is unrolled BK times (a constant), so one loop iteration does BK steps.
//
// Tile sizes are specialization constants chosen per device by the host
// (src/plan/attention_plan.cpp, through choose_gemm_tiles in src/kernels/gemm_tiles.cpp). Shapes
// and strides come in push constants, so one pipeline serves every shape. A long K is split over
// several dispatches by the host (CPU drivers end every loop after 65,535 iterations): each covers
// K columns from k_begin; GEMM_FLAG_ACCUMULATE adds to C, GEMM_FLAG_PARTIAL says more columns follow, so the
// stage's final touches (bias, scale, mask) wait for the last dispatch.
//
// The including shader defines, before including this file:
//   float load_a(uint base, uint row, uint k)   element (row, k) of A at element offset `base`
//   float load_b(uint base, uint k, uint col)
//   void  store_c(uint base, uint row, uint col, float value)   honours GEMM_FLAG_ACCUMULATE / GEMM_FLAG_PARTIAL
//   bool  tile_is_masked(uint row0, uint col0)   true: the whole tile is masked (causal skip)
//   uint  k_limit(uint row0)                     how far along this dispatch's K this row tile needs to go
// and may define QKV_SKIP_ZERO_A (zero A elements are skipped, so 0·NaN never reaches C)
// and may use the push constants (pc, contract/gemm.h).
#extension GL_EXT_control_flow_attributes : enable

#include "contract/gemm.h"

layout(local_size_x_id = GEMM_SPEC_WORKGROUP, local_size_y = 1, local_size_z = 1) in;
layout(constant_id = GEMM_SPEC_BM) const uint BM = 64;
layout(constant_id = GEMM_SPEC_BN) const uint BN = 64;
layout(constant_id = GEMM_SPEC_BK) const uint BK = 16;
layout(constant_id = GEMM_SPEC_TM) const uint TM = 4;
layout(constant_id = GEMM_SPEC_TN) const uint TN = 4;

layout(push_constant) uniform Push { gemm_push pc; };

float load_a(uint base, uint row, uint k);
float load_b(uint base, uint k, uint col);
void store_c(uint base, uint row, uint col, float value);
bool tile_is_masked(uint row0, uint col0);
uint k_limit(uint row0);

#ifdef QKV_SKIP_ZERO_A
#include "values.glsl"
// A is a probability (shaders/values.glsl): a masked weight (-0.0) contributes nothing, not
// 0·NaN; a weight that underflowed to +0.0 keeps B's infinities and NaNs.
#define QKV_MADD(a, b, acc) ((a) != 0.0 ? fma((a), (b), (acc)) : (acc) + (is_masked_weight(a) ? 0.0 : nonfinite_part(b)))
#else
#define QKV_MADD(a, b, acc) fma((a), (b), (acc))
#endif

#if defined(QKV_GEMM_CPU) && defined(QKV_GEMM_CPU_ROWS) && defined(QKV_GEMM_TEXELS)

// CPU family, rows variant through texel buffers (the Q|K|V projection, and the staged scores and
// aggregation, where the device offers the texel formats): as below, lane l owns the rows
// row0 + l + WG·i (i < TM) and every lane the same TN columns, but A and B are read four elements
// at a time with texelFetch, which llvmpipe serves far more cheaply than a storage-buffer load at
// a lane-varying address. Per texel step (4 values of k) a lane fetches TM texels of A (its rows)
// and the step's texels of B (the same for every lane), then 4·TM·TN multiply-adds.
// Inside the k loop llvmpipe fetches a lane-uniform texel once per lane (docs/devices.md). With
// QKV_SHUFFLE (the host's choice where the workgroup is one subgroup with shuffles, cpu_shuffle in
// src/kernels/gemm_tiles.cpp) lane l fetches texel l of the step's B texels (then l + WG, ...),
// one gather for WG texels, and subgroupShuffle(x, t), t a constant once unrolled, hands texel t
// to every lane; and each accumulator takes its 4 multiply-adds of the step in a row, so that
// where the accumulators outnumber the registers each is loaded and stored once per step, not 4
// times. At N = 4096, d_in = d = 64 on lavapipe those two took the projection from 2.6 to 1.6 ms.
//
// B comes in two layouts:
//   - rows (projection: W; aggregation: V): B's row k holds the columns, a texel 4 columns of one
//     k; the step's B texels are 4 rows of k x TN/4 column groups; acc[i][j] is a vec4 of columns;
//   - QKV_GEMM_B_KEYS (scores: B = Kᵀ): column n of B is row n of K (b_cs apart, b_rs = 1), a
//     texel 4 values of k of one key; the step's B texels are the TN keys' texels; acc[i][n] a
//     float, each step adding the dot product of two texels (needs QKV_SHUFFLE).
// tile_is_masked() (a causal tile of the scores) and k_limit() (a causal tile of the aggregation)
// empty or shorten the k loop rather than branch around it: a branch would put the stores under
// an execution mask. With QKV_WIDE_STORE the including shader stores eight columns at a time
// (TN % 8 == 0), else four (store_c4 handles N % 4 != 0 itself where VEC_STORE says so).
// The including shader defines
//   vec4 load_a4(uint texel), vec4 load_b4(uint texel)
// The host guarantees (src/kernels/gemm_tiles.cpp, src/plan/attention_plan.cpp): K, every A and B offset,
// a_rs, and b_rs (rows) or b_cs (keys) are multiples of 4; rows: b_cs = 1, N a multiple of 4;
// TN and BK multiples of 4.
vec4 load_a4(uint texel);
vec4 load_b4(uint texel);
#ifdef QKV_WIDE_STORE
void store_c8(uint base, uint row, uint col, vec4 lo, vec4 hi);  // columns col..col+7 of row (TN % 8 == 0)
#else
void store_c4(uint base, uint row, uint col, vec4 value);  // columns col..col+3 of row
#endif
#if defined(QKV_GEMM_B_KEYS) && !defined(QKV_SHUFFLE)
#error "QKV_GEMM_B_KEYS needs QKV_SHUFFLE"
#endif

layout(constant_id = GEMM_SPEC_EXACT) const uint EXACT = 0;  // 1: no bounds checks (contract/gemm.h)
// 1: an exact 0 of A adds nothing, not 0·NaN (the aggregation, where V may hold NaN or inf).
layout(constant_id = GEMM_SPEC_SKIP_ZERO) const uint SKIP_ZERO = 0;

const uint WG = gl_WorkGroupSize.x;
const uint TN4 = TN / 4;
const uint BK4 = BK / 4;

vec4 madd4(float a, vec4 b, vec4 acc) {
#ifdef QKV_SKIP_ZERO_A
    if (SKIP_ZERO != 0u && a == 0.0) return acc + weighted(a, b);  // values.glsl
#endif
    return fma(vec4(a), b, acc);
}

void gemm_main() {
    const uint lane = gl_LocalInvocationID.x;
    const uint row0 = (gl_WorkGroupID.x + pc.group_x) * BM;
    const uint col0 = (gl_WorkGroupID.y + pc.group_y) * BN;
    const uint z = gl_WorkGroupID.z + pc.group_z;
    const uint batch = z / pc.heads, head = z % pc.heads;
    const uint a_base = pc.a_off + batch * pc.a_bs + head * pc.a_hs;
    const uint b_base = pc.b_off + batch * pc.b_bs + head * pc.b_hs;
    const uint c_base = pc.c_off + batch * pc.c_bs + head * pc.c_hs;
    // No early return where EXACT: a returned invocation leaves every later store under a mask.
    if (EXACT == 0u && (row0 >= pc.M || col0 >= pc.N)) return;

    // Rows past M read the last row (in bounds) and are never stored; columns past N likewise.
    uint arow[TM];  // texel index of (row, k = 0)
    [[unroll]] for (uint i = 0; i < TM; ++i) arow[i] = (a_base + min(row0 + lane + i * WG, pc.M - 1u) * pc.a_rs) / 4u;
    // Texel steps of this tile: none for a tile the masks cover, up to the last k that can count.
    const uint k4max = tile_is_masked(row0, col0) ? 0u : (k_limit(row0) + 3u) / 4u;
#ifdef QKV_GEMM_B_KEYS
    const uint BR = (TN + WG - 1u) / WG;  // gathers per step
    uint bkey[BR];                        // texel index of (k = 0) of this lane's keys col0 + r·WG + lane
    [[unroll]] for (uint r = 0; r < BR; ++r)
        bkey[r] = (b_base + min(col0 + r * WG + gl_SubgroupInvocationID, pc.N - 1u) * pc.b_cs) / 4u;
    float acc[TM * TN];
    [[unroll]] for (uint i = 0; i < TM * TN; ++i) acc[i] = 0.0;
    for (uint k4 = 0; k4 < k4max; ++k4) {
        vec4 a[TM];
        [[unroll]] for (uint i = 0; i < TM; ++i) a[i] = load_a4(arow[i] + k4);
        vec4 fetched[BR];
        [[unroll]] for (uint r = 0; r < BR; ++r) fetched[r] = load_b4(bkey[r] + k4);
        [[unroll]] for (uint j = 0; j < TN; ++j) {
            const vec4 b = subgroupShuffle(fetched[j / WG], j % WG);
            [[unroll]] for (uint i = 0; i < TM; ++i) {
                float c = acc[i * TN + j];
                c = fma(a[i].x, b.x, c);
                c = fma(a[i].y, b.y, c);
                c = fma(a[i].z, b.z, c);
                acc[i * TN + j] = fma(a[i].w, b.w, c);
            }
        }
    }
#define QKV_ACC4(i, j) vec4(acc[(i) * TN + 4u * (j)], acc[(i) * TN + 4u * (j) + 1u], acc[(i) * TN + 4u * (j) + 2u], acc[(i) * TN + 4u * (j) + 3u])
#else
    uint bcol[TN4];  // texel index of (k = 0, column group j)
    [[unroll]] for (uint j = 0; j < TN4; ++j) bcol[j] = (b_base + min(col0 + 4u * j, pc.N - 4u)) / 4u;
    const uint b_rs4 = pc.b_rs / 4u;

    vec4 acc[TM * TN4];
    [[unroll]] for (uint i = 0; i < TM * TN4; ++i) acc[i] = vec4(0.0);

#ifdef QKV_SHUFFLE
    const uint BT = 4u * TN4;             // B texels per texel step of k: 4 rows of k x TN4 column groups
    const uint BR = (BT + WG - 1u) / WG;  // gathers per step
    uint boff[BR];                        // this lane's B texels, t = r·WG + lane (the last one past BT)
    [[unroll]] for (uint r = 0; r < BR; ++r) {
        const uint t = min(r * WG + gl_SubgroupInvocationID, BT - 1u);
        boff[r] = bcol[t % TN4] + (t / TN4) * b_rs4;
    }
#endif
    for (uint k4 = 0; k4 < k4max; k4 += BK4) {
        [[unroll]] for (uint u = 0; u < BK4; ++u) {
            vec4 a[TM];
            [[unroll]] for (uint i = 0; i < TM; ++i) a[i] = load_a4(arow[i] + k4 + u);
#ifdef QKV_SHUFFLE
            vec4 fetched[BR];
            [[unroll]] for (uint r = 0; r < BR; ++r) fetched[r] = load_b4(boff[r] + 4u * (k4 + u) * b_rs4);
            [[unroll]] for (uint j = 0; j < TN4; ++j) {
                vec4 b[4];
                [[unroll]] for (uint kk = 0; kk < 4; ++kk) {
                    const uint t = kk * TN4 + j;
                    b[kk] = subgroupShuffle(fetched[t / WG], t % WG);
                }
                [[unroll]] for (uint i = 0; i < TM; ++i) {
                    vec4 c = acc[i * TN4 + j];
                    [[unroll]] for (uint kk = 0; kk < 4; ++kk) c = madd4(a[i][kk], b[kk], c);
                    acc[i * TN4 + j] = c;
                }
            }
#else
            [[unroll]] for (uint kk = 0; kk < 4; ++kk) {
                const uint brow = (4u * (k4 + u) + kk) * b_rs4;
                [[unroll]] for (uint j = 0; j < TN4; ++j) {
                    const vec4 b = load_b4(bcol[j] + brow);
                    [[unroll]] for (uint i = 0; i < TM; ++i) acc[i * TN4 + j] = madd4(a[i][kk], b, acc[i * TN4 + j]);
                }
            }
#endif
        }
    }
#define QKV_ACC4(i, j) acc[(i) * TN4 + (j)]
#endif

    [[unroll]] for (uint i = 0; i < TM; ++i) {
#ifdef QKV_WIDE_STORE
        [[unroll]] for (uint j = 0; j < TN4; j += 2u) {
            const uint r = row0 + lane + i * WG, c = col0 + 4u * j;
            if (EXACT != 0u || (r < pc.M && c < pc.N)) store_c8(c_base, r, c, QKV_ACC4(i, j), QKV_ACC4(i, j + 1u));
        }
#else
        [[unroll]] for (uint j = 0; j < TN4; ++j) {
            const uint r = row0 + lane + i * WG, c = col0 + 4u * j;
            if (EXACT != 0u || (r < pc.M && c < pc.N)) store_c4(c_base, r, c, QKV_ACC4(i, j));
        }
#endif
    }
}

#elif defined(QKV_GEMM_CPU) && defined(QKV_GEMM_CPU_ROWS)

// CPU family, rows variant (the projection): lane l owns the rows row0 + l + WG·i (i < TM) and
// every lane the same BN = TN columns col0 + j. Per k, each lane gathers TM values of A (one per
// row it owns) and reads TN values of B at addresses that depend only on the workgroup and the
// loop counter (loaded once, broadcast), then TM·TN vector multiply-adds: the gathered operand is
// reused TN times. BM = WG·TM.
const uint WG = gl_WorkGroupSize.x;

void gemm_main() {
    const uint lane = gl_LocalInvocationID.x;
    const uint row0 = (gl_WorkGroupID.x + pc.group_x) * BM;
    const uint col0 = (gl_WorkGroupID.y + pc.group_y) * BN;
    const uint z = gl_WorkGroupID.z + pc.group_z;
    const uint batch = z / pc.heads, head = z % pc.heads;
    const uint a_base = pc.a_off + batch * pc.a_bs + head * pc.a_hs;
    const uint b_base = pc.b_off + batch * pc.b_bs + head * pc.b_hs;
    const uint c_base = pc.c_off + batch * pc.c_bs + head * pc.c_hs;
    if (row0 >= pc.M || col0 >= pc.N) return;

    // Rows past M read the last row (in bounds) and are never stored; columns past N likewise.
    uint row[TM];
    [[unroll]] for (uint i = 0; i < TM; ++i) row[i] = min(row0 + lane + i * WG, pc.M - 1u);
    uint col[TN];
    [[unroll]] for (uint j = 0; j < TN; ++j) col[j] = min(col0 + j, pc.N - 1u);

    float acc[TM * TN];
    [[unroll]] for (uint i = 0; i < TM * TN; ++i) acc[i] = 0.0;

    if (!tile_is_masked(row0, col0)) {
        const uint kmax = k_limit(row0);
        uint k = 0;
        for (; k + BK <= kmax; k += BK) {
            [[unroll]] for (uint u = 0; u < BK; ++u) {
                float a[TM];
                [[unroll]] for (uint i = 0; i < TM; ++i) a[i] = load_a(a_base, row[i], k + u);
                [[unroll]] for (uint j = 0; j < TN; ++j) {
                    const float b = load_b(b_base, k + u, col[j]);
                    [[unroll]] for (uint i = 0; i < TM; ++i) acc[i * TN + j] = QKV_MADD(a[i], b, acc[i * TN + j]);
                }
            }
        }
        for (; k < kmax; ++k) {  // the last K % BK steps
            float a[TM];
            [[unroll]] for (uint i = 0; i < TM; ++i) a[i] = load_a(a_base, row[i], k);
            [[unroll]] for (uint j = 0; j < TN; ++j) {
                const float b = load_b(b_base, k, col[j]);
                [[unroll]] for (uint i = 0; i < TM; ++i) acc[i * TN + j] = QKV_MADD(a[i], b, acc[i * TN + j]);
            }
        }
    }

    [[unroll]] for (uint i = 0; i < TM; ++i) {
        [[unroll]] for (uint j = 0; j < TN; ++j) {
            const uint r = row0 + lane + i * WG, c = col0 + j;
            if (r < pc.M && c < pc.N) store_c(c_base, r, c, acc[i * TN + j]);
        }
    }
}

#elif defined(QKV_GEMM_CPU)

const uint WG = gl_WorkGroupSize.x;

void gemm_main() {
    const uint lane = gl_LocalInvocationID.x;
    const uint row0 = (gl_WorkGroupID.x + pc.group_x) * BM;
    const uint col0 = (gl_WorkGroupID.y + pc.group_y) * BN;
    const uint z = gl_WorkGroupID.z + pc.group_z;
    const uint batch = z / pc.heads, head = z % pc.heads;
    const uint a_base = pc.a_off + batch * pc.a_bs + head * pc.a_hs;
    const uint b_base = pc.b_off + batch * pc.b_bs + head * pc.b_hs;
    const uint c_base = pc.c_off + batch * pc.c_bs + head * pc.c_hs;
    if (row0 >= pc.M || col0 >= pc.N) return;

    // Columns past N read the last column (in bounds) and are never stored; rows past M likewise.
    uint col[TN];
    [[unroll]] for (uint j = 0; j < TN; ++j) col[j] = min(col0 + lane + j * WG, pc.N - 1u);
    uint row[BM];
    [[unroll]] for (uint i = 0; i < BM; ++i) row[i] = min(row0 + i, pc.M - 1u);

    float acc[BM * TN];
    [[unroll]] for (uint i = 0; i < BM * TN; ++i) acc[i] = 0.0;

    if (!tile_is_masked(row0, col0)) {
        const uint kmax = k_limit(row0);
        uint k = 0;
        for (; k + BK <= kmax; k += BK) {
            [[unroll]] for (uint u = 0; u < BK; ++u) {
                float b[TN];
                [[unroll]] for (uint j = 0; j < TN; ++j) b[j] = load_b(b_base, k + u, col[j]);
                [[unroll]] for (uint i = 0; i < BM; ++i) {
                    const float a = load_a(a_base, row[i], k + u);
                    [[unroll]] for (uint j = 0; j < TN; ++j) acc[i * TN + j] = QKV_MADD(a, b[j], acc[i * TN + j]);
                }
            }
        }
        for (; k < kmax; ++k) {  // the last K % BK steps
            float b[TN];
            [[unroll]] for (uint j = 0; j < TN; ++j) b[j] = load_b(b_base, k, col[j]);
            [[unroll]] for (uint i = 0; i < BM; ++i) {
                const float a = load_a(a_base, row[i], k);
                [[unroll]] for (uint j = 0; j < TN; ++j) acc[i * TN + j] = QKV_MADD(a, b[j], acc[i * TN + j]);
            }
        }
    }

    [[unroll]] for (uint i = 0; i < BM; ++i) {
        [[unroll]] for (uint j = 0; j < TN; ++j) {
            const uint r = row0 + i, c = col0 + lane + j * WG;
            if (r < pc.M && c < pc.N) store_c(c_base, r, c, acc[i * TN + j]);
        }
    }
}

#else  // GPU family

const uint WG_COLS = BN / TN;
const uint WG_SIZE = (BM / TM) * (BN / TN);

shared float tile_a[BK * BM];  // [k][row]
shared float tile_b[BK * BN];  // [k][col]

void gemm_main() {
    const uint tid = gl_LocalInvocationID.x;
    const uint row0 = (gl_WorkGroupID.x + pc.group_x) * BM;
    const uint col0 = (gl_WorkGroupID.y + pc.group_y) * BN;
    const uint z = gl_WorkGroupID.z + pc.group_z;
    const uint batch = z / pc.heads, head = z % pc.heads;
    const uint a_base = pc.a_off + batch * pc.a_bs + head * pc.a_hs;
    const uint b_base = pc.b_off + batch * pc.b_bs + head * pc.b_hs;
    const uint c_base = pc.c_off + batch * pc.c_bs + head * pc.c_hs;
    const uint tr = tid / WG_COLS, tc = tid % WG_COLS;

    if (row0 >= pc.M || col0 >= pc.N) return;  // uniform per workgroup: no barrier is skipped unevenly

    if (tile_is_masked(row0, col0)) {
        [[unroll]] for (uint i = 0; i < TM; ++i) {
            [[unroll]] for (uint j = 0; j < TN; ++j) {
                const uint r = row0 + tr + i * (BM / TM), c = col0 + tc + j * WG_COLS;
                if (r < pc.M && c < pc.N) store_c(c_base, r, c, 0.0);
            }
        }
        return;
    }

    float acc[TM * TN];
    [[unroll]] for (uint i = 0; i < TM * TN; ++i) acc[i] = 0.0;

    const uint kmax = k_limit(row0);
    for (uint k0 = 0; k0 < kmax; k0 += BK) {
        // A tile: consecutive invocations read consecutive k (A's columns are contiguous).
        for (uint idx = tid; idx < BM * BK; idx += WG_SIZE) {
            const uint r = idx / BK, k = idx % BK;
            const uint gr = row0 + r, gk = k0 + k;
            tile_a[k * BM + r] = (gr < pc.M && gk < kmax) ? load_a(a_base, gr, gk) : 0.0;
        }
        // B tile: walk along whichever of B's dimensions is contiguous.
        if (pc.b_cs == 1) {
            for (uint idx = tid; idx < BK * BN; idx += WG_SIZE) {
                const uint k = idx / BN, c = idx % BN;
                const uint gk = k0 + k, gc = col0 + c;
                tile_b[k * BN + c] = (gk < kmax && gc < pc.N) ? load_b(b_base, gk, gc) : 0.0;
            }
        } else {
            for (uint idx = tid; idx < BK * BN; idx += WG_SIZE) {
                const uint c = idx / BK, k = idx % BK;
                const uint gk = k0 + k, gc = col0 + c;
                tile_b[k * BN + c] = (gk < kmax && gc < pc.N) ? load_b(b_base, gk, gc) : 0.0;
            }
        }
        barrier();
        [[unroll]] for (uint k = 0; k < BK; ++k) {
            float a[TM];
            float b[TN];
            [[unroll]] for (uint i = 0; i < TM; ++i) a[i] = tile_a[k * BM + tr + i * (BM / TM)];
            [[unroll]] for (uint j = 0; j < TN; ++j) b[j] = tile_b[k * BN + tc + j * WG_COLS];
            [[unroll]] for (uint i = 0; i < TM; ++i) {
                [[unroll]] for (uint j = 0; j < TN; ++j) acc[i * TN + j] = QKV_MADD(a[i], b[j], acc[i * TN + j]);
            }
        }
        barrier();
    }

    [[unroll]] for (uint i = 0; i < TM; ++i) {
        [[unroll]] for (uint j = 0; j < TN; ++j) {
            const uint r = row0 + tr + i * (BM / TM), c = col0 + tc + j * WG_COLS;
            if (r < pc.M && c < pc.N) store_c(c_base, r, c, acc[i * TN + j]);
        }
    }
}

#endif
