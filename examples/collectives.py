"""An all-reduce written as a collective kernel, inside shard_map.

The kernels live in jax_mosaic_ffi/ops/collectives.py (read it: each device
reads its peers' buffers directly through the collective metadata). This
script runs the all-reduce over every visible GPU and checks it against
numpy; with one GPU it is a one-device clique.

    python examples/collectives.py
"""

import functools

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

import jax_mosaic_ffi as jmf


def main():
  try:
    gpus = jax.devices("cuda")
  except RuntimeError:
    print("no NVIDIA GPU here: nothing to run")
    return
  mesh = jax.make_mesh((len(gpus),), ("x",), devices=gpus)
  all_reduce = jax.jit(jax.shard_map(functools.partial(jmf.ops.all_reduce, axis_name="x"), mesh=mesh,
                                     in_specs=P("x"), out_specs=P("x")))
  x = np.random.default_rng().standard_normal(len(gpus) * 4096).astype(np.float32)
  expected = np.tile(x.reshape(len(gpus), -1).sum(0), len(gpus))
  np.testing.assert_allclose(np.asarray(all_reduce(x)), expected, rtol=1e-5, atol=1e-5)
  print(f"all-reduce over {len(gpus)} GPU(s) matches numpy")


if __name__ == "__main__":
  main()
