/* The SwiGLU feed-forward's elementwise backward in one pass, fp32, AVX2 + FMA or AVX-512, threads from OpenMP.

   Written with PyTorch ops (models/fused.py), the backward of down(silu(gate) * up) reads and writes the
   intermediate-size tensors some ten times (sigmoid, the product again for the down weight's gradient, and each
   factor of both gradients); at a 4.9k-token prompt they are 30 MB each, so the pass is memory-bound. Here each
   element of gate, up and the product's gradient is read once, and the product, the gate's and the up's gradients
   written once. Built beside flash.c into one library by toolrl/models/native/__init__.py. */

#include "vec.h"

/* For n elements: sig = sigmoid(gate), silu = gate * sig; product = silu * up, grad_up = grad * silu,
   grad_gate = grad * up * sig * (1 + gate * (1 - sig)). Any output may be NULL (not computed). */
void toolrl_swiglu_backward(const float *grad, const float *gate, const float *up, float *product, float *grad_gate,
                            float *grad_up, int64_t n, int threads) {
    const int64_t chunk = 4096; /* elements a task: a multiple of W */
    int64_t tasks = (n + chunk - 1) / chunk;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t t = 0; t < tasks; ++t) {
        int64_t start = t * chunk, end = start + chunk < n ? start + chunk : n, i = start;
        const vf one = vset1(1.0f);
        for (; i + W <= end; i += W) {
            vf g = vload(gate + i), u = vload(up + i), d = vload(grad + i);
            vf sig = vdiv(one, vadd(one, vexp(vsub(vzero(), g))));
            vf silu = vmul(g, sig);
            if (product) vstore(product + i, vmul(silu, u));
            if (grad_up) vstore(grad_up + i, vmul(d, silu));
            if (grad_gate) vstore(grad_gate + i, vmul(vmul(vmul(d, u), sig), vfma(g, vsub(one, sig), one)));
        }
        for (; i < end; ++i) {
            float g = gate[i], u = up[i], d = grad[i];
            float sig = 1.0f / (1.0f + expf(-g)), silu = g * sig;
            if (product) product[i] = silu * u;
            if (grad_up) grad_up[i] = d * silu;
            if (grad_gate) grad_gate[i] = d * u * sig * (1.0f + g * (1.0f - sig));
        }
    }
}
