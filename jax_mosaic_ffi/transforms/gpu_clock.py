"""GPU time between two points of a jitted program, read from the GPU's own clock.

Host timers around an executable count JAX's dispatch and, inside command buffers, XLA's re-recording of a
graph whose outputs moved: measured on an H200, a 190 us matmul read as 240 us that way, enough to reorder
autotuning configs. `timed(body)` brackets `body` with two one-thread kernels that write `%globaltimer`: the
first runs before anything of `body` (its inputs pass through an optimization barrier with the first stamp),
the second after `body`'s last results are complete (it reads them, and it is compiled PDL-safe, so it waits
for the kernel before it). `repeated(call, n)` makes a call n times in one program, so that a fast kernel's
time is read over enough work. The autotuner times configs with them; the benchmarks time kernels with them.
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jax_mosaic_ffi.call import primitive
from jax_mosaic_ffi.call.launch_options import CheckedLaunch, LaunchOptions
from jax_mosaic_ffi.toolchain import kernel

SOURCE = r'''
__device__ __forceinline__ void write_clock(unsigned int* t) {
  unsigned long long now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  t[0] = (unsigned int)now;
  t[1] = (unsigned int)(now >> 32);
}
extern "C" __global__ void clock_before(const char* first_input, unsigned int* t) {
  if (threadIdx.x == 0) write_clock(t);
}
extern "C" __global__ void clock_after(const char* a, const char* b, const char* c, const char* d, unsigned int* t) {
  if (threadIdx.x == 0) write_clock(t);
}
'''

_STAMP = jax.ShapeDtypeStruct((2,), jnp.uint32)
_AFTER_READS = 4  # clock_after's buffer parameters: the body's last results it waits for


@functools.cache
def _stamps():
  def call(symbol):
    options = LaunchOptions(grid=1, block=32)
    launch = CheckedLaunch.create(kernel.cuda_kernel(SOURCE, symbol), _STAMP, options, f"jax_mosaic_ffi {symbol}")
    return primitive.kernel_call(launch, None)
  return call("clock_before"), call("clock_after")


def timed(body: Callable) -> Callable:
  """``body`` as a function returning ``(nanoseconds stamp before, stamp after, body's results)``; the stamps
  are uint32[2] arrays for `nanoseconds`. ``body`` needs at least one array input and one array result."""
  before, after = _stamps()

  def program(*xs):
    leaves, tree = jax.tree.flatten(xs)
    start = before(leaves[0])
    leaves, start = jax.lax.optimization_barrier((leaves, start))
    results = body(*jax.tree.unflatten(tree, leaves))
    last = jax.tree.leaves(results)[-_AFTER_READS:]
    if not last:
      raise ValueError("gpu_clock.timed: the timed function returned no arrays")
    stop = after(*(last + last[:1] * (_AFTER_READS - len(last))))
    return start, stop, results
  return program


def repeated(call: Callable, repeats: int) -> Callable:
  """`call` made `repeats` times in one program, each after the previous (its inputs pass through an
  optimization barrier with the previous results, so XLA neither merges the calls nor reorders them). Every
  call's results are returned: XLA drops a call whose results only an optimization barrier uses."""
  if repeats == 1:
    return call

  def program(*xs):
    outputs = []
    for k in range(repeats):
      if k:
        xs, _ = jax.lax.optimization_barrier((xs, outputs[-1]))
      outputs.append(call(*xs))
    return outputs
  return program


def nanoseconds(stamp) -> int:
  """The GPU clock value (ns) in a stamp."""
  low, high = (int(w) for w in np.asarray(stamp))
  return high << 32 | low


def elapsed_s(start, stop) -> float:
  return (nanoseconds(stop) - nanoseconds(start)) / 1e9
