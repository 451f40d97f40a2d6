// Reading ggml's quantized K/V blocks (qkv/runtime/element_type.hpp) from a storage buffer of
// 32-bit words, four values (a texel) at a time, in float32:
//
//   q8_0  34 bytes a block: d (float16), then 32 int8 quants;             x = q·d
//   q4_0  18 bytes a block: d (float16), then 16 bytes of 4-bit quants,   x = (q - 8)·d
//         element j in the low nibble of byte j, element j + 16 in the high one
//
// Blocks and rows start at even byte offsets (34 and 18 are even), so every 16-bit scale sits in
// one word and every 4 quant bytes of a texel (q8_0) or 4 nibble bytes (q4_0) span at most two
// words. Bytes are little-endian, as the host writes them.
//
// QKV_BLOCK_TEXEL(name, words) defines vec4 name(uint row_byte, uint c, bool q8): the texel c
// (values 4c .. 4c + 3) of the row of blocks starting at byte row_byte of the buffer `words`.
// QKV_BLOCK_TEXELS(name, words) defines void name(uint row_byte, uint b, bool q8, out vec4 t[8]):
// the 8 texels of block b of that row, from one pass over its words (9 loads for q8_0, 5 for
// q4_0, the scale read once) where 8 calls of the first would make 24 or 16.

#define QKV_BLOCK_TEXEL(name, words)                                                            \
    uint name##_word_at(uint o) { /* 4 bytes from the even byte offset o */                    \
        const uint w = words[o >> 2u];                                                         \
        return (o & 2u) == 0u ? w : (w >> 16u) | (words[(o >> 2u) + 1u] << 16u);               \
    }                                                                                          \
    vec4 name(uint row_byte, uint c, bool q8) {                                                \
        const uint block_bytes = q8 ? 34u : 18u;                                               \
        const uint at = row_byte + (c >> 3u) * block_bytes; /* 8 texels per block */           \
        const uint dw = words[at >> 2u];                                                       \
        const float d = unpackHalf2x16((at & 2u) != 0u ? dw >> 16u : dw).x;                    \
        const uint within = (c & 7u) * 4u; /* the texel's first value in its block */          \
        if (q8) {                                                                              \
            const int q = int(name##_word_at(at + 2u + within));                               \
            return vec4(bitfieldExtract(q, 0, 8), bitfieldExtract(q, 8, 8), bitfieldExtract(q, 16, 8), \
                        bitfieldExtract(q, 24, 8)) * d;                                        \
        }                                                                                      \
        const uint q = name##_word_at(at + 2u + (within & 15u)) >> (within >= 16u ? 4u : 0u);  \
        return (vec4(q & 15u, (q >> 8u) & 15u, (q >> 16u) & 15u, (q >> 24u) & 15u) - 8.0) * d; \
    }

#define QKV_BLOCK_TEXELS(name, words)                                                           \
    void name(uint row_byte, uint b, bool q8, out vec4 t[8]) {                                 \
        const uint at = row_byte + b * (q8 ? 34u : 18u);                                       \
        const uint a = at >> 2u;                                                               \
        const bool odd = (at & 2u) != 0u; /* the scale in the high half of word a */           \
        uint w[9];                                                                             \
        [[unroll]] for (uint i = 0; i < 9u; ++i) w[i] = q8 || i < 5u ? words[a + i] : 0u;      \
        const float d = unpackHalf2x16(odd ? w[0] >> 16u : w[0]).x;                            \
        uint qw[8]; /* the quant bytes, 4 a word */                                            \
        [[unroll]] for (uint i = 0; i < 8u; ++i) qw[i] = odd ? w[i + 1u] : (w[i] >> 16u) | (w[i + 1u] << 16u); \
        [[unroll]] for (uint i = 0; i < 8u; ++i) {                                             \
            if (q8) { /* each byte to the top, then an arithmetic shift back: its sign */      \
                t[i] = vec4((ivec4(qw[i]) << ivec4(24, 16, 8, 0)) >> 24) * d;                  \
            } else { /* texels 0..3 the low nibbles of the 16 bytes, 4..7 the high ones */     \
                const uint q = qw[i & 3u] >> (i >= 4u ? 4u : 0u);                              \
                t[i] = (vec4(q & 15u, (q >> 8u) & 15u, (q >> 16u) & 15u, (q >> 24u) & 15u) - 8.0) * d; \
            }                                                                                  \
        }                                                                                      \
    }
