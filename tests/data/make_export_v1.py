"""Makes add_v1.jax_export: a program exported with contract version 1.

Checked in once and never regenerated; tests/test_export.py runs it to prove
that programs exported by this release keep running on later ones.

    python tests/data/make_export_v1.py
"""

import os

import jax
import jax.numpy as jnp
import numpy as np

import jax_mosaic_ffi as jmf

SOURCE = r'''
extern "C" __global__ void scaled_add(const float* a, const float* b, float* out, float scale, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] * scale + b[i];
}
'''
N = 4096


def main():
  kernel = jmf.cuda_kernel(SOURCE, "scaled_add", targets=("sm_90",))
  call = jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct((N,), jnp.float32), grid=N // 256, block=256,
                           scalars=(np.float32(3.0), np.int32(N)))
  spec = jax.ShapeDtypeStruct((N,), jnp.float32)
  exported = jax.export.export(jax.jit(call), platforms=["cuda"],
                               disabled_checks=jmf.export_disabled_checks())(spec, spec)
  path = os.path.join(os.path.dirname(__file__), "add_v1.jax_export")
  with open(path, "wb") as f:
    f.write(exported.serialize())
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
