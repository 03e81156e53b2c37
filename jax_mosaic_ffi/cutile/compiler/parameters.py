"""A cuTile kernel's parameters as its annotations declare them: which are compile-time constants (``ct.Constant``),
which arrays are indexed with 64-bit shapes and strides (``ct.IndexedWithInt64``), which integer scalars are 64-bit
(``ct.ScalarInt64``), and the tuples among them.

cuTile keeps them on the kernel object (``kernel._annotated_function``, as its own JAX bridge reads them); they
are read here once per kernel into plain values, so the launch half never touches cuTile's objects.
"""

from __future__ import annotations

import dataclasses
import inspect

from jax_mosaic_ffi.cutile.compiler import release as release_lib


@dataclasses.dataclass(frozen=True)
class Parameter:
  """One parameter (or a tuple parameter's item): ``constant`` for ``ct.Constant``; ``index_bits`` the width of an
  array's shape and strides (64 under ``ct.IndexedWithInt64``); ``scalar_bits`` 64 for a ``ct.ScalarInt64``
  integer; a tuple's ``items`` (each item's; ``each`` for ``tuple[T, ...]``)."""

  name: str
  constant: bool = False
  index_bits: int = 32
  scalar_bits: int | None = None
  items: tuple["Parameter", ...] | None = None
  each: "Parameter | None" = None
  default: object = inspect.Parameter.empty

  @property
  def is_tuple(self) -> bool:
    return self.items is not None or self.each is not None

  def item(self, k: int) -> "Parameter":
    if self.each is not None:
      return dataclasses.replace(self.each, name=f"{self.name}[{k}]")
    return dataclasses.replace(self.items[k], name=f"{self.name}[{k}]")


def _leaf(node, name: str, default) -> Parameter:
  ct = release_lib.require_cutile()
  kind = type(node).__name__
  if kind == "HomogeneousTupleNode":
    return Parameter(name, each=_leaf(node.each, f"{name}[...]", inspect.Parameter.empty), default=default)
  if kind == "HeterogeneousTupleNode":
    return Parameter(name, items=tuple(_leaf(n, f"{name}[{k}]", inspect.Parameter.empty)
                                       for k, n in enumerate(node.items)), default=default)
  array, scalar = getattr(node, "array", None), getattr(node, "scalar", None)
  index_bits = 64 if array is not None and getattr(array, "index_dtype", None) == ct.int64 else 32
  scalar_bits = 64 if scalar is not None and getattr(scalar, "dtype", None) == ct.int64 else None
  return Parameter(name, bool(getattr(node, "constant", False)), index_bits, scalar_bits, default=default)


def parameters(kernel) -> tuple[Parameter, ...]:
  """The parameters of a ``@ct.kernel`` in order; TypeError for anything else."""
  if not release_lib.is_kernel(kernel):
    raise TypeError(f"a cuTile kernel is a @ct.kernel (cuda.tile.kernel), got {type(kernel).__name__}")
  annotated = kernel._annotated_function  # noqa: SLF001  (cuTile's annotations, as cuda.tile.jax reads them)
  with release_lib.importing("the kernel's annotations"):
    signature = annotated.pysig
    nodes = tuple(annotated.parameter_annotations)
    return tuple(_leaf(node, name, p.default)
                 for (name, p), node in zip(signature.parameters.items(), nodes, strict=True))


def python_function(kernel):
  """The Python function a ``@ct.kernel`` decorates: what cuTile compiles, and what the key reads."""
  return kernel._annotated_function.pyfunc  # noqa: SLF001  (cuTile's own handle on it)


def hints(kernel) -> dict:
  """The kernel's ``ct.kernel`` options (num_ctas, occupancy, opt_level, num_worker_warps), per target as cuTile
  resolves them: ``{"default": {...}, "sm_100": {...}}`` (values that are plain ints or None)."""
  return {target: dict(values) for target, values in kernel._compiler_options.hints_by_target().items()}  # noqa: SLF001


HINT_NAMES = ("num_ctas", "occupancy", "opt_level", "num_worker_warps")


def with_hints(kernel, values: dict):
  """The kernel with ``ct.kernel`` options replaced (``kernel.replace_hints``, cuTile's public way)."""
  return kernel.replace_hints(**values) if values else kernel
