"""The TTIR Triton's frontend makes of a source: what decides a Triton or Gluon kernel, before any pass.

Our compile keys stand in for it (keys.py): read from the user's Python without tracing it. Where a value
cannot be read whole, the key holds this IR's digest instead; and the key audit (store/key_audit.py) compares
it on every cache hit. Making it costs about 0.05 s for a small kernel, and needs no GPU.
"""

from __future__ import annotations


def ir_text(source, gpu_target, parsed) -> str:
  """The frontend's TTIR of ``source`` (an ``ASTSource`` or Gluon's) for ``gpu_target``, with the options as
  Triton's backend parsed them (``parsed``), as text (its locations name files: key_audit.normal drops their
  folders)."""
  from triton._C.libtriton import ir  # noqa: PLC0415  (optional dependency: Triton)
  from triton.compiler import make_backend  # noqa: PLC0415  (optional dependency: Triton)
  backend = make_backend(gpu_target)
  context = ir.context()
  ir.load_dialects(context)
  backend.load_dialects(context)
  module = source.make_ir(gpu_target, parsed, backend.get_codegen_implementation(parsed), backend.get_module_map(),
                          context)
  return str(module)
