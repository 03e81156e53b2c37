"""Triton's compile options besides the constexprs, as one frozen object: `TritonOptions`.

`triton_kernel(fn, num_warps=..., ...)`, a ``triton.Config``, a heuristic or an autotuning config set them; the
object travels whole from there to Triton's compile and our cache key, so adding one is one field here.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

# What a config or a heuristic may set besides constexprs: TritonOptions' fields, by name.
LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")


@dataclasses.dataclass(frozen=True)
class TritonOptions:
  """num_warps, num_stages, num_ctas: Triton's launch options; maxnreg: the most registers a thread may use
  (PTX ``.maxnreg``), or None."""

  num_warps: int = 4
  num_stages: int = 3
  num_ctas: int = 1
  maxnreg: int | None = None

  def check(self, name: str) -> "TritonOptions":
    """Itself, each value a positive int (maxnreg may be None); else ValueError naming the kernel."""
    for field in LAUNCH_OPTIONS:
      value = getattr(self, field)
      if field == "maxnreg" and value is None:
        continue
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"triton_kernel '{name}': {field} must be a positive int, got {value!r}")
    return self

  def meta(self) -> dict[str, Any]:
    """As a config's meta, and as Triton's compile takes them: maxnreg only where set."""
    values = {field: getattr(self, field) for field in LAUNCH_OPTIONS}
    if values["maxnreg"] is None:
      del values["maxnreg"]
    return values

  def updated(self, meta: Mapping[str, Any]) -> "TritonOptions":
    """These options with the ones ``meta`` sets (a config's, a heuristic's)."""
    given = {field: meta[field] for field in LAUNCH_OPTIONS if field in meta}
    return dataclasses.replace(self, **given) if given else self

  @property
  def key(self) -> str:
    """For our cache key."""
    return f"w{self.num_warps} s{self.num_stages} c{self.num_ctas}" + (
        "" if self.maxnreg is None else f" r{self.maxnreg}")
