/* Causal attention of one long sequence (a step's shared prompt: 5k tokens of tool schemas), forward and backward,
   fp32, AVX2 + FMA or AVX-512, threads from OpenMP. Query i sits at position offset + i and sees keys 0..offset + i:
   offset 0 is causal self-attention, offset >= the keys is a cascade's shared prefix (every key seen).

   The flash scheme: queries and keys go in blocks (FWD_* and BWD_* below), a block's scores live in L1/L2 only, the
   softmax is kept as each query's log-sum-exp. Every product is of one shape: a block of rows held in registers
   (6 rows x 64 columns on AVX-512, 6 x 16 on AVX2) while the inner dimension streams by, one operand broadcast a
   scalar at a time from any strides (so a block of scores is read transposed without being copied), the other
   read as rows. Keys (and, for the backward, values) are packed transposed once a call, so that the scores'
   products read their columns as rows.

   Grouped-query attention: query head h reads key/value head h / (heads / kv_heads).

   Forward: one task per (KV head, query block), largest first (causal work grows with the block), running all the
   query heads of the group over each key block while it is in cache (the queries pre-scaled), their outputs and
   running max and sum in the task's buffer. Backward (FlashAttention-2's order): one task per (KV head, BWD_SUPER
   key blocks), which runs every query head of its group over every query block from the diagonal on; a query
   block's rows are read once for all the task's key blocks (reading them once per key block cost 10% of the time,
   measured). The task's key and value gradients stay in it; each query block's query gradient is added to the
   thread's own buffer, and the threads' buffers are summed at the end (no two tasks write the same key gradient;
   no atomics).

   Strides are in floats; the head dimension is contiguous and a multiple of the column tile (64 on AVX-512, 16 on
   AVX2). Built beside small_gemm.c into one library by toolrl/models/native/__init__.py. */

#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifndef FWD_BQ
#define FWD_BQ 128
#endif
#ifndef FWD_BK
#define FWD_BK 128
#endif
#ifndef BWD_BQ
#define BWD_BQ 64
#endif
#ifndef BWD_BK
#define BWD_BK 128
#endif
#ifndef BWD_SUPER
#define BWD_SUPER 4
#endif
#ifndef DEC_TASKS
#define DEC_TASKS 4
#endif
#define TILE_ROWS 6

#include "rows.h"
#include "vec.h"

/* A tile's columns: CV vectors, CT floats (64 on AVX-512, 16 on AVX2); COLS and LOADS unroll them */
#if W == 16
#define COLS(F, r) F(r, 0) F(r, 1) F(r, 2) F(r, 3)
#define LOADS(F) F(0) F(1) F(2) F(3)
#define CV 4
#else
#define COLS(F, r) F(r, 0) F(r, 1)
#define LOADS(F) F(0) F(1)
#define CV 2
#endif
#define CT (CV * W)

/* C[r, 0..CT) (+)= sum_p A[r * sa_r + p * sa_p] * B[p * ldb + 0..CT), r < R (rows unrolled by rows.h) */
#define DECL(r, c) vf a##r##_##c = add ? vload(C + r * ldc + c * W) : vzero();
#define DECL_ROW(r) COLS(DECL, r)
#define LOADB(c) vf b##c = vload(b + c * W);
#define FMA1(r, c) a##r##_##c = vfma(x##r, b##c, a##r##_##c);
#define FMA_ROW(r)                                                                                                 \
    {                                                                                                              \
        vf x##r = vset1(a[r * sa_r]);                                                                              \
        COLS(FMA1, r)                                                                                              \
    }
#define STORE1(r, c) vstore(C + r * ldc + c * W, a##r##_##c);
#define STORE_ROW(r) COLS(STORE1, r)
#define TILE(R)                                                                                                    \
    static inline void tile_##R(int64_t k, const float *A, int64_t sa_r, int64_t sa_p, const float *B, int64_t ldb, \
                                float *C, int64_t ldc, int add) {                                                  \
        ROWS_##R(DECL_ROW);                                                                                        \
        for (int64_t p = 0; p < k; ++p) {                                                                          \
            const float *b = B + p * ldb, *a = A + p * sa_p;                                                       \
            LOADS(LOADB);                                                                                          \
            ROWS_##R(FMA_ROW);                                                                                     \
        }                                                                                                          \
        ROWS_##R(STORE_ROW);                                                                                       \
    }
TILE(1)
TILE(2)
TILE(3)
TILE(4)
TILE(5)
TILE(6)

/* C [m, n] (+)= A [m, k] (strides sa_r, sa_p) @ B [k, n] (row stride ldb), n a multiple of CT */
static void gemm(int64_t m, int64_t n, int64_t k, const float *A, int64_t sa_r, int64_t sa_p, const float *B,
                 int64_t ldb, float *C, int64_t ldc, int add) {
    if (k <= 0) {
        if (!add)
            for (int64_t r = 0; r < m; ++r) memset(C + r * ldc, 0, n * sizeof(float));
        return;
    }
    for (int64_t c0 = 0; c0 < n; c0 += CT)
        for (int64_t r0 = 0; r0 < m; r0 += TILE_ROWS) {
            const float *a = A + r0 * sa_r;
            const float *b = B + c0;
            float *c = C + r0 * ldc + c0;
            switch (m - r0 < TILE_ROWS ? m - r0 : TILE_ROWS) {
            case 6: tile_6(k, a, sa_r, sa_p, b, ldb, c, ldc, add); break;
            case 5: tile_5(k, a, sa_r, sa_p, b, ldb, c, ldc, add); break;
            case 4: tile_4(k, a, sa_r, sa_p, b, ldb, c, ldc, add); break;
            case 3: tile_3(k, a, sa_r, sa_p, b, ldb, c, ldc, add); break;
            case 2: tile_2(k, a, sa_r, sa_p, b, ldb, c, ldc, add); break;
            default: tile_1(k, a, sa_r, sa_p, b, ldb, c, ldc, add); break;
            }
        }
}

int toolrl_flash_tile(void) { return CT; }

/* x [heads, n, d] (strides sh, st) -> packed [heads, blocks, d, BK] (by_block: [blocks, heads, d, BK]): each key
   block transposed, zero past n */
static void pack_transposed(const float *x, int64_t heads, int64_t n, int64_t d, int64_t sh, int64_t st,
                            int64_t bk, float *packed, int by_block, int threads) {
    int64_t blocks = (n + bk - 1) / bk;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t hb = 0; hb < heads * blocks; ++hb) {
        int64_t h = hb / blocks, j = hb % blocks;
        float *dst = packed + (by_block ? j * heads + h : hb) * d * bk;
        for (int64_t c = 0; c < bk; ++c) {
            int64_t t = j * bk + c;
            const float *src = x + h * sh + t * st;
            for (int64_t e = 0; e < d; ++e) dst[e * bk + c] = t < n ? src[e] : 0.0f;
        }
    }
}

/* rows x d floats from rows `stride` apart into a contiguous block */
static void gather_rows(const float *src, int64_t stride, int64_t rows, int64_t d, float *dst) {
    for (int64_t r = 0; r < rows; ++r) memcpy(dst + r * d, src + r * stride, sizeof(float) * d);
}

/* rows x d floats `stride` apart: where they are when contiguous, else gathered into `buffer` */
static const float *rows_of(const float *src, int64_t stride, int64_t rows, int64_t d, float *buffer) {
    if (stride == d) return src;
    gather_rows(src, stride, rows, d, buffer);
    return buffer;
}

/* The group's query heads (KV head g's) of a block of `rows` queries, pre-scaled, into qs (head e's at qs + e * hs *
   d), and their outputs, running max and sum (os, ms, ls, the same head stride) started empty */
static void start_queries(const float *q, int64_t qh, int64_t qt, int64_t g, int64_t group, int64_t q0, int64_t rows,
                          int64_t hs, int64_t d, float scale, float *qs, float *os, float *ms, float *ls) {
    vf sc = vset1(scale); /* the scores' scale, folded into the queries */
    memset(os, 0, sizeof(float) * group * hs * d);
    for (int64_t i = 0; i < group * hs; ++i) ms[i] = -INFINITY, ls[i] = 0.0f;
    for (int64_t e = 0; e < group; ++e) {
        float *dst = qs + e * hs * d;
        gather_rows(q + (g * group + e) * qh + q0 * qt, qt, rows, d, dst);
        for (int64_t i = 0; i < rows * d; i += W) vstore(dst + i, vmul(vload(dst + i), sc));
    }
}

/* One key block (keys k0.., `valid` of them, packed transposed at kpj; their values at vj, token stride vt) for the
   group's query heads as start_queries laid them out, query r at position first + r (seeing keys 0..first + r): the
   block's scores in s, then each row's running max and sum and its unnormalized output updated (the online
   softmax). */
static void forward_block(int64_t group, int64_t rows, int64_t hs, int64_t d, int64_t first, const float *qs,
                          const float *kpj, const float *vj, int64_t vt, int64_t k0, int64_t valid, float *s, float *os,
                          float *ms, float *ls) {
    int64_t seen = first + rows;                            /* keys the block's last query sees */
    int64_t reach = seen - k0 < valid ? seen - k0 : valid; /* keys of this block any row sees */
    for (int64_t e = 0; e < group; ++e) {
        float *o = os + e * hs * d, *m = ms + e * hs, *l = ls + e * hs;
        gemm(rows, FWD_BK, d, qs + e * hs * d, d, 1, kpj, FWD_BK, s, FWD_BK, 0);
        for (int64_t r = 0; r < rows; ++r) {
            float *sr = s + r * FWD_BK;
            int64_t limit = first + r - k0 + 1;
            if (limit > valid) limit = valid;
            if (limit <= 0) {
                memset(sr, 0, sizeof(float) * FWD_BK);
                continue;
            }
            vf mx = vset1(-INFINITY), ninf = vset1(-INFINITY), sum = vzero(), zero = vzero();
            if (limit == FWD_BK) { /* a row every key of the block is visible to */
                for (int64_t c = 0; c < FWD_BK; c += W) mx = vmax(mx, vload(sr + c));
            } else {
                for (int64_t c = 0; c < limit; c += W) {
                    vf x = vkeep(vload(sr + c), limit - c, ninf);
                    vstore(sr + c, x);
                    mx = vmax(mx, x);
                }
            }
            float top = vhmax(mx), fresh = top > m[r] ? top : m[r];
            float alpha = m[r] == -INFINITY ? 0.0f : expf(m[r] - fresh);
            vf base = vset1(fresh);
            if (limit == FWD_BK) {
                for (int64_t c = 0; c < FWD_BK; c += W) {
                    vf p = vexp(vsub(vload(sr + c), base));
                    vstore(sr + c, p);
                    sum = vadd(sum, p);
                }
            } else {
                for (int64_t c = 0; c < FWD_BK; c += W) {
                    vf p = c < limit ? vkeep(vexp(vsub(vload(sr + c), base)), limit - c, zero) : zero;
                    vstore(sr + c, p);
                    sum = vadd(sum, p);
                }
            }
            l[r] = l[r] * alpha + vhsum(sum);
            m[r] = fresh;
            if (alpha != 1.0f) {
                vf a = vset1(alpha);
                for (int64_t i = 0; i < d; i += W) vstore(o + r * d + i, vmul(vload(o + r * d + i), a));
            }
        }
        gemm(rows, d, reach, s, FWD_BK, 1, vj, vt, o, d, 1);
    }
}

/* Forward. q [heads, nq, d] (strides qh, qt), k and v [kv_heads, nk, d] (kh, kt and vh, vt); query i is at
   position offset + i and sees keys 0..offset + i (offset 0 and nq = nk: causal self-attention; offset >= nk: every
   key). out [heads, nq, d] (strides uh, ut), lse [heads, nq] (natural log of each query's softmax sum over
   scale * q.k). 0, or -1 on bad shapes or no memory. */
int toolrl_flash_forward(const float *q, int64_t qh, int64_t qt, const float *k, int64_t kh, int64_t kt,
                         const float *v, int64_t vh, int64_t vt, int64_t heads, int64_t kv_heads, int64_t nq,
                         int64_t nk, int64_t offset, int64_t d, float scale, float *out, int64_t uh, int64_t ut,
                         float *lse, int threads) {
    if (nq <= 0 || nk <= 0 || offset < 0 || d <= 0 || d % CT || kv_heads <= 0 || heads % kv_heads || threads <= 0)
        return -1;
    int64_t blocks = (nk + FWD_BK - 1) / FWD_BK, qblocks = (nq + FWD_BQ - 1) / FWD_BQ, group = heads / kv_heads;
    float *kp = aligned_alloc(64, sizeof(float) * kv_heads * blocks * d * FWD_BK);
    if (!kp) return -1;
    pack_transposed(k, kv_heads, nk, d, kh, kt, FWD_BK, kp, 0, threads);
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        /* a task's scores, then each head of its group's output block, running max and sum, and query block */
        float *s = aligned_alloc(64, sizeof(float) * (FWD_BQ * FWD_BK + group * FWD_BQ * (2 * d + 2)));
        if (!s) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < kv_heads * qblocks; ++task) {
            if (!s) continue;
            int64_t qb = qblocks - 1 - task / kv_heads, g = task % kv_heads;
            int64_t q0 = qb * FWD_BQ, rows = nq - q0 < FWD_BQ ? nq - q0 : FWD_BQ;
            float *os = s + FWD_BQ * FWD_BK, *qs = os + group * FWD_BQ * d;
            float *ms = qs + group * FWD_BQ * d, *ls = ms + group * FWD_BQ;
            start_queries(q, qh, qt, g, group, q0, rows, FWD_BQ, d, scale, qs, os, ms, ls);
            int64_t seen = offset + q0 + rows; /* keys the block's last query sees */
            int64_t last = ((seen < nk ? seen : nk) - 1) / FWD_BK;
            for (int64_t j = 0; j <= last; ++j) {
                int64_t k0 = j * FWD_BK, valid = nk - k0 < FWD_BK ? nk - k0 : FWD_BK;
                forward_block(group, rows, FWD_BQ, d, offset + q0, qs, kp + (g * blocks + j) * d * FWD_BK,
                              v + g * vh + k0 * vt, vt, k0, valid, s, os, ms, ls);
            }
            for (int64_t e = 0; e < group; ++e) {
                int64_t h = g * group + e;
                float *o = os + e * FWD_BQ * d, *m = ms + e * FWD_BQ, *l = ls + e * FWD_BQ;
                for (int64_t r = 0; r < rows; ++r) {
                    vf inv = vset1(1.0f / l[r]);
                    float *dst = out + h * uh + (q0 + r) * ut;
                    for (int64_t i = 0; i < d; i += W) vstore(dst + i, vmul(vload(o + r * d + i), inv));
                    lse[h * nq + q0 + r] = m[r] + logf(l[r]);
                }
            }
        }
        free(s);
    }
    free(kp);
    return failed ? -1 : 0;
}

/* The keys' block size for toolrl_flash_pack_keys and toolrl_flash_decode */
int toolrl_flash_key_block(void) { return FWD_BK; }

/* k [kv_heads, nk, d] (strides kh, kt) into `packed` (ceil(nk / FWD_BK) * kv_heads * d * FWD_BK floats) as
   toolrl_flash_decode reads it: each block of keys transposed, a block's KV heads side by side */
void toolrl_flash_pack_keys(const float *k, int64_t kh, int64_t kt, int64_t kv_heads, int64_t nk, int64_t d,
                            float *packed, int threads) {
    pack_transposed(k, kv_heads, nk, d, kh, kt, FWD_BK, packed, 1, threads);
}

/* Decode: a few queries a head (nq <= FWD_BQ: a decode step's rows over a cascade's shared prefix) that see every
   key, the keys packed once beforehand (toolrl_flash_pack_keys: kp), so that a step reads each key and value once
   and packs nothing. Such a call has one query block a KV head, too few tasks for the threads: the keys are split
   into chunks (FlashDecoding), one task per chunk for every KV head (a chunk's keys and values are read together,
   where the heads' values lie side by side in memory), and the tasks' unnormalized outputs, maxima and sums are
   merged by log-sum-exp at the end. q, v, out and lse as in toolrl_flash_forward. */
int toolrl_flash_decode(const float *q, int64_t qh, int64_t qt, const float *kp, const float *v, int64_t vh,
                        int64_t vt, int64_t heads, int64_t kv_heads, int64_t nq, int64_t nk, int64_t d, float scale,
                        float *out, int64_t uh, int64_t ut, float *lse, int threads) {
    if (nq <= 0 || nq > FWD_BQ || nk <= 0 || d <= 0 || d % CT || kv_heads <= 0 || heads % kv_heads || threads <= 0)
        return -1;
    int64_t blocks = (nk + FWD_BK - 1) / FWD_BK, group = heads / kv_heads;
    /* about DEC_TASKS tasks a thread (dynamic scheduling evens them out) */
    int64_t chunk = (blocks + DEC_TASKS * threads - 1) / (DEC_TASKS * threads);
    int64_t chunks = (blocks + chunk - 1) / chunk, part = group * nq * (d + 2);
    float *parts = aligned_alloc(64, sizeof(float) * kv_heads * chunks * part);
    if (!parts) return -1;
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        /* scores, then every KV head's queries */
        float *s = aligned_alloc(64, sizeof(float) * (FWD_BQ * FWD_BK + kv_heads * group * nq * d));
        if (!s) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t c = 0; c < chunks; ++c) {
            if (!s) continue;
            int64_t j0 = c * chunk, j1 = j0 + chunk < blocks ? j0 + chunk : blocks;
            for (int64_t g = 0; g < kv_heads; ++g) {
                float *os = parts + (g * chunks + c) * part, *ms = os + group * nq * d, *ls = ms + group * nq;
                start_queries(q, qh, qt, g, group, 0, nq, nq, d, scale, s + FWD_BQ * FWD_BK + g * group * nq * d, os,
                              ms, ls);
            }
            /* a block's keys and values for every head while they are in cache (the heads' values lie side by
               side in a layer's layout: one pass over the block's rows) */
            for (int64_t j = j0; j < j1; ++j) {
                int64_t k0 = j * FWD_BK, valid = nk - k0 < FWD_BK ? nk - k0 : FWD_BK;
                for (int64_t g = 0; g < kv_heads; ++g) {
                    float *os = parts + (g * chunks + c) * part, *ms = os + group * nq * d, *ls = ms + group * nq;
                    forward_block(group, nq, nq, d, nk, s + FWD_BQ * FWD_BK + g * group * nq * d,
                                  kp + (j * kv_heads + g) * d * FWD_BK, v + g * vh + k0 * vt, vt, k0, valid, s, os,
                                  ms, ls);
                }
            }
        }
        free(s);
        /* the implicit barrier of the loop above: every task's part is written */
#pragma omp for schedule(static)
        for (int64_t hr = 0; hr < heads * nq; ++hr) {
            int64_t h = hr / nq, r = hr % nq, g = h / group, e = h % group, at = e * nq + r;
            const float *first = parts + g * chunks * part;
            float top = -INFINITY, sum = 0.0f;
            for (int64_t c = 0; c < chunks; ++c) {
                float m = first[c * part + group * nq * d + at];
                top = m > top ? m : top;
            }
            float *dst = out + h * uh + r * ut;
            for (int64_t i = 0; i < d; i += W) vstore(dst + i, vzero());
            for (int64_t c = 0; c < chunks; ++c) {
                const float *o = first + c * part, *m = o + group * nq * d, *l = m + group * nq;
                float w = expf(m[at] - top);
                vf wv = vset1(w);
                sum += l[at] * w;
                for (int64_t i = 0; i < d; i += W) vstore(dst + i, vfma(vload(o + at * d + i), wv, vload(dst + i)));
            }
            vf inv = vset1(1.0f / sum);
            for (int64_t i = 0; i < d; i += W) vstore(dst + i, vmul(vload(dst + i), inv));
            lse[h * nq + r] = top + logf(sum);
        }
    }
    free(parts);
    return failed ? -1 : 0;
}

/* Backward. q, k, v, nq, nk and offset as in the forward; dout [heads, nq, d] (strides oh, ot); lse [heads, nq] the
   forward's; delta [heads, nq] = rowsum(dout * out). dq [heads, nq, d], dk and dv [kv_heads, nk, d], contiguous,
   written. */
int toolrl_flash_backward(const float *q, int64_t qh, int64_t qt, const float *k, int64_t kh, int64_t kt,
                          const float *v, int64_t vh, int64_t vt, const float *dout, int64_t oh, int64_t ot,
                          const float *lse, const float *delta, int64_t heads, int64_t kv_heads, int64_t nq,
                          int64_t nk, int64_t offset, int64_t d, float scale, float *dq, float *dk, float *dv,
                          int threads) {
    if (nq <= 0 || nk <= 0 || offset < 0 || d <= 0 || d % CT || kv_heads <= 0 || heads % kv_heads || threads <= 0)
        return -1;
    int64_t blocks = (nk + BWD_BK - 1) / BWD_BK, qblocks = (nq + BWD_BQ - 1) / BWD_BQ, group = heads / kv_heads;
    int64_t supers = (blocks + BWD_SUPER - 1) / BWD_SUPER;
    int64_t size = heads * nq * d;
    float *kp = aligned_alloc(64, sizeof(float) * kv_heads * blocks * d * BWD_BK);
    float *vp = aligned_alloc(64, sizeof(float) * kv_heads * blocks * d * BWD_BK);
    float *dqs = threads > 1 ? aligned_alloc(64, sizeof(float) * (threads - 1) * size) : NULL;
    if (!kp || !vp || (threads > 1 && !dqs)) {
        free(kp), free(vp), free(dqs);
        return -1;
    }
    pack_transposed(k, kv_heads, nk, d, kh, kt, BWD_BK, kp, 0, threads);
    pack_transposed(v, kv_heads, nk, d, vh, vt, BWD_BK, vp, 0, threads);
    int failed = 0, team = 1;
#pragma omp parallel num_threads(threads)
    {
        int me = omp_get_thread_num();
#pragma omp single
        team = omp_get_num_threads();
        float *mine = me == 0 ? dq : dqs + (me - 1) * size;
        memset(mine, 0, sizeof(float) * size);
        float *s = aligned_alloc(64, sizeof(float) * (2 * BWD_BQ * BWD_BK + 3 * BWD_BQ * d + 2 * BWD_SUPER * BWD_BK * d));
        if (!s) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp barrier
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < kv_heads * supers; ++task) {
            if (!s) continue;
            int64_t sb = task / kv_heads, g = task % kv_heads;
            int64_t j0 = sb * BWD_SUPER, j1 = j0 + BWD_SUPER < blocks ? j0 + BWD_SUPER : blocks;
            int64_t start = j0 * BWD_BK, end = j1 * BWD_BK < nk ? j1 * BWD_BK : nk;
            float *p = s, *dp = p + BWD_BQ * BWD_BK, *qq = dp + BWD_BQ * BWD_BK, *oo = qq + BWD_BQ * d;
            float *dqb = oo + BWD_BQ * d, *dkb = dqb + BWD_BQ * d, *dvb = dkb + BWD_SUPER * BWD_BK * d;
            memset(dkb, 0, sizeof(float) * 2 * BWD_SUPER * BWD_BK * d);
            int64_t first = start > offset ? (start - offset) / BWD_BQ : 0; /* the first query block that sees a key */
            for (int64_t h = g * group; h < (g + 1) * group; ++h)
                for (int64_t qb = first; qb < qblocks; ++qb) {
                    int64_t q0 = qb * BWD_BQ, rows = nq - q0 < BWD_BQ ? nq - q0 : BWD_BQ;
                    int64_t seen = offset + q0 + rows; /* keys the block's last query sees */
                    const float *qrows = rows_of(q + h * qh + q0 * qt, qt, rows, d, qq);
                    const float *orows = rows_of(dout + h * oh + q0 * ot, ot, rows, d, oo);
                    memset(dqb, 0, sizeof(float) * rows * d);
                    for (int64_t j = j0; j < j1 && j * BWD_BK < seen; ++j) {
                        int64_t k0 = j * BWD_BK, valid = nk - k0 < BWD_BK ? nk - k0 : BWD_BK;
                        const float *kpj = kp + (g * blocks + j) * d * BWD_BK, *vpj = vp + (g * blocks + j) * d * BWD_BK;
                        float *dkj = dkb + (k0 - start) * d, *dvj = dvb + (k0 - start) * d;
                        gemm(rows, BWD_BK, d, qrows, d, 1, kpj, BWD_BK, p, BWD_BK, 0);
                        gemm(rows, BWD_BK, d, orows, d, 1, vpj, BWD_BK, dp, BWD_BK, 0);
                        vf zero = vzero(), sc = vset1(scale);
                        for (int64_t r = 0; r < rows; ++r) {
                            int64_t limit = offset + q0 + r - k0 + 1;
                            if (limit > valid) limit = valid;
                            vf base = vset1(lse[h * nq + q0 + r]), dl = vset1(delta[h * nq + q0 + r]);
                            float *pr = p + r * BWD_BK, *dpr = dp + r * BWD_BK;
                            for (int64_t c = 0; c < BWD_BK; c += W) {
                                vf x = c < limit ? vkeep(vexp(vsub(vmul(vload(pr + c), sc), base)), limit - c, zero)
                                                 : zero;
                                vstore(pr + c, x);
                                vstore(dpr + c, vmul(vmul(x, vsub(vload(dpr + c), dl)), sc));
                            }
                        }
                        int64_t keys = seen - k0 < valid ? seen - k0 : valid; /* keys any query of the block sees */
                        gemm(keys, d, rows, p, 1, BWD_BK, orows, d, dvj, d, 1);                   /* dV += P^T dO */
                        gemm(keys, d, rows, dp, 1, BWD_BK, qrows, d, dkj, d, 1);                  /* dK += dS^T Q */
                        gemm(rows, d, keys, dp, BWD_BK, 1, k + g * kh + k0 * kt, kt, dqb, d, 1); /* dQ += dS K */
                    }
                    float *dst = mine + (h * nq + q0) * d;
                    for (int64_t i = 0; i < rows * d; i += W) vstore(dst + i, vadd(vload(dst + i), vload(dqb + i)));
                }
            memcpy(dk + (g * nk + start) * d, dkb, sizeof(float) * (end - start) * d);
            memcpy(dv + (g * nk + start) * d, dvb, sizeof(float) * (end - start) * d);
        }
        free(s);
#pragma omp barrier
#pragma omp for schedule(static)
        for (int64_t i = 0; i < size; i += W) {
            vf acc = vload(dq + i);
            for (int t = 1; t < team; ++t) acc = vadd(acc, vload(dqs + (t - 1) * size + i));
            vstore(dq + i, acc);
        }
    }
    free(kp), free(vp), free(dqs);
    return failed ? -1 : 0;
}
