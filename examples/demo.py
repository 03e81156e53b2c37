"""jax_mosaic_ffi in one page: a CUDA C++ kernel inside jax.jit.

Compiles a kernel with NVRTC, lowers a jitted function that calls it, and,
on a machine with an NVIDIA GPU, runs it and checks it against numpy. Without
a GPU it still compiles and lowers, checks the lowered custom call, and says
what it could not run. Everywhere it also runs the kernel's jax.numpy
fallback on the CPU and checks that against numpy.
"""

import hashlib
import warnings

import jax
import jax.numpy as jnp
import numpy as np

import jax_mosaic_ffi as jmf
from jax_mosaic_ffi.base import gpu_info

SOURCE = r'''
#include <cuda_bf16.h>

// y = softplus(x) * scale + bias, in bf16 with float math.
extern "C" __global__ void softplus_affine(const __nv_bfloat16* x, const float* bias, __nv_bfloat16* y,
                                          float scale, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    float v = __bfloat162float(x[i]);
    float s = v > 20.0f ? v : log1pf(expf(v));
    y[i] = __float2bfloat16(s * scale + bias[i]);
  }
}
'''


def reference(x, bias):
  """What the kernel computes, in jax.numpy: its fallback off the GPU."""
  v = x.astype(jnp.float32)
  return (jnp.where(v > 20, v, jnp.log1p(jnp.exp(v))) * 0.5 + bias).astype(jnp.bfloat16)


def expected(x, bias):
  xf = x.astype(np.float32)
  return (np.where(xf > 20, xf, np.log1p(np.exp(xf))) * 0.5 + bias).astype(jnp.bfloat16).astype(np.float32) * 2


def main():
  # Without a GPU the package warns once that kernels cannot run here; the demo's last line says so itself.
  warnings.filterwarnings("ignore", category=gpu_info.NoGpuWarning)
  n = 1 << 20
  kernel = jmf.cuda_kernel(SOURCE, "softplus_affine")
  print(f"compiled {kernel} with NVRTC; parameters of {kernel.param_sizes} bytes")

  softplus_affine = jmf.mosaic_kernel(
      kernel, jax.ShapeDtypeStruct((n,), jnp.bfloat16),
      grid=(n + 255) // 256, block=256, scalars=(np.float32(0.5), np.int32(n)), fallback=reference)

  @jax.jit
  def model(x, bias):
    return softplus_affine(x, bias) * 2  # the kernel's output feeds ordinary JAX ops

  x_spec = jax.ShapeDtypeStruct((n,), jnp.bfloat16)
  bias_spec = jax.ShapeDtypeStruct((n,), jnp.float32)
  hlo = model.trace(x_spec, bias_spec).lower(lowering_platforms=("cuda",)).as_text()
  line = next(text for text in hlo.splitlines() if "jax_mosaic_ffi_launch_v1" in text)
  assert "kernel_name = \"softplus_affine\"" in line and "grid = array<i32: 4096, 1, 1>" in line
  print(f"lowered for CUDA: one custom call to jax_mosaic_ffi_launch_v1, module of {len(kernel.module)} bytes, "
        f"kernel_hash {hashlib.sha256(kernel.module).hexdigest()[:16]}...")

  rng = np.random.default_rng()
  x = rng.standard_normal(n).astype(jnp.bfloat16)
  bias = rng.standard_normal(n).astype(np.float32)
  with jax.default_device(jax.devices("cpu")[0]):
    y_cpu = np.asarray(model(x, bias)).astype(np.float32)
  np.testing.assert_allclose(y_cpu, expected(x, bias), rtol=2e-2, atol=2e-2)
  print(f"ran the jax.numpy fallback on the CPU: matches numpy on {n} random inputs")

  try:
    gpus, error = jax.devices("cuda"), None
  except RuntimeError as e:
    gpus, error = [], str(e)
  if not gpus:
    print(f"{gpu_info.gpu_unavailable_reason(0, 1, error)}: compiled and lowered, but did not run the kernel. "
          "On a GPU machine this demo also runs it and checks it against numpy.")
    return

  y = np.asarray(model(x, bias)).astype(np.float32)
  np.testing.assert_allclose(y, expected(x, bias), rtol=2e-2, atol=2e-2)
  np.testing.assert_allclose(y, y_cpu, rtol=2e-2, atol=2e-2)
  print(f"ran on {gpus[0].device_kind}: matches numpy (and the fallback) on {n} random inputs")
  print(jmf.kernel_cache_stats())


if __name__ == "__main__":
  main()
