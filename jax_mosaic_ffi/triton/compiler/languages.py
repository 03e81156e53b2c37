"""The kernel languages Triton's compiler takes, as our compile of a function needs them: `Language`.

Triton compiles a ``@triton.jit`` function from its AST (``triton.compiler.ASTSource``). A language built on
Triton's compiler (Gluon's ``@gluon.jit``) hands ``triton.compile`` another source object, and its compiles print,
advise and name other things. `compile.compile_triton` takes one `Language` per compile: `TRITON` is this wing's;
a wing built on this one gives its own (with a `kernel.TritonFunction` subclass that names it).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

from jax_mosaic_ffi.triton.compiler import bounds
from jax_mosaic_ffi.triton.compiler import keys


@dataclasses.dataclass(frozen=True)
class Language:
  """A kernel language Triton's compiler compiles.

  Attributes:
    name: its name, as messages call its kernels ("Triton", "Gluon").
    maker: the public function that makes its kernels ("triton_kernel"), as messages name it.
    source: ``(fn, signature, constexprs, attrs) -> source``: what ``triton.compile`` compiles. Its ``hash()``
      is in Triton's cache key (``get_cache_key``), so in ours too: it must cover everything the compile reads
      (`keys.KeyedSource` reads it whole). Its class has `bounds.BoundedSource` too, whose ``make_ir``
      refuses a tensor a CTA cannot hold before any stage runs (compile.py checks that it does).
    stages: the intermediate forms a compile with Triton's ``debug`` option prints, those it has.
    advice: ``(exception) -> str``: what a compile that failed in Triton's compiler advises.
  """

  name: str
  maker: str
  source: Callable[..., Any]
  stages: tuple[str, ...]
  advice: Callable[[BaseException], str]


@functools.cache
def _ast_source_class():
  """Triton's source of a ``@triton.jit`` function, keyed whole (keys.py), its tensors bounded
  (bounds.py)."""
  from triton.compiler import ASTSource  # noqa: PLC0415  (optional dependency: Triton)

  class KeyedASTSource(keys.KeyedSource, bounds.BoundedSource, ASTSource):
    pass

  return KeyedASTSource


def _ast_source(fn, signature, constexprs, attrs):
  return _ast_source_class()(fn, signature, constexprs, attrs=attrs)


def _triton_advice(error: BaseException) -> str:
  del error
  return ("this config fails in Triton's own compiler; under autotuning it is skipped, otherwise pick another "
          "config (fewer num_stages, smaller blocks) or Triton release")


TRITON = Language(name="Triton", maker="triton_kernel", source=_ast_source, stages=("ttir", "ttgir", "llir", "ptx"),
                  advice=_triton_advice)
