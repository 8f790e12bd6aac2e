// Inner products of float32 vectors for BlazeVector (VectorMatrix, HNSWGraph): one version per instruction set, the
// widest the CPU supports picked once (GCC/Clang's __builtin_cpu_supports), so one binary runs everywhere and uses
// AVX-512 or AVX2+FMA where they exist. Each sums in several independent accumulators, then the tail one by one.
#include "blaze_vector_kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>

__attribute__((target("avx512f")))
static float dot_avx512(const float *a, const float *b, size_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps(), s2 = _mm512_setzero_ps(), s3 = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
        s2 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 32), _mm512_loadu_ps(b + i + 32), s2);
        s3 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 48), _mm512_loadu_ps(b + i + 48), s3);
    }
    for (; i + 16 <= n; i += 16) s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    float sum = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
    for (; i < n; i++) sum += a[i] * b[i];
    return sum;
}

__attribute__((target("avx2,fma")))
static float dot_avx2(const float *a, const float *b, size_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    __m256 s = _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3));
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
    float sum = _mm_cvtss_f32(h);
    for (; i < n; i++) sum += a[i] * b[i];
    return sum;
}
#endif

static float dot_portable(const float *a, const float *b, size_t n) {
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        s0 += a[i] * b[i];
        s1 += a[i + 1] * b[i + 1];
        s2 += a[i + 2] * b[i + 2];
        s3 += a[i + 3] * b[i + 3];
        s4 += a[i + 4] * b[i + 4];
        s5 += a[i + 5] * b[i + 5];
        s6 += a[i + 6] * b[i + 6];
        s7 += a[i + 7] * b[i + 7];
    }
    float sum = ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7));
    for (; i < n; i++) sum += a[i] * b[i];
    return sum;
}

typedef float (*dot_fn)(const float *, const float *, size_t);

static dot_fn chosen(const char **name) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) { *name = "avx512"; return dot_avx512; }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) { *name = "avx2"; return dot_avx2; }
#endif
    *name = "sse";
    return dot_portable;
}

static const char *isa_name;
static dot_fn dot_impl;

float blaze_dot_f32(const float *a, const float *b, size_t n) {
    // Racing first calls pick the same function: the store is idempotent.
    dot_fn f = __atomic_load_n(&dot_impl, __ATOMIC_ACQUIRE);
    if (!f) {
        const char *name;
        f = chosen(&name);
        __atomic_store_n(&isa_name, name, __ATOMIC_RELEASE);
        __atomic_store_n(&dot_impl, f, __ATOMIC_RELEASE);
    }
    return f(a, b, n);
}

const char *blaze_dot_f32_isa(void) {
    blaze_dot_f32((const float *)0, (const float *)0, 0);
    return __atomic_load_n(&isa_name, __ATOMIC_ACQUIRE);
}
