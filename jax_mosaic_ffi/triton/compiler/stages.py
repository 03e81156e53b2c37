"""Which stage of Triton's compiler a bounded compile is in: `reported`, and `described` for a timeout's message.

A bounded compile runs in a forked child (toolchain/forked_compile.py), killed at its deadline. So that the
`CompileTimeout` says where the time went, the child tells the parent each stage it starts: the frontend (the
kernel's Python traced to TTIR), then each of the backend's stages (``ttir``, ``ttgir``, ``llir``, ``ptx``,
``cubin``; Gluon's ``glir``), which Triton's ``knobs.runtime.add_stages_inspection_hook`` lets us wrap. The hook
adds its first answer to Triton's cache key; ours answers an empty one (or the user's hook's, which it calls), so
the key is Triton's own.
"""

from __future__ import annotations

import contextlib

from jax_mosaic_ffi.toolchain import forked_compile

FRONTEND = "frontend"
_WHAT = {
    FRONTEND: "frontend (the kernel's Python traced to TTIR)",
    "ttir": "ttir stage (MLIR passes on the TTIR)",
    "glir": "glir stage",
    "ttgir": "ttgir stage (MLIR passes to TritonGPU IR)",
    "llir": "llir stage (lowering to LLVM IR and LLVM's optimizer)",
    "ptx": "ptx stage (LLVM's NVPTX backend)",
    "cubin": "cubin stage (ptxas)",
}
_SEPARATOR = " for "


def described(reported_stage: str, language: str) -> str:
  """A stage as the child reported it (``"ttgir for sm_90"``), worded for a message: "Triton's ttgir stage (MLIR
  passes to TritonGPU IR) for sm_90"."""
  name, _, target = reported_stage.partition(_SEPARATOR)
  return f"{language}'s {_WHAT.get(name, f'{name} stage')}{f' for {target}' if target else ''}"


def first(target: str) -> str:
  """The stage a compile for ``target`` starts in (its frontend), as `reported` names it."""
  return f"{FRONTEND}{_SEPARATOR}{target}"


@contextlib.contextmanager
def reported(target: str):
  """Inside, in a forked compile's child, each stage of Triton's compile for ``target`` (``"sm_90"``) is reported
  as it starts; elsewhere nothing changes. Under compile.py's lock: the knob is the process's."""
  if not forked_compile.in_child():
    yield
    return
  from triton import knobs  # noqa: PLC0415  (optional dependency: Triton)
  forked_compile.stage(first(target))
  if not hasattr(knobs.runtime, "add_stages_inspection_hook"):  # an older Triton: the frontend is all we say
    yield
    return
  theirs = knobs.runtime.add_stages_inspection_hook

  def hook(*args):
    if not args:  # asked for its part of the cache key: the user's hook's, or none
      return theirs() if theirs is not None else ("", "")
    if theirs is not None:
      theirs(*args)
    stages = args[1]
    for name, run in list(stages.items()):
      stages[name] = _reporting(f"{name}{_SEPARATOR}{target}", run)
    return None

  knobs.runtime.add_stages_inspection_hook = hook
  try:
    yield
  finally:
    knobs.runtime.add_stages_inspection_hook = theirs


def _reporting(name: str, run):
  def stage(module, metadata):
    forked_compile.stage(name)
    return run(module, metadata)
  return stage
