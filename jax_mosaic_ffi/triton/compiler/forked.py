"""A Triton (or Gluon) compile's work under ``JAX_MOSAIC_FFI_COMPILE_TIMEOUT_S``: `BoundedCompile`.

Each piece of a compile that runs the user's Python or Triton's compiler (the whole compile, every target; the
frontend's TTIR where a kernel is keyed by it, and the key audit's) runs in a child forked for it and killed at the
deadline (toolchain/forked_compile.py), which starts in the frontend and reports each stage (stages.py). The
deadline is one for the whole compile: each piece gets what its earlier pieces left of the bound (D36).
Its stop, or a crash of Triton's native code in it, is worded for the kernel (errors.py); what it prints for
Triton's ``debug`` option comes back with its answer and is printed here, where the user's stdout is.
"""

from __future__ import annotations

import dataclasses
import struct
import time
from typing import Any, Callable

from jax_mosaic_ffi.toolchain import forked_compile
from jax_mosaic_ffi.triton.compiler import errors as triton_errors
from jax_mosaic_ffi.triton.compiler import stages
from jax_mosaic_ffi.triton.compiler import ttir
from jax_mosaic_ffi.triton.compiler.languages import Language

_LENGTH = struct.Struct("<Q")


@dataclasses.dataclass(frozen=True)
class BoundedCompile:
  """One kernel's compile under ``bound`` seconds (None: no bound, in this process).

  Attributes:
    fn: the ``@triton.jit`` (or Gluon) function, as errors name it.
    targets: the targets it compiles for.
    config: its config as errors name it (triton_errors.config_text).
    language: what it is written in.
    bound: the bound in seconds, or None.
    started: when the compile started (time.monotonic()): its pieces share the bound from there.
  """

  fn: Any
  targets: Any
  config: str
  language: Language
  bound: float | None
  started: float = dataclasses.field(default_factory=time.monotonic)

  def _left(self) -> float | None:
    return None if self.bound is None else self.bound - (time.monotonic() - self.started)

  def run(self, work: Callable[[], bytes], target: str) -> bytes:
    """``work()`` bounded; it starts in the frontend for ``target`` (``"sm_90"``)."""
    try:
      return forked_compile.run(work, self._left(), stages.first(target))
    except forked_compile.Stopped as e:
      raise triton_errors.timed_out(self.fn, self.targets, self.config, self.language, self.bound,
                                    e.stage) from None
    except forked_compile.Died as e:
      raise triton_errors.died(self.fn, self.targets, self.config, self.language, e.how, e.stage) from None

  def run_printing(self, work: Callable[[], tuple[bytes, str]], target: str) -> bytes:
    """``work()``'s answer, bounded; it returns (its answer, the text it would print), printed here."""
    def framed() -> bytes:
      data, text = work()
      printed = text.encode()
      return _LENGTH.pack(len(printed)) + printed + data

    answer = self.run(framed, target)
    (length,) = _LENGTH.unpack_from(answer)
    if length:
      print(answer[_LENGTH.size:_LENGTH.size + length].decode(), end="")
    return answer[_LENGTH.size + length:]

  def ir_text(self, source, gpu_target, parsed) -> str:
    """The frontend's TTIR (ttir.py), bounded: the user's Python runs in it."""
    target = f"sm_{gpu_target.arch}"

    def frontend_ir() -> bytes:
      with stages.reported(target):
        return ttir.ir_text(source, gpu_target, parsed).encode()
    return self.run(frontend_ir, target).decode()
