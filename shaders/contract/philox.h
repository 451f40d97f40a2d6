// The host–shader contract of attention dropout (qkv/dropout.hpp, where the rule is defined):
// Philox4x32-10's constants and the counter layout, for a shader that draws the same mask as the
// constexpr core and the CPU reference. See common.h for the convention.
//
// For query row r = (b·Hq + h)·L + i and key j, with c = offset + j / PHILOX_KEYS_PER_COUNTER
// (64-bit, mod 2^64) and the call's 64-bit seed:
//   counter = uvec4(lo(c), hi(c), lo(r), hi(r)),  key = uvec2(lo(seed), hi(seed))
//   10 rounds; before every round but the first, key += uvec2(PHILOX_W0, PHILOX_W1); a round is
//     umulExtended(PHILOX_M0, counter.x, hi0, lo0); umulExtended(PHILOX_M1, counter.z, hi1, lo1);
//     counter = uvec4(hi1 ^ counter.y ^ key.x, lo1, hi0 ^ counter.w ^ key.y, lo0)
//   x = counter[j % PHILOX_KEYS_PER_COUNTER]; the weight is kept when x >= the call's threshold
//   ceil(p·2^32) (qkv::dropout_threshold; below 2^32 for any float p < 1) and then scaled by
//   1 / (1 - p).
#ifndef QKV_CONTRACT_PHILOX_H
#define QKV_CONTRACT_PHILOX_H

#include "common.h"

QKV_CONTRACT_BEGIN

QKV_CONST uint PHILOX_M0 = 0xD2511F53u;
QKV_CONST uint PHILOX_M1 = 0xCD9E8D57u;
QKV_CONST uint PHILOX_W0 = 0x9E3779B9u;
QKV_CONST uint PHILOX_W1 = 0xBB67AE85u;
QKV_CONST uint PHILOX_ROUNDS = 10u;
QKV_CONST uint PHILOX_KEYS_PER_COUNTER = 4u;

QKV_CONTRACT_END

#ifdef __cplusplus
#include "qkv/dropout.hpp"
#include "qkv/philox.hpp"
QKV_CONTRACT_CHECK(qkv::contract::PHILOX_M0 == qkv::philox_constants::m0 &&
                   qkv::contract::PHILOX_M1 == qkv::philox_constants::m1)
QKV_CONTRACT_CHECK(qkv::contract::PHILOX_W0 == qkv::philox_constants::w0 &&
                   qkv::contract::PHILOX_W1 == qkv::philox_constants::w1)
QKV_CONTRACT_CHECK(qkv::contract::PHILOX_ROUNDS == qkv::philox_constants::rounds &&
                   qkv::contract::PHILOX_KEYS_PER_COUNTER == qkv::dropout_keys_per_counter)
#endif

#endif
