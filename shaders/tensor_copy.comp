#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : enable
// Copies a rows x cols block of elements from one binding to another, element offsets and row
// strides in the push block: a
// caller's tensor into a call's inputs, or a call's output into a caller's tensor, as a compute
// dispatch (so every access of a recorded call is a compute-shader access: README, "Inside your
// own Vulkan application"). 32-bit elements, or 16-bit ones with QKV_16 (16-bit storage).
#include "contract/tensor.h"
#ifdef QKV_16
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_int16 : require
#define ELEMENT uint16_t
#else
#define ELEMENT uint
#endif

layout(local_size_x = TENSOR_COPY_WORKGROUP, local_size_y = 1, local_size_z = 1) in;
layout(std430, binding = TENSOR_COPY_BINDING_SRC) readonly buffer Src { ELEMENT src[]; };
layout(std430, binding = TENSOR_COPY_BINDING_DST) writeonly buffer Dst { ELEMENT dst[]; };
layout(push_constant) uniform Push { tensor_copy_push pc; };

void main() {
    const uint first = ((gl_WorkGroupID.x + pc.group_x) * TENSOR_COPY_WORKGROUP + gl_LocalInvocationID.x) *
                       TENSOR_COPY_PER_INVOCATION;
    const uint count = pc.rows * pc.cols;
    [[unroll]] for (uint k = 0u; k < TENSOR_COPY_PER_INVOCATION; ++k) {
        const uint i = first + k;
        if (i < count) {
            const uint r = i / pc.cols, c = i - r * pc.cols;
            dst[pc.dst_off + r * pc.dst_rs + c] = src[pc.src_off + r * pc.src_rs + c];
        }
    }
}
