"""Makes add_v2.jax_export: a program exported with contract version 2 (launch programs on a symbolic size).

Checked in once and never regenerated; tests/test_export.py runs it to prove that programs whose grid and scalars
follow their inputs' shapes, exported by this release, keep running on later ones.

    python tests/data/make_export_v2.py
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


def main():
  kernel = jmf.cuda_kernel(SOURCE, "scaled_add", targets=("sm_90",))
  call = jmf.mosaic_kernel(kernel, lambda a, b: jax.ShapeDtypeStruct(a.shape, a.dtype),
                           grid=lambda a, b: jmf.cdiv(a.shape[0], 256), block=256,
                           scalars=lambda a, b: (np.float32(3.0), jmf.dim_scalar(a.shape[0], np.int32)))
  (n,) = jax.export.symbolic_shape("n")
  spec = jax.ShapeDtypeStruct((n,), jnp.float32)
  exported = jax.export.export(jax.jit(call), platforms=["cuda"],
                               disabled_checks=jmf.export_disabled_checks())(spec, spec)
  path = os.path.join(os.path.dirname(__file__), "add_v2.jax_export")
  with open(path, "wb") as f:
    f.write(exported.serialize())
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
