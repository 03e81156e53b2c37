"""Triton's own settings that change what it compiles, for our key: read from Triton's list of them, its knobs.

Triton's cache key holds its options (FP fusion, the PTX options, libdevice's path...) and the variables its C++
marks as invalidating (line info, ASan, ptxas optimisation), and we hold that key. Its knobs also hold settings
that reach the compile otherwise (an IR override folder, a mocked PTX version, the arch it overrides, non-constexpr
globals allowed), set from the environment or by code. Our key holds every knob of the groups that reach a compile
(compilation, language, nvidia, runtime) with its current value, but the tools' (ptxas: Triton's key holds its
version, and its path is no code): at worst a needless compile when one that changes nothing is set, never a kernel
compiled under other settings.
"""

from __future__ import annotations

import json

_GROUPS = ("compilation", "language", "nvidia", "runtime")


def key() -> str:
  """The knobs' current values, as text."""
  from triton import knobs  # noqa: PLC0415  (optional dependency: Triton)
  values = {}
  for group in _GROUPS:
    owner = getattr(knobs, group, None)
    for name, descriptor in sorted(getattr(owner, "knob_descriptors", {}).items()):
      if "tool" in type(descriptor).__name__:  # ptxas and friends: their versions are in Triton's own key
        continue
      try:
        value = getattr(owner, name)
      except Exception as e:  # a knob whose value cannot be read now (a tool not found): its failure is its value
        value = f"unreadable: {type(e).__name__}"
      values[f"{group}.{name}"] = str(value)
  return json.dumps(values, sort_keys=True)
