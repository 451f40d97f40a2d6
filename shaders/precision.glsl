// Storage type of Q, K and V: float32, or float16 when compiled with QKV_FP16 (16-bit storage
// only: arithmetic stays float32, so only storageBuffer16BitAccess is needed).
#ifdef QKV_FP16
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#define QKV_T float16_t
#define QKV_TO_T(x) float16_t(x)
#else
#define QKV_T float
#define QKV_TO_T(x) (x)
#endif
