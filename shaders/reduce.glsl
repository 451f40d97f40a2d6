// Workgroup-wide max and sum. With QKV_SUBGROUP: subgroup operations, then one value per subgroup
// through shared memory (any subgroup size, any number of subgroups). Without: a shared-memory
// tree. The host picks the variant from the device's subgroupSupportedOperations.
#ifdef QKV_SUBGROUP
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#endif

shared float reduce_scratch[gl_WorkGroupSize.x];

#ifdef QKV_SUBGROUP
float workgroup_max(float v) {
    v = subgroupMax(v);
    if (subgroupElect()) reduce_scratch[gl_SubgroupID] = v;
    barrier();
    if (gl_SubgroupID == 0u) {
        float w = uintBitsToFloat(0xff800000u);
        for (uint i = gl_SubgroupInvocationID; i < gl_NumSubgroups; i += gl_SubgroupSize) w = max(w, reduce_scratch[i]);
        w = subgroupMax(w);
        if (subgroupElect()) reduce_scratch[0] = w;
    }
    barrier();
    const float result = reduce_scratch[0];
    barrier();
    return result;
}
float workgroup_sum(float v) {
    v = subgroupAdd(v);
    if (subgroupElect()) reduce_scratch[gl_SubgroupID] = v;
    barrier();
    if (gl_SubgroupID == 0u) {
        float w = 0.0;
        for (uint i = gl_SubgroupInvocationID; i < gl_NumSubgroups; i += gl_SubgroupSize) w += reduce_scratch[i];
        w = subgroupAdd(w);
        if (subgroupElect()) reduce_scratch[0] = w;
    }
    barrier();
    const float result = reduce_scratch[0];
    barrier();
    return result;
}
#else
float workgroup_max(float v) {
    const uint t = gl_LocalInvocationID.x;
    reduce_scratch[t] = v;
    barrier();
    for (uint stride = gl_WorkGroupSize.x / 2u; stride > 0u; stride /= 2u) {
        if (t < stride) reduce_scratch[t] = max(reduce_scratch[t], reduce_scratch[t + stride]);
        barrier();
    }
    const float result = reduce_scratch[0];
    barrier();
    return result;
}
float workgroup_sum(float v) {
    const uint t = gl_LocalInvocationID.x;
    reduce_scratch[t] = v;
    barrier();
    for (uint stride = gl_WorkGroupSize.x / 2u; stride > 0u; stride /= 2u) {
        if (t < stride) reduce_scratch[t] += reduce_scratch[t + stride];
        barrier();
    }
    const float result = reduce_scratch[0];
    barrier();
    return result;
}
#endif
