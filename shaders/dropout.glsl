// Attention dropout's mask on the device: the rule qkv/dropout.hpp defines for every path, with
// Philox4x32-10's constants from contract/philox.h (which checks them against the core's when C++
// includes it), so a kernel drops exactly the weights the constexpr core and the CPU reference drop.
// tests/sdpa_backward_vulkan_test.cpp compares the device's masks with the CPU's bit for bit.
//
// For query row r = (b·Hq + h)·L + i (below 2^32: the plans keep every tensor's elements below
// 2^32) and key j: counter (lo(c), hi(c), r, 0) with c = offset + ⌊j / 4⌋ (64-bit), key (lo(seed),
// hi(seed)); x_ij = word j mod 4 of the result; kept when x_ij >= the threshold ⌈p·2^32⌉.
//
// Include after contract/score.h (the seed, offset and threshold are score_params') and
// contract/philox.h.

/// Philox4x32 with PHILOX_ROUNDS rounds (unrolled: no loop for llvmpipe's iteration limit).
uvec4 philox4x32(uvec4 ctr, uvec2 key) {
    [[unroll]] for (uint round = 0u; round < PHILOX_ROUNDS; ++round) {
        if (round != 0u) key += uvec2(PHILOX_W0, PHILOX_W1);
        uint hi0, lo0, hi1, lo1;
        umulExtended(PHILOX_M0, ctr.x, hi0, lo0);
        umulExtended(PHILOX_M1, ctr.z, hi1, lo1);
        ctr = uvec4(hi1 ^ ctr.y ^ key.x, lo1, hi0 ^ ctr.w ^ key.y, lo0);
    }
    return ctr;
}

/// The draws of keys 4·quad .. 4·quad + 3 of row `row` (one Philox evaluation).
uvec4 dropout_draws(uint row, uint quad, score_params sp) {
    uint carry;
    const uint lo = uaddCarry(sp.dropout_offset_lo, quad, carry);
    return philox4x32(uvec4(lo, sp.dropout_offset_hi + carry, row, 0u), uvec2(sp.dropout_seed_lo, sp.dropout_seed_hi));
}

/// Whether key j of row `row` is kept.
bool dropout_keeps(uint row, uint j, score_params sp) {
    return dropout_draws(row, j / PHILOX_KEYS_PER_COUNTER, sp)[j % PHILOX_KEYS_PER_COUNTER] >= sp.dropout_threshold;
}
