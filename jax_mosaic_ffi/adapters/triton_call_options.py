"""`triton_call`'s options as jax-triton takes them: the explicit options merged into ``backend_options``
(`merged`), the autotuning configs pruned to the metaparameters given (`metaparams_apart`), and
``compute_capability`` as the target (`target`)."""

from __future__ import annotations

import copy
import dataclasses
import numbers

import numpy as np

from jax_mosaic_ffi.base.errors import LaunchError
from jax_mosaic_ffi.base.module_format import Arch
from jax_mosaic_ffi.triton.decorators import Heuristics


def target(compute_capability, where: str) -> list[int] | None:
  """``compute_capability`` (jax-triton's: ``90`` for sm_90) as `triton_kernel`'s targets; None: the default. An
  int, a numpy integer or a string of digits (what ``int()`` took before); anything else, or no arch the runtime
  loads, is a LaunchError naming the call."""
  if compute_capability is None:
    return None
  number = None
  if isinstance(compute_capability, (numbers.Integral, np.integer)) and not isinstance(compute_capability,
                                                                                      (bool, np.bool_)):
    number = int(compute_capability)
  elif isinstance(compute_capability, str) and compute_capability.strip().isdigit():
    number = int(compute_capability)
  try:
    if number is not None:
      return [Arch.parse(number).number]
  except ValueError:
    pass
  raise LaunchError(f"{where}: compute_capability={compute_capability!r} is not a compute capability; pass an int, "
                    "major * 10 + minor as jax-triton takes it (80 for sm_80, 90 for sm_90), or leave it out to "
                    "compile for the visible GPU (sm_90 where there is none)")


def merged(backend_options, num_warps, num_stages, num_ctas, debug) -> dict:
  """jax-triton's merge of the explicit options into ``backend_options``, with its errors."""
  backend_options = dict(backend_options or {})
  explicit = {"num_warps": num_warps, "num_stages": num_stages, "num_ctas": num_ctas, "debug": debug or None}
  explicit = {k: v for k, v in explicit.items() if v is not None}
  conflicts = explicit.keys() & backend_options.keys()
  if conflicts:
    raise ValueError(f"Cannot specify {conflicts} both as explicit arguments and in ``backend_options``")
  merged = {**backend_options, **explicit}  # the rest at triton_kernel's defaults, jax-triton's (4, 3, 1)
  for key, value in merged.items():
    try:
      hash(value)
    except TypeError:
      raise TypeError(f"backend_options[{key!r}] must be hashable, got {value!r}") from None
  return merged


def metaparams_apart(layers, metaparams: dict, where: str):
  """Layers whose configs agree with the caller's metaparameters (jax-triton prunes the others; values a
  config does not set are added to it), and the constexprs left for `triton_kernel` (none that a layer sets:
  a heuristic's value wins, as in Triton and jax-triton)."""
  constexprs, out = dict(metaparams), []
  for layer in layers:
    if isinstance(layer, Heuristics):
      for key, _ in layer.values:
        constexprs.pop(key, None)
      out.append(layer)
      continue
    keys = {key for config in layer.configs for key in config.kwargs}
    given = {key: constexprs.pop(key) for key in sorted(keys & constexprs.keys())}
    kept = [config for config in layer.configs if all(config.kwargs.get(k, v) == v for k, v in given.items())]
    if not kept:
      raise ValueError(f"{where}: no @triton.autotune config agrees with {given}; drop those keyword arguments or "
                       "add a config with their values")
    configs = []
    for config in kept:
      if given.keys() - config.kwargs.keys():
        config = _with_kwargs(config, {**given, **config.kwargs})
      configs.append(config)
    out.append(dataclasses.replace(layer, configs=tuple(configs)))
  return tuple(out), constexprs


def _with_kwargs(config, kwargs: dict):
  config = copy.copy(config)
  config.kwargs = dict(kwargs)
  return config
