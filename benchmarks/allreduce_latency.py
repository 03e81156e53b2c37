"""One-shot all-reduce (examples/collectives.py) against jax.lax.psum (NCCL).

Latency per call from 4 KiB to 64 MiB per device, both in the same run, over
every visible GPU. Needs two or more GPUs; prints a RESULT with a "skipped"
reason otherwise. Multicast stays off (NCCL_NVLS_ENABLE=0).
"""

import functools
import os
import sys

os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ.setdefault("JAX_MOSAIC_FFI_POISON_OUTPUTS", "0")

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
import collectives  # noqa: E402
from common import emit, median_seconds  # noqa: E402

REPEAT = 20  # calls per jit, so dispatch does not dominate small sizes


def main():
  try:
    devices = jax.devices("cuda")
  except RuntimeError:
    devices = []
  if len(devices) < 2:
    emit({"skipped": f"needs 2 or more GPUs, found {len(devices)}"})
    return
  mesh = Mesh(np.array(devices), ("x",))

  def repeated(reduce):
    def f(v):
      for _ in range(REPEAT):
        v = reduce(v) * (1.0 / len(devices))  # keep values bounded, same work for both
      return v
    return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("x"), out_specs=P("x")))

  ours = repeated(functools.partial(collectives.all_reduce, axis_name="x"))
  nccl = repeated(lambda v: jax.lax.psum(v, "x"))
  rows = []
  for size_bytes in [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]:
    n = size_bytes // 4
    x = jax.device_put(np.random.default_rng(0).standard_normal(n * len(devices)).astype(np.float32),
                       NamedSharding(mesh, P("x")))
    np.testing.assert_allclose(np.asarray(ours(x)), np.asarray(nccl(x)), rtol=1e-4, atol=1e-4)
    t_ours = median_seconds(lambda: ours(x).block_until_ready(), reps=20) / REPEAT
    t_nccl = median_seconds(lambda: nccl(x).block_until_ready(), reps=20) / REPEAT
    rows.append({"bytes": size_bytes, "ours_us": t_ours * 1e6, "psum_us": t_nccl * 1e6, "speedup": t_nccl / t_ours})
  emit({"devices": len(devices), "rows": rows})


if __name__ == "__main__":
  main()
