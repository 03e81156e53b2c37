"""The errors a user sees, in one place, and how a message names a kernel call.

Every layer raises them, so they live at the bottom: a module needing `LaunchError` does not import the
launch machinery for it.
"""

from __future__ import annotations

import re


class LaunchError(ValueError):
  """A `mosaic_kernel` call that cannot launch as written."""


class CompileError(RuntimeError):
  """NVRTC (or Triton, or CuTe DSL) refused the source. The message carries its log with line numbers.

  ``advice`` is what the compiler's caller knows about the log (nvcc habits NVRTC does not share).
  ``message``, when the caller knows the mistake exactly (a misspelt kernel name), replaces the log in
  the message; ``log`` keeps it. ``compiler`` names the compiler that refused it; ``what`` says what was
  compiled (default: "kernel '<kernel>'"), e.g. with the config it was compiled with.
  """

  def __init__(self, kernel: str, log: str, source: str, filename: str, advice: str | None = None,
               message: str | None = None, compiler: str = "NVRTC", what: str | None = None):
    self.kernel = kernel
    self.log = log
    self.compiler = compiler
    if message is not None:
      super().__init__(message)
      return
    lines = source.splitlines()
    excerpts = []
    for line_no in sorted({int(n) for n in re.findall(rf"{re.escape(filename)}\((\d+)\)", log)})[:5]:
      if 1 <= line_no <= len(lines):
        excerpts.append(f"  {line_no:5d} | {lines[line_no - 1]}")
    message = f"{compiler} could not compile {what or f"kernel '{kernel}'"}:\n{log.rstrip()}"
    if excerpts:
      message += "\n\nsource lines named above:\n" + "\n".join(excerpts)
    if advice:
      message += f"\n\nadvice: {advice}"
    super().__init__(message)


class AutotuneError(RuntimeError):
  """No config of an autotuned call could be compiled and run."""


class TritonUnavailable(ImportError):
  """Triton is not installed, or not a supported version."""


class CuteUnavailable(ImportError):
  """CuTe DSL (nvidia-cutlass-dsl) is missing or of an unsupported release: ``pip install 'jax_mosaic_ffi[cute]'``."""


class NvshmemUnavailable(ImportError):
  """NVSHMEM is not installed (or not a supported release), or could not be started."""


def who(kernel, call_site: str) -> str:
  """A kernel call, as messages name it: "mosaic_kernel 'add' at model.py:42 (forward)"."""
  return f"mosaic_kernel '{kernel.name}' at {call_site}"
