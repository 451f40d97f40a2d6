#version 450
#extension GL_GOOGLE_include_directive : require
// A float16 or quantized (ggml's q8_0 / q4_0) tensor read as float32, one invocation per value:
// the values exactly as qkv::dequantize gives them (a float16 is exact in float32; a quant times
// its block's scale d is one float32 product, q·d for q8_0 and (q - 8)·d for q4_0). The source
// is read as 32-bit words (bytes little-endian), so no 16-bit storage is needed; every row and
// block starts at an even byte (34 and 18 are even), so a float16 never straddles two words.
#include "contract/tensor.h"

layout(local_size_x = TENSOR_WIDEN_WORKGROUP, local_size_y = 1, local_size_z = 1) in;
layout(std430, binding = TENSOR_WIDEN_BINDING_SRC) readonly buffer Src { uint words[]; };
layout(std430, binding = TENSOR_WIDEN_BINDING_DST) writeonly buffer Dst { float dst[]; };
layout(push_constant) uniform Push { tensor_widen_push pc; };

uint byte_at(uint b) { return (words[b >> 2u] >> (8u * (b & 3u))) & 0xffu; }

float half_at(uint b) {  // b even
    const uint w = words[b >> 2u];
    return unpackHalf2x16((b & 2u) != 0u ? w >> 16u : w).x;
}

void main() {
    const uint i = (gl_WorkGroupID.x + pc.group_x) * TENSOR_WIDEN_WORKGROUP + gl_LocalInvocationID.x;
    if (i >= pc.rows * pc.cols) return;
    const uint r = i / pc.cols, c = i - r * pc.cols;
    const uint row = pc.src_byte + r * pc.src_row_bytes;
    float x;
    if (pc.format == WIDEN_F16) {
        x = half_at(row + 2u * c);
    } else {
        const uint j = c & 31u;
        const uint block = row + (c >> 5u) * (pc.format == WIDEN_Q8_0 ? 34u : 18u);
        const float d = half_at(block);
        if (pc.format == WIDEN_Q8_0) {
            x = float(int(byte_at(block + 2u + j) << 24u) >> 24) * d;  // int8, sign-extended
        } else {  // element j in the low nibble of byte j, element j + 16 in the high one
            const uint b = byte_at(block + 2u + (j & 15u));
            x = (float(j < 16u ? b & 15u : b >> 4u) - 8.0) * d;
        }
    }
    dst[pc.dst_off + i] = x;
}
