/* The vector types and operations flash.c and elementwise.c share: AVX-512 where the build has it, else AVX2 + FMA.
   W floats a vector; vexp: e^x by Cephes' polynomial. */

#ifndef TOOLRL_VEC_H
#define TOOLRL_VEC_H

#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#ifdef __AVX512F__
#define W 16
typedef __m512 vf;
#define vload _mm512_loadu_ps
#define vstore _mm512_storeu_ps
#define vset1 _mm512_set1_ps
#define vzero _mm512_setzero_ps
#define vfma _mm512_fmadd_ps
#define vfnma _mm512_fnmadd_ps
#define vadd _mm512_add_ps
#define vsub _mm512_sub_ps
#define vmul _mm512_mul_ps
#define vdiv _mm512_div_ps
#define vmax _mm512_max_ps
#define vmin _mm512_min_ps
#define vhmax _mm512_reduce_max_ps
#define vhsum _mm512_reduce_add_ps
#define vround(x) _mm512_roundscale_ps((x), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define vpow2(p, n) _mm512_scalef_ps((p), (n))
/* lanes i < limit kept, the others `fill` */
static inline vf vkeep(vf x, int64_t limit, vf fill) {
    __mmask16 m = limit >= W ? (__mmask16)0xFFFF : limit <= 0 ? 0 : (__mmask16)((1u << limit) - 1);
    return _mm512_mask_mov_ps(fill, m, x);
}
#else
#define W 8
typedef __m256 vf;
#define vload _mm256_loadu_ps
#define vstore _mm256_storeu_ps
#define vset1 _mm256_set1_ps
#define vzero _mm256_setzero_ps
#define vfma _mm256_fmadd_ps
#define vfnma _mm256_fnmadd_ps
#define vadd _mm256_add_ps
#define vsub _mm256_sub_ps
#define vmul _mm256_mul_ps
#define vdiv _mm256_div_ps
#define vmax _mm256_max_ps
#define vmin _mm256_min_ps
#define vround(x) _mm256_round_ps((x), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
static inline vf vpow2(vf p, vf n) {
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
static inline float vhmax(vf x) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}
static inline float vhsum(vf x) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}
static inline vf vkeep(vf x, int64_t limit, vf fill) {
    const vf lanes = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
    vf m = _mm256_cmp_ps(lanes, _mm256_set1_ps((float)limit), _CMP_LT_OQ);
    return _mm256_blendv_ps(fill, x, m);
}
#endif

/* e^x, Cephes' polynomial (relative error ~1e-7 over the range); below -87.3 the result is ~0 (callers zero
   masked lanes themselves) */
static inline vf vexp(vf x) {
    x = vmin(vmax(x, vset1(-87.3f)), vset1(88.3f));
    vf n = vround(vmul(x, vset1(1.44269504088896341f)));
    vf r = vfnma(n, vset1(0.693359375f), x);
    r = vfnma(n, vset1(-2.12194440e-4f), r);
    vf p = vset1(1.9875691500e-4f);
    p = vfma(p, r, vset1(1.3981999507e-3f));
    p = vfma(p, r, vset1(8.3334519073e-3f));
    p = vfma(p, r, vset1(4.1665795894e-2f));
    p = vfma(p, r, vset1(1.6666665459e-1f));
    p = vfma(p, r, vset1(5.0000001201e-1f));
    p = vfma(p, vmul(r, r), vadd(r, vset1(1.0f)));
    return vpow2(p, n);
}
#endif
