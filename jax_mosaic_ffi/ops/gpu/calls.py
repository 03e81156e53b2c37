"""What every op of `jax_mosaic_ffi.ops.gpu` shares when it builds its kernel calls: the kernels' modules,
imported where a call is first built (Triton is optional, so ``import jax_mosaic_ffi`` never imports them), the
calls kept per static configuration, and the small rules of thumb (padding a head dimension, a dot's precision,
autotuning configs clamped to the problem)."""

from __future__ import annotations

import functools
import importlib
from typing import Any, Callable, Iterable, Mapping

import jax.numpy as jnp
import numpy as np

from jax_mosaic_ffi.triton.compiler.release import require_triton

# The kernels' modules, under jax_mosaic_ffi/ops/gpu/kernels/.
_KERNELS = "jax_mosaic_ffi.ops.gpu.kernels."


def kernels(name: str):
  """The module of Triton kernels ``name`` (``"attention_forward"``, ...), imported now; TritonUnavailable
  (saying what to install) where Triton is missing or of an unsupported release."""
  require_triton()
  return importlib.import_module(_KERNELS + name)


def cached(build: Callable) -> Callable:
  """``build`` (a function of hashable static values returning a call) made once per distinct value: one traced
  program, one autotuning decision and one compile per configuration of an op."""
  return functools.lru_cache(maxsize=256)(build)


def next_pow2(n: int) -> int:
  return 1 << max(int(n) - 1, 0).bit_length()


def padded(n: int, least: int = 16) -> int:
  """A block dimension covering ``n``: the next power of two, at least ``least`` (what ``tl.dot`` takes)."""
  return max(least, next_pow2(n))


def precision(dtype) -> str:
  """``tl.dot``'s input precision: exact float32 products for float32 (as jax's Pallas kernels lower a float32
  dot), tensor cores' own for 16-bit inputs."""
  return "ieee" if jnp.dtype(dtype) == jnp.float32 else "tf32"


def clamp_configs(configs: Iterable[Mapping[str, Any]], limits: Mapping[str, int]) -> list[dict]:
  """``configs`` with each block no larger than its limit (a problem smaller than a block gets a smaller block),
  duplicates dropped, order kept (the first is the default where nothing is timed)."""
  out: list[dict] = []
  for config in configs:
    clamped = {key: (min(value, limits[key]) if key in limits else value) for key, value in config.items()}
    if clamped not in out:
      out.append(clamped)
  return out


def config(num_warps: int, num_stages: int, **blocks: int) -> dict:
  return {**blocks, "num_warps": num_warps, "num_stages": num_stages}


def shape_key(*arrays) -> tuple:
  """The shapes and dtypes of ``arrays`` (None stays None), as a key of `cached` builds."""
  return tuple(None if a is None else (tuple(a.shape), str(jnp.dtype(a.dtype))) for a in arrays)


def i32(value) -> np.int32:
  return np.int32(value)


def f32(value) -> np.float32:
  return np.float32(value)
