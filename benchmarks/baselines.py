"""The custom calls mosaic_kernel is compared with, registered once per process.

Both come from jax_mosaic_ffi._benchmark_targets, an extension built only
on request (pip install . --config-settings=cmake.define.JMF_BENCHMARK_TARGETS=ON):
a plain hand-made jax.ffi launch handler (decodes its attributes and calls
cuLaunchKernel on every call) and an empty handler (launches nothing). Both
are execute-only handlers: inside command buffers XLA stream-captures each
into a child-graph node, where mosaic_kernel records a kernel node.
"""

from __future__ import annotations

import functools

PLAIN_TARGET = "jax_mosaic_ffi_bench_plain"
EMPTY_TARGET = "jax_mosaic_ffi_bench_empty"
BUILD_HINT = ("jax_mosaic_ffi._benchmark_targets is not built: install with "
              "pip install . --config-settings=cmake.define.JMF_BENCHMARK_TARGETS=ON")


@functools.cache
def register() -> None:
  """Registers both targets with XLA (once: a second registration is refused)."""
  import jax
  from jax._src.lib import xla_client
  try:
    from jax_mosaic_ffi import _benchmark_targets
  except ImportError as e:
    raise RuntimeError(BUILD_HINT) from e
  for name, handler in ((PLAIN_TARGET, _benchmark_targets.baseline_ffi_handler()),
                        (EMPTY_TARGET, _benchmark_targets.empty_ffi_handler())):
    jax.ffi.register_ffi_target(name, {"execute": handler}, platform="CUDA", api_version=1,
                                traits=xla_client.CustomCallTargetTraits.COMMAND_BUFFER_COMPATIBLE)


def plain_ffi(size: int, function: int = 0, *, n: int | None = None):
  """x -> float32[size] from launching CUfunction `function`(x, out, n) as one block of
  `size` threads. Function 0 suits programs that are compiled and never run; `n`
  (default `size`) lets otherwise equal programs differ, to miss XLA's caches."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  register()
  call = jax.ffi.ffi_call(PLAIN_TARGET, jax.ShapeDtypeStruct((size,), jnp.float32))
  n = size if n is None else n
  return lambda x: call(x, function=np.int64(int(function)), grid=np.int32(1), block=np.int32(size),
                        n=np.int32(n))


def empty_ffi(n: int):
  """x -> a float32[n] that nothing writes: an execute-only custom call that launches
  nothing (inside command buffers, XLA captures it into a child-graph node)."""
  import jax
  import jax.numpy as jnp
  register()
  return jax.ffi.ffi_call(EMPTY_TARGET, jax.ShapeDtypeStruct((n,), jnp.float32))
