/* fp32 y = x @ w^T + bias for a few rows of x (a decode step's batch), AVX2 + FMA or AVX-512, threads from OpenMP.

   The weight is packed once into panels of 16 output features, [panels, in_features, 16], so a panel's 16
   outputs are two AVX2 vectors, or one AVX-512 vector, per input feature. A block of rows x outputs of y is kept
   in registers while the input features stream by. AVX2: 6 rows x one panel in 12 registers, the classic 6 x 16
   micro-kernel. AVX-512: 12 rows x two panels in 24 of its 32 registers, so that each broadcast input feeds two
   multiply-adds and two streams of the weight are read at once (1.15-1.19x the one-panel, 12-row kernel over the
   default model's products at 1-16 rows, measured quiet). The input features go in chunks of KC, each chunk's
   slice of the panels (KC x 16 floats each, 6 KB) read from memory once and from L1 for the other row blocks, and
   the slice PREFETCH rows ahead is prefetched while the first row block computes. Threads split the panels (pairs
   of panels on AVX-512) in contiguous ranges, so each streams its own part of the weight once.

   Built at first use by toolrl/models/native/__init__.py with -O3 -mavx2 -mfma -fopenmp (and -mavx512f on a CPU
   with AVX-512, which selects the AVX-512 micro-kernels below); it links the OpenMP runtime PyTorch has already
   loaded (one thread pool). */

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "rows.h"

#define PANEL 16
#ifdef __AVX512F__
#define BLOCK_ROWS 12
#else
#define BLOCK_ROWS 6
#endif
#define KC 96
#define PREFETCH 192
#define MAX_ROWS 64

int toolrl_max_rows(void) { return MAX_ROWS; }

void toolrl_pack(const float *w, int64_t n, int64_t k, float *out) {
    int64_t panels = (n + PANEL - 1) / PANEL;
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < panels; ++p) {
        float *dst = out + p * k * PANEL;
        for (int64_t i = 0; i < k; ++i)
            for (int64_t j = 0; j < PANEL; ++j) {
                int64_t row = p * PANEL + j;
                dst[i * PANEL + j] = row < n ? w[row * k + i] : 0.0f;
            }
    }
}

/* acc[r][0..15] (+)= sum over kn input features of x[r * ldx + i] * w[i * 16 + 0..15], for rows r < MR (the rows
   unrolled by rows.h). */
#ifdef __AVX512F__
/* acc holds the block's first panel, acc + MAX_ROWS * PANEL its second; w1 is the second panel's slice */
#define DECLARE(r)                                                                                             \
    __m512 a##r##0 = first ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + r * PANEL);                           \
    __m512 a##r##1 = first ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + (MAX_ROWS + r) * PANEL);
#define LOAD_W __m512 w0 = _mm512_loadu_ps(w + i * PANEL), w1 = _mm512_loadu_ps(w2 + i * PANEL);
#define STEP(r)                                                                                                \
    {                                                                                                          \
        __m512 b = _mm512_set1_ps(x[r * ldx + i]);                                                             \
        a##r##0 = _mm512_fmadd_ps(b, w0, a##r##0);                                                             \
        a##r##1 = _mm512_fmadd_ps(b, w1, a##r##1);                                                             \
    }
#define STORE(r)                                                                                               \
    _mm512_storeu_ps(acc + r * PANEL, a##r##0);                                                                \
    _mm512_storeu_ps(acc + (MAX_ROWS + r) * PANEL, a##r##1);
#define PREFETCH_W(i)                                                                                          \
    _mm_prefetch((const char *)(prefetch + (i) * PANEL), _MM_HINT_T0);                                         \
    _mm_prefetch((const char *)(prefetch2 + (i) * PANEL), _MM_HINT_T0);
#define PANELS 2
#else
#define PANELS 1
#define PREFETCH_W(i) _mm_prefetch((const char *)(prefetch + (i) * PANEL), _MM_HINT_T0);
#define DECLARE(r)                                                                                             \
    __m256 a##r##0 = first ? _mm256_setzero_ps() : _mm256_loadu_ps(acc + r * PANEL);                           \
    __m256 a##r##1 = first ? _mm256_setzero_ps() : _mm256_loadu_ps(acc + r * PANEL + 8);
#define LOAD_W __m256 w0 = _mm256_loadu_ps(w + i * PANEL), w1 = _mm256_loadu_ps(w + i * PANEL + 8);
#define STEP(r)                                                                                                \
    {                                                                                                          \
        __m256 b = _mm256_broadcast_ss(x + r * ldx + i);                                                       \
        a##r##0 = _mm256_fmadd_ps(b, w0, a##r##0);                                                             \
        a##r##1 = _mm256_fmadd_ps(b, w1, a##r##1);                                                             \
    }
#define STORE(r)                                                                                               \
    _mm256_storeu_ps(acc + r * PANEL, a##r##0);                                                                \
    _mm256_storeu_ps(acc + r * PANEL + 8, a##r##1);
#endif
/* w2 and prefetch2: the second panel's slice and prefetch address (AVX-512; unused with AVX2) */
#define MICRO(MR)                                                                                              \
    static void micro_##MR(const float *x, int64_t ldx, const float *w, const float *w2, int64_t kn,          \
                           float *acc, int first, const float *prefetch, const float *prefetch2) {             \
        (void)w2, (void)prefetch2;                                                                             \
        ROWS_##MR(DECLARE);                                                                                    \
        for (int64_t i = 0; i < kn; ++i) {                                                                     \
            if (prefetch) {                                                                                    \
                PREFETCH_W(i)                                                                                  \
            }                                                                                                  \
            LOAD_W;                                                                                            \
            ROWS_##MR(STEP);                                                                                   \
        }                                                                                                      \
        ROWS_##MR(STORE);                                                                                      \
    }
MICRO(1)
MICRO(2)
MICRO(3)
MICRO(4)
MICRO(5)
MICRO(6)
#ifdef __AVX512F__
MICRO(7)
MICRO(8)
MICRO(9)
MICRO(10)
MICRO(11)
MICRO(12)
#endif

typedef void (*micro_fn)(const float *, int64_t, const float *, const float *, int64_t, float *, int, const float *,
                         const float *);
static const micro_fn MICROS[BLOCK_ROWS + 1] = {0, micro_1, micro_2, micro_3, micro_4, micro_5, micro_6
#ifdef __AVX512F__
    , micro_7, micro_8, micro_9, micro_10, micro_11, micro_12
#endif
};

/* y [m, n] = x [m, k] @ w^T + bias (bias may be NULL), w packed by toolrl_pack; 0, or -1 when m > MAX_ROWS
   or k < 1. Each task is PANELS adjacent panels; an odd last panel on AVX-512 is computed twice over (its
   second copy's results unused). */
int toolrl_gemm(const float *x, int64_t m, int64_t k, const float *packed, int64_t n, const float *bias, float *y,
                int threads) {
    if (m > MAX_ROWS || m < 0 || k <= 0) return -1;
    int64_t panels = (n + PANEL - 1) / PANEL;
    int64_t tasks = (panels + PANELS - 1) / PANELS;
    const float *end = packed + panels * k * PANEL;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t t = 0; t < tasks; ++t) {
        float acc[PANELS * MAX_ROWS * PANEL];
        int64_t p = t * PANELS;
        int held = p + PANELS <= panels ? PANELS : (int)(panels - p);
        const float *panel = packed + p * k * PANEL;
        const float *panel2 = held > 1 ? panel + k * PANEL : panel;
        for (int64_t k0 = 0; k0 < k; k0 += KC) {
            int64_t kn = k - k0 < KC ? k - k0 : KC;
            const float *ahead = panel + (k0 + PREFETCH) * PANEL, *ahead2 = panel2 + (k0 + PREFETCH) * PANEL;
            int fetch = (uintptr_t)(ahead + kn * PANEL) <= (uintptr_t)end && (uintptr_t)(ahead2 + kn * PANEL) <= (uintptr_t)end;
            for (int64_t r0 = 0; r0 < m; r0 += BLOCK_ROWS) {
                int rows = (int)(m - r0 < BLOCK_ROWS ? m - r0 : BLOCK_ROWS);
                int first_block = r0 == 0 && fetch;
                MICROS[rows](x + r0 * k + k0, k, panel + k0 * PANEL, panel2 + k0 * PANEL, kn, acc + r0 * PANEL,
                             k0 == 0, first_block ? ahead : 0, first_block ? ahead2 : 0);
            }
        }
        for (int h = 0; h < held; ++h) {
            int64_t q = p + h;
            int64_t cols = n - q * PANEL < PANEL ? n - q * PANEL : PANEL;
            for (int64_t r = 0; r < m; ++r) {
                float *out = y + r * n + q * PANEL;
                memcpy(out, acc + (h * MAX_ROWS + r) * PANEL, (size_t)cols * sizeof(float));
                if (bias)
                    for (int64_t j = 0; j < cols; ++j) out[j] += bias[q * PANEL + j];
            }
        }
    }
    return 0;
}
