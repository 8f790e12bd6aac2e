// The inner product and the squared L2 distance of float32 vectors, with the widest SIMD the CPU has (AVX-512, AVX2 with FMA, or SSE), chosen
// once at the first call. Swift cannot pick instruction sets at run time; C can.
#ifndef BLAZE_VECTOR_KERNELS_H
#define BLAZE_VECTOR_KERNELS_H

#include <stddef.h>

/// The inner product of the `n` floats at `a` and `b`.
float blaze_dot_f32(const float *a, const float *b, size_t n);

/// The squared L2 distance of the `n` floats at `a` and `b`, from their differences.
float blaze_l2sq_f32(const float *a, const float *b, size_t n);

/// The instruction set `blaze_dot_f32` and `blaze_l2sq_f32` use: "avx512", "avx2" or "sse".
const char *blaze_dot_f32_isa(void);

#endif
