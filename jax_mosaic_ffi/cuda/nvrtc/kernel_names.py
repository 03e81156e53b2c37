"""A kernel name the source does not define: "no kernel named 'axpyy'; the source defines: axpy".

NVRTC reports a misspelt name as an error in its own file, ``__nv_name_map``, which says nothing of the
kernels there are. Which kernels the source declares is read from its text, for this message only: a
mistaken list costs a worse suggestion, never a wrong compile.
"""

from __future__ import annotations

import difflib
import re

from jax_mosaic_ffi.base import source_location

_ERROR = re.compile(r"^(.*?)\(\d+\): (?:catastrophic )?error", re.MULTILINE)
_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)
# What may stand between __global__ and the name, and holds parentheses of its own.
_ATTRIBUTES = re.compile(r"__launch_bounds__\s*\([^)]*\)|__maxnreg__\s*\([^)]*\)|__attribute__\s*\(\(.*?\)\)",
                         re.DOTALL)
_GLOBAL = re.compile(r"\b__global__\b[^;{}()]*?([A-Za-z_]\w*)\s*\(")


def kernels_in(source: str) -> list[str]:
  """The names of the ``__global__`` functions the source declares, in order (templates by their name)."""
  text = _ATTRIBUTES.sub(" ", _COMMENTS.sub(" ", source))
  return list(dict.fromkeys(_GLOBAL.findall(text)))


def _base(name: str) -> str:
  """``"ops::axpb<float>"`` -> ``"axpb"``."""
  return name.split("<", 1)[0].rsplit("::", 1)[-1].strip()


def misnamed(log: str, source: str, name: str) -> str | None:
  """The message for a name NVRTC could not resolve and the source does not declare as a kernel; None
  when that is not what the log says (the source has errors of its own, or the kernel is there and the
  template arguments or namespaces are what is wrong: NVRTC's log and advice say more then)."""
  files = _ERROR.findall(log)
  if "__nv_name_map" not in files or any(f != "__nv_name_map" for f in files):
    return None
  kernels = kernels_in(source)
  if _base(name) in kernels:
    return None
  defined = ", ".join(kernels) if kernels else "no __global__ function"
  close = difflib.get_close_matches(_base(name), kernels, n=1)
  hint = f". Did you mean '{close[0]}'?" if close else ""
  return (f"cuda_kernel at {source_location.current()}: no kernel named '{name}'; the source defines: "
          f"{defined}{hint}")
