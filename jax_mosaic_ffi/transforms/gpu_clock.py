"""GPU time between two points of a jitted program, read from the GPU's own clock.

Host timers around an executable count JAX's dispatch and, inside command buffers, XLA's re-recording of a
graph whose outputs moved: measured on an H200, a 190 us matmul read as 240 us that way, enough to reorder
autotuning configs. `timed(body)` brackets `body` with two one-thread kernels that write `%globaltimer`: the
first runs before anything of `body` (its inputs pass through an optimization barrier with the first stamp),
the second after `body`'s last results are complete (it reads them, and from Hopper on it is PDL-safe, so it waits
for the kernel before it). `repeated(call, n)` makes a call n times in one program, so that a fast kernel's
time is read over enough work. The autotuner times configs with them; the benchmarks time kernels with them.
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jax_mosaic_ffi.base.module_format import FLAG_PDL_WAIT, Arch, Image, ImageKind, ParsedModule
from jax_mosaic_ffi.call import primitive
from jax_mosaic_ffi.call.launch_options import CheckedLaunch
from jax_mosaic_ffi.toolchain.compiled import Compiled, param_sizes
from jax_mosaic_ffi.toolchain.kernel import PDL_MIN_ARCH, Kernel, visible_targets

# The stamps are written in PTX, as the runtime's own kernels are (csrc/driver/runtime_kernels.cc), so timing
# needs no compiler: thread 0 writes %globaltimer's 64 bits as two 32-bit words (low, high) to the last
# parameter, a uint32[2] buffer. From Hopper on the entry first waits for the kernel before it (PDL-safe,
# griddepcontrol), so the stamp launches early and reads the clock the moment that kernel is done.
_STAMP_BODY = """
.visible .entry {name}({params}.param .u64 stamp)
{{
    .reg .pred %p1;
    .reg .b32 %r<4>;
    .reg .b64 %rd<4>;
{wait}
    mov.u32 %r1, %tid.x;
    setp.ne.u32 %p1, %r1, 0;
    @%p1 bra DONE;
    ld.param.u64 %rd1, [stamp];
    cvta.to.global.u64 %rd2, %rd1;
    mov.u64 %rd3, %globaltimer;
    mov.b64 {{%r2, %r3}}, %rd3;
    st.global.u32 [%rd2], %r2;
    st.global.u32 [%rd2+4], %r3;
DONE:
    ret;
}}
"""
_PDL_WAIT = "    griddepcontrol.wait;\n    griddepcontrol.launch_dependents;"

_STAMP = jax.ShapeDtypeStruct((2,), jnp.uint32)
_AFTER_READS = 4  # clock_after's buffer parameters: the body's last results it waits for


def stamp_ptx(symbol: str, reads: int, arch: int) -> str:
  """The PTX of a stamp that takes ``reads`` buffers before its own, for GPUs of ``arch`` and newer."""
  pdl = arch >= PDL_MIN_ARCH
  header = ".version 7.8\n.target sm_90\n" if pdl else ".version 7.0\n.target sm_70\n"
  params = "".join(f".param .u64 read{k}, " for k in range(reads))
  return header + ".address_size 64\n" + _STAMP_BODY.format(name=symbol, params=params,
                                                             wait=_PDL_WAIT if pdl else "")


def _stamp_kernel(symbol: str, reads: int) -> Kernel:
  arch = min(a.number for a in visible_targets())  # this GPU's clock: never JAX_MOSAIC_FFI_TARGETS'
  text = stamp_ptx(symbol, reads, arch)
  pdl = arch >= PDL_MIN_ARCH
  parsed = ParsedModule(symbol, (Image(ImageKind.PTX, Arch(PDL_MIN_ARCH if pdl else 70), text.encode()),),
                        FLAG_PDL_WAIT if pdl else 0)
  return Kernel(symbol, Compiled.of(parsed, param_sizes(parsed)))


@functools.cache
def _stamps():
  def call(symbol, reads):
    kernel = _stamp_kernel(symbol, reads)
    launch = CheckedLaunch(kernel=kernel, out_shape=_STAMP, grid=(1, 1, 1), block=(32, 1, 1), cluster=(1, 1, 1),
                           smem_bytes=0, uses_pdl=kernel.pdl_safe, scalars=(), aliases=(), param_order=None,
                           collective=None)
    return primitive.kernel_call(launch, None)
  return call("clock_before", 1), call("clock_after", _AFTER_READS)


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
