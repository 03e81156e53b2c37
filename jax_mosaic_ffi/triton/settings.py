"""Triton's own settings that change what it compiles, for our key: read from Triton's list of them, its knobs.

Triton's cache key holds its options (FP fusion, the PTX options, libdevice's path...) and the variables its C++
marks as invalidating (line info, ASan, ptxas optimisation), and we hold that key. Its knobs also hold settings
that reach the compile otherwise (an IR override folder, a mocked PTX version, the arch it overrides, non-constexpr
globals allowed), set from the environment or by code. Our key holds every knob of the groups that reach a compile
(compilation, language, nvidia, runtime) with its current value, but the tools' (ptxas: Triton's key holds its
version, and its path is no code) and those that change only what Triton prints or dumps, or whether it
reuses its own cache (`_NOT_THE_KERNEL`): a debug variable set on one node must not lose it every packed kernel. A
knob a new release adds is keyed until it is known: at worst a needless compile, never a kernel compiled under
other settings.
`environment` names the keyed knobs the environment sets, for a pack's manifest.
"""

from __future__ import annotations

import json
import os

_GROUPS = ("compilation", "language", "nvidia", "runtime")
# Knobs that change what Triton prints or dumps, whether it reuses its own cache, or where it finds the driver:
# never the code it compiles (TRITON_KERNEL_DUMP, TRITON_ALWAYS_COMPILE, TRITON_FRONT_END_DEBUGGING,
# NVPTX_ENABLE_DUMP, TRITON_DUMP_PTXAS_LOG, TRITON_LIBCUDA_PATH). TRITON_STORE_BINARY_ONLY stays keyed: it changes
# which stages a compile returns.
_NOT_THE_KERNEL = frozenset({"compilation.dump_ir", "compilation.always_compile", "compilation.front_end_debugging",
                             "nvidia.dump_nvptx", "nvidia.dump_ptxas_log", "nvidia.libcuda_path"})


def _keyed():
  """(group.name, owner, name, descriptor) of each knob that changes the compiled kernel."""
  from triton import knobs  # noqa: PLC0415  (optional dependency: Triton)
  for group in _GROUPS:
    owner = getattr(knobs, group, None)
    for name, descriptor in sorted(getattr(owner, "knob_descriptors", {}).items()):
      # ptxas and friends: their versions are in Triton's own key
      if "tool" not in type(descriptor).__name__ and f"{group}.{name}" not in _NOT_THE_KERNEL:
        yield f"{group}.{name}", owner, name, descriptor


def environment() -> list[str]:
  """The keyed knobs' environment variables that are set, as ``NAME=value``: what a pack's manifest shows of the
  settings its Triton kernels were compiled under (``pack check`` compares a node's with them)."""
  variables = (getattr(descriptor, "key", None) for _, _, _, descriptor in _keyed())
  return sorted(f"{v}={os.environ[v]}" for v in variables if isinstance(v, str) and v in os.environ)


def key() -> str:
  """The keyed knobs' current values, as text."""
  values = {}
  for keyed, owner, name, _ in _keyed():
    try:
      value = getattr(owner, name)
    except Exception as e:  # a knob whose value cannot be read now (a tool not found): its failure is its value
      value = f"unreadable: {type(e).__name__}"
    values[keyed] = str(value)
  return json.dumps(values, sort_keys=True)
