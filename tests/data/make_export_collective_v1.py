"""Makes scaled_sum_collective_v1.jax_export: a collective kernel under shard_map, exported with contract version 1.

A one-device clique (device 0), so that it runs on any GPU: out = 3 * (x summed over the ranks, read through the
peer table) + 1000 * rank + num_peers, after the device barrier. Checked in once and never regenerated;
tests/test_export.py runs it to prove that collective programs exported by this release keep running on later ones.

    python tests/data/make_export_collective_v1.py
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec as P

import jax_mosaic_ffi as jmf

SOURCE = r'''
#include <jax_mosaic_ffi/collective.cuh>
extern "C" __global__ void scaled_sum(const float* x, float* out, float scale, int n,
                                      const jmf::CollectiveMetadata* meta) {
  const int peers = jmf::num_peers(meta);
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    float acc = 0.0f;
    for (int r = 0; r < peers; ++r) acc += jmf::peer_ptr<const float>(meta, 0, r)[i];
    out[i] = scale * acc + 1000.0f * jmf::rank(meta) + peers;
  }
}
'''
N = 4096


def main():
  kernel = jmf.cuda_kernel(SOURCE, "scaled_sum", targets=("sm_90",))
  call = jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct((N,), jnp.float32), grid=16, block=256,
                           scalars=(np.float32(3.0), np.int32(N)), collective=jmf.Collective("x"))
  mesh = Mesh(np.array(jax.devices()[:1]), ("x",))
  f = jax.shard_map(call, mesh=mesh, in_specs=P("x"), out_specs=P("x"))
  exported = jax.export.export(jax.jit(f), platforms=["cuda"],
                               disabled_checks=jmf.export_disabled_checks())(jax.ShapeDtypeStruct((N,), jnp.float32))
  path = os.path.join(os.path.dirname(__file__), "scaled_sum_collective_v1.jax_export")
  with open(path, "wb") as f:
    f.write(exported.serialize())
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
