"""vmap of a kernel: a loop of calls (lax.map) against one call that batches.

Three ways to run B elements of the same kernel, for a small and a medium
kernel, B = 8 and 64: `jax.lax.map` over single calls (what vmap did before),
`jax.vmap` (one custom call: the runtime launches the kernel once per
element, back to back), and `jax.vmap` of a kernel written for
`batch_grid_axis="y"` (one launch, the batch on the grid's y axis).
"""

from __future__ import annotations

from benchmarks import timing
from benchmarks.markdown import failure, fmt, table
from benchmarks.suite import Run

NAME = "vmap"
TITLE = "vmap: a loop of calls against one batched call"
ORDER = 45
RUNS = (Run("main"),)

ROUNDS = 30
SIZES = {"small": 4096, "medium": 1 << 20}  # float32 elements per batch element
BATCHES = (8, 64)
STRATEGIES = {"map": "lax.map (a loop of calls)", "vmap": "vmap, a launch per element",
              "grid": "vmap, batch on grid axis y"}

# x * a + b for one element, and the same written for a batch on grid axis y.
SOURCE = r'''
extern "C" __global__ void axpb(const float* x, float* y, float a, float b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] * a + b;
}
extern "C" __global__ void axpb_batched(const float* x, float* y, float a, float b, int n,
                                        unsigned int grid_per_element, unsigned long long x_stride,
                                        unsigned long long y_stride) {
  const unsigned int element = blockIdx.y / grid_per_element;
  x = (const float*)((const char*)x + element * x_stride);
  y = (float*)((char*)y + element * y_stride);
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] * a + b;
}
'''


def _calls(jmf, np):
  common = dict(out_shape=lambda x: x, block=256, scalars=lambda x: (np.float32(2.0), np.float32(1.0),
                                                                    np.int32(x.size)))
  one = jmf.mosaic_kernel(jmf.cuda_kernel(SOURCE, "axpb"), grid=lambda x: jmf.cdiv(x.size, 256), **common)
  batched = jmf.mosaic_kernel(jmf.cuda_kernel(SOURCE, "axpb_batched"), grid=lambda x: (jmf.cdiv(x.size, 256), 1, 1),
                              batch_grid_axis="y", **common)
  return one, batched


def run(rounds: int = ROUNDS) -> dict:
  import jax
  import numpy as np

  import jax_mosaic_ffi as jmf
  one, batched = _calls(jmf, np)
  programs = {"map": jax.jit(lambda xs: jax.lax.map(one, xs)), "vmap": jax.jit(jax.vmap(one)),
              "grid": jax.jit(jax.vmap(batched))}
  rows = {}
  for size_name, n in SIZES.items():
    for b in BATCHES:
      xs = jax.random.normal(jax.random.key(b), (b, n), np.float32)
      expected = np.asarray(xs) * np.float32(2.0) + np.float32(1.0)
      for program in programs.values():  # compiled and checked outside the timing
        np.testing.assert_array_equal(np.asarray(program(xs)), expected)
      seconds = timing.interleaved({k: (lambda p=p, a=xs: p(a).block_until_ready()) for k, p in programs.items()},
                                   rounds)
      rows[f"{size_name}/{b}"] = {k: s * 1e6 for k, s in seconds.items()}
  return {"rounds": rounds, "us_per_call": rows}


def tables(results: dict) -> list[str]:
  r = results.get("main")
  why = failure(r)
  if why:
    return [f"n/a: {why}"]
  rows = []
  for key, us in r["us_per_call"].items():
    size, batch = key.split("/")
    rows.append([f"{size} ({SIZES[size]} floats)", batch, *(fmt(us.get(s)) for s in STRATEGIES),
                 fmt(us["map"] / us["vmap"]), fmt(us["map"] / us["grid"])])
  header = ["kernel", "B", *(f"{label} (us)" for label in STRATEGIES.values()), "map / vmap", "map / grid"]
  method = (f"One jitted call over B elements of `y = 2x + 1`, host-timed, median of {r['rounds']} rounds with the "
            "three ways interleaved; each checked against numpy first. Ratios above 1: batching is faster.")
  return [method + "\n\n" + table(header, rows, "lrrrrrr")]
