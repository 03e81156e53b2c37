"""Triton's compile options besides the constexprs, as one frozen object: `TritonOptions`.

`triton_kernel(fn, num_warps=..., options={...})`, a ``triton.Config``, a heuristic or an autotuning config set
them; the object travels whole from there to Triton's compile and our cache key, so adding one is one field here.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping

from jax_mosaic_ffi.base.errors import LaunchError
from jax_mosaic_ffi.triton.compiler import keys as triton_keys

# What a config or a heuristic may set besides constexprs: TritonOptions' fields, by name.
LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")
# Floating-point fusion (a * b + c as one FMA), given to every compile that sets neither the option nor Triton's
# TRITON_DEFAULT_FP_FUSION: the default of every supported Triton (3.6-3.9), pinned, so that a kernel computes what
# it computed (3.10 will default to off), and Triton 3.9 does not warn at each process's first compile that it
# picked its default for us.
FP_FUSION = True
# num_ctas > 1 launches clusters of CTAs, which GPUs have from Hopper on.
MIN_CLUSTER_ARCH = 90
# The bounds of each launch option, checked before Triton sees them: a compile is stopped only at
# JAX_MOSAIC_FFI_COMPILE_TIMEOUT_S (5 minutes by default; toolchain/forked_compile.py), and Triton hands
# ptxas whatever it is given (num_warps=2**40 runs ptxas for minutes and gigabytes before anything refuses it).
# num_warps: a block has at most 1024 threads (Triton wants a power of two); num_ctas: a cluster at most 16 blocks
# (non-portable, Hopper and Blackwell); num_stages: software pipelines of a few stages (shared memory runs out long
# before 32); maxnreg: PTX's .maxnreg, at most 255 registers a thread.
BOUNDS = {"num_warps": 32, "num_stages": 32, "num_ctas": 16, "maxnreg": 255}
_POWERS_OF_TWO = ("num_warps",)

# Triton compile options that `triton_kernel(options=)` may not set, each with why and what instead. The rest of
# the NVIDIA backend's options (enable_fp_fusion, debug, extern_libs, default_dot_input_precision, ...) go to
# Triton as given.
_REFUSED = {
    **{key: f"pass {key}= itself" for key in LAUNCH_OPTIONS},
    "arch": "the target comes from targets= (triton_call: compute_capability=)",
    "backend_name": "the backend is CUDA's",
    "warp_size": "the warp size is the target's (32)",
    "launch_cooperative_grid": "jax_mosaic_ffi does not make cooperative grid launches",
    "launch_pdl": "programmatic dependent launch follows the kernel: one that calls tl.extra.cuda.gdc_wait() "
                  "launches with it (mosaic_kernel's uses_pdl= opts out)",
    "instrumentation_mode": "instrumentation adds kernel parameters the launch does not pass",
    "ir_override": "the kernel is compiled from its Python source",
}


@dataclasses.dataclass(frozen=True)
class TritonOptions:
  """num_warps, num_stages, num_ctas: Triton's launch options; maxnreg: the most registers a thread may use
  (PTX ``.maxnreg``), or None; backend_options: Triton's other compile options (its NVIDIA backend's, such as
  ``enable_fp_fusion`` or ``debug``), as sorted (name, value) pairs (`backend_options` checks them)."""

  num_warps: int = 4
  num_stages: int = 3
  num_ctas: int = 1
  maxnreg: int | None = None
  backend_options: tuple[tuple[str, Any], ...] = ()

  def check(self, name: str) -> "TritonOptions":
    """Itself, each value a positive int within `BOUNDS` (num_warps a power of two; maxnreg may be None); else
    LaunchError naming the kernel. `compile_triton` checks again: a config or a heuristic may set them."""
    for field in LAUNCH_OPTIONS:
      value = getattr(self, field)
      if field == "maxnreg" and value is None:
        continue
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise LaunchError(f"triton_kernel '{name}': {field} must be a positive int, got {value!r}")
      if value > BOUNDS[field] or (field in _POWERS_OF_TWO and value & (value - 1)):
        raise LaunchError(f"triton_kernel '{name}': {field}={value} is out of range: {field} is "
                          + ("a power of two " if field in _POWERS_OF_TWO else "") + f"from 1 to {BOUNDS[field]}")
    return self

  def check_targets(self, name: str, targets) -> None:
    """ValueError naming the kernel where these options cannot be compiled for ``targets`` (`Arch` each):
    clusters (``num_ctas`` > 1) before Hopper."""
    if self.num_ctas > 1 and min(t.number for t in targets) < MIN_CLUSTER_ARCH:
      raise ValueError(
          f"triton_kernel '{name}': num_ctas > 1 unsupported before Hopper (compute capability {MIN_CLUSTER_ARCH}); "
          f"the target is {', '.join(t.sm for t in targets)}: pass num_ctas=1 (or a config without num_ctas), or "
          f"compile for sm_{MIN_CLUSTER_ARCH} or newer (triton_kernel's targets=, triton_call's compute_capability=)")

  def meta(self) -> dict[str, Any]:
    """The launch options, as a config's meta: maxnreg only where set."""
    values = {field: getattr(self, field) for field in LAUNCH_OPTIONS}
    if values["maxnreg"] is None:
      del values["maxnreg"]
    return values

  def compile_options(self) -> dict[str, Any]:
    """Every option, as Triton's compile takes them; ``enable_fp_fusion`` `FP_FUSION` unless given here or in
    Triton's TRITON_DEFAULT_FP_FUSION."""
    options = {**dict(self.backend_options), **self.meta()}
    if "enable_fp_fusion" not in options and os.environ.get("TRITON_DEFAULT_FP_FUSION") is None:
      options["enable_fp_fusion"] = FP_FUSION
    return options

  @property
  def debug(self) -> bool:
    """Triton's ``debug`` option: device assertions, and each compile prints Triton's intermediate forms."""
    return bool(dict(self.backend_options).get("debug"))

  def updated(self, meta: Mapping[str, Any]) -> "TritonOptions":
    """These options with the ones ``meta`` sets (a config's, a heuristic's)."""
    given = {field: meta[field] for field in LAUNCH_OPTIONS if field in meta}
    return dataclasses.replace(self, **given) if given else self

  @property
  def key(self) -> str:
    """For our cache key."""
    return (f"w{self.num_warps} s{self.num_stages} c{self.num_ctas}"
            + ("" if self.maxnreg is None else f" r{self.maxnreg}")
            + ("" if not self.backend_options else
               " " + json.dumps([(k, triton_keys.exact(v).hex()) for k, v in self.backend_options])))


def backend_options(options: Mapping[str, Any] | None, name: str) -> tuple[tuple[str, Any], ...]:
  """``triton_kernel(options=)`` as `TritonOptions.backend_options`: names of Triton's NVIDIA backend's options
  (``CUDAOptions``) only, less those `_REFUSED` names (what to use instead); values hashable, as Triton keys its
  cache by them."""
  if options is None:
    return ()
  if not isinstance(options, Mapping):
    raise TypeError(f"triton_kernel '{name}': options must be a mapping of Triton compile options, got {options!r}")
  import triton  # noqa: PLC0415  (optional dependency: Triton)
  from triton.backends.nvidia.compiler import CUDAOptions  # noqa: PLC0415  (optional dependency: Triton)
  known = sorted(f.name for f in dataclasses.fields(CUDAOptions) if f.name not in _REFUSED)
  for key, value in options.items():
    if key in _REFUSED:
      raise ValueError(f"triton_kernel '{name}': the Triton option {key!r} is not taken here: {_REFUSED[key]}")
    if key not in known:
      raise ValueError(f"triton_kernel '{name}': {key!r} is not a compile option of Triton {triton.__version__}'s "
                       f"NVIDIA backend; it takes {', '.join(known)}")
    try:
      hash(value)
    except TypeError:
      raise TypeError(f"triton_kernel '{name}': the Triton option {key!r} must be hashable (a tuple, not a list or "
                      f"dict), got {value!r}") from None
    triton_keys.key(value, f"the Triton option {key!r}", f"triton_kernel '{name}'")  # keyed exactly (TritonOptions.key)
  return tuple(sorted(options.items()))
