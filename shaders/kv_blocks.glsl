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
