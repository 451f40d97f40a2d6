// The value accumulation's rules for V holding NaN or ±inf, shared by the fused kernels and the
// decode kernel (their "careful" paths; where every value is finite the plain products are exact).
//
// A masked key's weight is -0.0 (MASKED_WEIGHT), so that a weight of +0.0 means "allowed, but too
// small for float32". A masked key adds nothing, even where its value is NaN; an allowed key
// whose weight underflowed still carries its value's infinities and NaNs, as the exact (float64)
// sum would: the limit of p·v as p → +0 is ±inf for v = ±inf and NaN for v = NaN.

float masked_weight_value() { return uintBitsToFloat(0x80000000u); }
#define MASKED_WEIGHT masked_weight_value()

bool is_masked_weight(float p) { return floatBitsToUint(p) == 0x80000000u; }

/// The non-finite components of v (0 elsewhere).
vec4 nonfinite_part(vec4 v) { return mix(mix(vec4(0.0), v, isinf(v)), v, isnan(v)); }

/// The non-finite part of one value (0 where it is finite).
float nonfinite_part(float v) { return isinf(v) || isnan(v) ? v : 0.0; }

/// p·v for one key's weight p (selects, no branches: an unrolled loop of these stays one block).
vec4 weighted(float p, vec4 v) {
    const vec4 underflowed = is_masked_weight(p) ? vec4(0.0) : nonfinite_part(v);
    return p != 0.0 ? p * v : underflowed;
}

/// acc·alpha, where an alpha that underflowed to 0 keeps acc's infinities and NaNs.
vec4 rescaled(vec4 acc, float alpha) { return alpha != 0.0 ? acc * alpha : nonfinite_part(acc); }
