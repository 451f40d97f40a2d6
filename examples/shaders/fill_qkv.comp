#version 450
// The application's own producer: writes Q, K and V from an integer hash (exactly reproducible on
// the host: every step is exact in float32), at element offsets of one buffer each.
layout(local_size_x = 64) in;
layout(std430, binding = 0) writeonly buffer Q { float q[]; };
layout(std430, binding = 1) writeonly buffer K { float k[]; };
layout(std430, binding = 2) writeonly buffer V { float v[]; };
layout(push_constant) uniform Push { uint nq, nk, nv, q_off, k_off, v_off, salt; } pc;

float value(uint i, uint salt) {
    uint h = (i ^ (salt * 0x9e3779b9u)) * 2654435761u;
    h ^= h >> 15;
    return float(h >> 8) * (1.0 / 8388608.0) - 1.0;  // in [-1, 1), exact
}

void main() {
    const uint i = gl_GlobalInvocationID.x;
    if (i < pc.nq) q[pc.q_off + i] = value(i, pc.salt * 3u + 1u);
    if (i < pc.nk) k[pc.k_off + i] = value(i, pc.salt * 3u + 2u);
    if (i < pc.nv) v[pc.v_off + i] = value(i, pc.salt * 3u + 3u);
}
