// AdamW optimizer step, in place: the parameters and both moment buffers are
// read and written through one pointer each; the gradients are read only.
//
// Mirrors: fused optimizer kernels as in llm.c and Apex's multi-tensor Adam
// (one thread per parameter, bias corrections passed in precomputed,
// decoupled weight decay, `long long` element count).
// Our own code, written for jax_mosaic_ffi's test corpus; Apache-2.0, this project.
#include <math.h>

extern "C" __global__ void adamw_step(float* __restrict__ params, float* __restrict__ m,
                                      float* __restrict__ v, const float* __restrict__ grads,
                                      float lr, float beta1, float beta2, float beta1_correction,
                                      float beta2_correction, float eps, float weight_decay,
                                      long long n) {
  const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float g = grads[i];
  const float mi = beta1 * m[i] + (1.0f - beta1) * g;
  const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
  m[i] = mi;
  v[i] = vi;
  const float m_hat = mi / beta1_correction;
  const float v_hat = vi / beta2_correction;
  const float p = params[i];
  params[i] = p - lr * (m_hat / (sqrtf(v_hat) + eps) + weight_decay * p);
}
