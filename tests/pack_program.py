"""A program with a kernel of every front end, for the kernel-pack tests (tests/test_packs.py): what a pack is
recorded from, and what loads it.

    python pack_program.py lower [front ends]   lowers every call for CUDA (no GPU needed); prints the cache counters
    python pack_program.py run FRONT_ENDS SEED  on a GPU: runs every call on random inputs of that seed (the test draws
                                                a fresh one), checks each against numpy, prints the outputs' sha256
                                                and the counters
    python pack_program.py new                  compiles a CUDA kernel no pack holds (it must fail without NVRTC)

Front ends: cuda (CUDA C++ reading <cuda_fp16.h> from disk), template (a CUDA C++ template reading CCCL), tuned (an
autotuned CUDA kernel with a fallback), triton, gluon, cute (where the CuTe DSL is installed); all by default, and
targets (the template for arch-specific and family targets, targets=) when named. The last line printed is JSON.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

import jax_mosaic_ffi as jmf

SCALE_ADD = r'''
#include <cuda_fp16.h>
extern "C" __global__ void scale_add(const float* x, const float* y, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __half2float(__float2half(2.0f)) * x[i] + y[i];
}
'''

TRIPLE = r'''
extern "C" __global__ void triple(const float* x, float* y, int n) {
  int first = (blockIdx.x * blockDim.x + threadIdx.x) * ITEMS;
  for (int k = 0; k < ITEMS; ++k) if (first + k < n) y[first + k] = 3.0f * x[first + k];
}
'''

# A template kernel (named by an expression) that reads CCCL: NVRTC gives its internal-linkage symbols (CCCL's
# customization points) a random name unless seeded, so its bytes show whether a build is reproducible.
SCALE_ADD_TEMPLATE = r'''
#include <cuda/std/array>
template <int SCALE>
__global__ void scale_add_t(const float* x, const float* y, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = SCALE * x[i] + y[i];
}
'''

N = 4096


def cuda_call():
  kernel = jmf.cuda_kernel(SCALE_ADD, "scale_add")
  return (jmf.mosaic_kernel(kernel, lambda x, y: x, grid=lambda x, y: jmf.cdiv(x.size, 256), block=256,
                            scalars=lambda x, y: (np.int32(x.size),), fallback=lambda x, y: 2 * x + y),
          lambda x, y: 2 * x + y, 2)


def template_call(targets=None):
  kernel = jmf.cuda_kernel(SCALE_ADD_TEMPLATE, "scale_add_t<2>", targets=targets)
  return (jmf.mosaic_kernel(kernel, lambda x, y: x, grid=lambda x, y: jmf.cdiv(x.size, 256), block=256,
                            scalars=lambda x, y: (np.int32(x.size),), fallback=lambda x, y: 2 * x + y),
          lambda x, y: 2 * x + y, 2)


def tuned_call():
  def factory(meta):
    kernel = jmf.cuda_kernel(TRIPLE, "triple", options=[f"-DITEMS={meta['ITEMS']}"])
    return jmf.mosaic_kernel(kernel, lambda x: x, block=meta["BLOCK"], fallback=lambda x: 3 * x,
                             grid=lambda x: jmf.cdiv(x.size, meta["BLOCK"] * meta["ITEMS"]),
                             scalars=lambda x: (np.int32(x.size),))
  tuned = jmf.autotune(factory, configs=[{"BLOCK": 128, "ITEMS": 1}, {"BLOCK": 256, "ITEMS": 4}],
                       name="pack_program.triple")
  return tuned, lambda x: 3 * x, 1


def triton_call():
  import triton
  import triton.language as tl

  @triton.jit
  def add_scaled(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    tl.store(out_ptr + i, tl.load(x_ptr + i, mask=mask) * 0.5 + tl.load(y_ptr + i, mask=mask), mask=mask)

  kernel = jmf.triton_kernel(add_scaled, constexprs={"BLOCK": 512})
  return (jmf.mosaic_kernel(kernel, lambda x, y: x, grid=lambda meta, x, y: jmf.cdiv(x.size, meta["BLOCK"]),
                            scalars=lambda meta, x, y: (np.int32(x.size),), fallback=lambda x, y: 0.5 * x + y),
          lambda x, y: 0.5 * x + y, 2)


def gluon_call():
  import benchmarks_package
  gluon = benchmarks_package.kernels("gluon_user")
  kernel = jmf.gluon_kernel(gluon.add_one, constexprs={"BLOCK": 512})
  return (jmf.mosaic_kernel(kernel, lambda x: x, grid=lambda meta, x: jmf.cdiv(x.size, 512),
                            scalars=lambda meta, x: (np.int32(x.size),), fallback=lambda x: x + 1),
          lambda x: x + 1, 1)


def cute_call():
  import benchmarks_package
  elementwise = benchmarks_package.kernels("cute_elementwise")
  return (jmf.mosaic_kernel(jmf.cute_kernel(elementwise.add_one), lambda x: x, fallback=lambda x: x + 1),
          lambda x: x + 1, 1)


# Last: the lines of the calls above are in their Triton keys, which tests/data/jax0112.jmfpack holds.
def targets_call():
  return template_call(targets=["sm_90a", "sm_100a", "sm_120a", "sm_100f", "sm_120f"])


CALLS = {"cuda": cuda_call, "template": template_call, "targets": targets_call, "tuned": tuned_call,
         "triton": triton_call, "gluon": gluon_call, "cute": cute_call}
DEFAULT = [name for name in CALLS if name != "targets"]


def counters() -> dict:
  stats = dataclasses.asdict(jmf.kernel_cache_stats())
  keys = ("compiles", "pack_hits", "disk_hits", "memory_hits",
          "autotune_tunings", "autotune_pack_hits", "autotune_disk_hits", "autotune_skipped")
  return {k: stats[k] for k in keys}


def main(mode: str, names: list[str], seed: int = 0) -> dict:
  if mode == "new":
    jmf.cuda_kernel('extern "C" __global__ void not_packed(float* y) { y[0] = 1.0f; }', "not_packed")
    return {"compiled": True}
  found = {}
  avals = jax.ShapeDtypeStruct((N,), jnp.float32)
  for name in names:
    call, reference, arity = CALLS[name]()
    if mode == "lower":
      jax.jit(call).trace(*[avals] * arity).lower(lowering_platforms=("cuda",))
      found[name] = "lowered"
      continue
    rng = np.random.default_rng(seed)
    inputs = [rng.standard_normal(N).astype(np.float32) for _ in range(arity)]
    got = np.asarray(jax.jit(call)(*inputs))
    np.testing.assert_allclose(got, np.asarray(reference(*inputs)), rtol=1e-6, atol=1e-6)
    found[name] = {"inputs": [hashlib.sha256(x.tobytes()).hexdigest() for x in inputs],
                   "outputs": hashlib.sha256(got.tobytes()).hexdigest()}
  return {"calls": found, "counters": counters(), "report": [(d["name"], d["source"]) for d in jmf.autotune_report()]}


if __name__ == "__main__":
  chosen = sys.argv[2].split(",") if len(sys.argv) > 2 and sys.argv[2] else DEFAULT
  print(json.dumps(main(sys.argv[1], chosen, int(sys.argv[3]) if len(sys.argv) > 3 else 0)))
