"""The CUDA C++ tiled matmul (tiled_matmul.cu) as one config's `mosaic_kernel` call, for `jmf.autotune`: the
autotune benchmark and the tests tune this very call.

    tuned = jmf.autotune(tiled_matmul.call, configs=[dict(BM=64, BN=64, BK=16, TM=4, TN=4), ...])
    c = jax.jit(tuned)(a, b)   # fp32, row-major, any M, N, K; its fallback: jnp.matmul at full precision
"""

import os

SOURCE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tiled_matmul.cu")


def call(meta: dict):
  """C = A @ B with the tile sizes of ``meta`` (BM, BN, BK, TM, TN: the source's -D options)."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  import jax_mosaic_ffi as jmf
  with open(SOURCE_PATH) as f:
    source = f.read()
  kernel = jmf.cuda_kernel(source, "tiled_matmul", options=[f"-D{k}={v}" for k, v in sorted(meta.items())])
  return jmf.mosaic_kernel(
      kernel, lambda a, b: jax.ShapeDtypeStruct((a.shape[0], b.shape[1]), jnp.float32),
      grid=lambda a, b: (jmf.cdiv(b.shape[1], meta["BN"]), jmf.cdiv(a.shape[0], meta["BM"])),
      block=(meta["BN"] // meta["TN"], meta["BM"] // meta["TM"]),
      scalars=lambda a, b: (np.int32(a.shape[0]), np.int32(b.shape[1]), np.int32(a.shape[1])),
      fallback=reference)


def reference(a, b):
  """What the kernel computes, in jax.numpy: its fallback (jmf.check and the shadow mode compare with it)."""
  import jax.numpy as jnp
  return jnp.matmul(a, b, precision="highest")
