"""The cuTile wing's kernels: `cutile_kernel`, which makes a `CutileFunction` (a ``@ct.kernel`` with its
compile-time constants); what one compiles to, `CutileKernel`, is the compiler room's (compiler/compile.py)."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

from jax_mosaic_ffi.base.errors import LaunchError, ValueKeyError
from jax_mosaic_ffi.cutile.compiler import keys as cutile_keys
from jax_mosaic_ffi.cutile.compiler import parameters as parameters_lib
from jax_mosaic_ffi.cutile.compiler import release as release_lib
from jax_mosaic_ffi.cutile.compiler.parameters import HINT_NAMES, Parameter


@dataclasses.dataclass(frozen=True, eq=False)
class CutileFunction:
  """A ``@ct.kernel`` with its ``ct.Constant`` values and ``ct.kernel`` options, compiled per specialization (the
  call's dtypes, ranks, what is known of its shapes, its scalars' types) when a call is traced.

  `cutile_kernel` returns one; pass it to `mosaic_kernel` (:doc:`cuTile kernels </guides/cutile_kernels>`)."""

  kernel: Any
  name: str
  parameters: tuple[Parameter, ...]
  constants: tuple[tuple[str, Any], ...] = ()
  hints: tuple[tuple[str, Any], ...] = ()  # ct.kernel options given here or by a config: num_ctas, occupancy, ...
  targets: tuple[Any, ...] | None = None
  batch_bid: int | None = None

  def with_meta(self, meta: dict) -> "CutileFunction":
    """The same kernel with an autotuning config's values: those named like a ``ct.Constant`` parameter are its
    value, ``num_ctas`` / ``occupancy`` / ``opt_level`` / ``num_worker_warps`` its ``ct.kernel`` options; the
    others reach only the launch's callables (``grid=lambda meta, x: ...``)."""
    constant_names = {p.name for p in self.parameters if p.constant}
    constants = {**dict(self.constants), **{k: v for k, v in meta.items() if k in constant_names}}
    hints = {**dict(self.hints), **{k: v for k, v in meta.items() if k in HINT_NAMES}}
    return dataclasses.replace(self, constants=tuple(constants.items()), hints=tuple(hints.items()))

  @property
  def meta(self) -> dict:
    return {**dict(self.constants), **dict(self.hints)}

  def compiled(self):
    """The ``@ct.kernel`` this compiles: with its options replaced where given."""
    return parameters_lib.with_hints(self.kernel, dict(self.hints))

  def __repr__(self) -> str:
    return f"CutileFunction({self.name!r}, constants={dict(self.constants)}, hints={dict(self.hints)})"


def cutile_kernel(kernel, *, targets=None, batch_bid: int | None = None, num_ctas: int | None = None,
                  occupancy: int | None = None, opt_level: int | None = None, num_worker_warps: int | None = None,
                  **constants) -> CutileFunction:
  """A cuTile kernel for `mosaic_kernel`.

  ``kernel`` is a ``@ct.kernel`` (cuTile Python, ``import cuda.tile as ct``). The call's inputs, outputs and
  scalars fill its parameters that are not ``ct.Constant``, in order (or as ``param_order=`` names them): each
  array arrives as a cuTile array (row-major, its shape and strides passed at launch), each scalar by value. Its
  ``ct.Constant`` parameters take the values given here (or a config's, or their defaults). It is compiled with
  ``cuda.tile.compilation.export_kernel`` per specialization when a call is traced, for every target, once ever
  (the compile cache keeps the cubins on disk), and launched as a tile kernel::

      @ct.kernel
      def scale(x, y, a: float, TILE: ct.Constant[int]):
        t = ct.load(x, index=(ct.bid(0),), shape=(TILE,))
        ct.store(y, index=(ct.bid(0),), tile=t * a)

      f = jmf.mosaic_kernel(jmf.cutile_kernel(scale, TILE=1024), jax.ShapeDtypeStruct(x.shape, x.dtype),
                            grid=lambda x: jmf.cdiv(x.size, 1024), scalars=(np.float32(2.0),))
      y = jax.jit(f)(x)

  Args:
    kernel: the ``@ct.kernel``.
    targets: archs to compile for (default: the visible GPUs', else ``JAX_MOSAIC_FFI_TARGETS``, else sm_90): any
      list, compiled without a GPU. tileiras makes a cubin for each exact arch (sm_90 and newer arch-specific:
      ``sm_90`` gives an ``sm_90a`` cubin).
    batch_bid: for a kernel whose array parameters all take a leading batch axis, indexed by ``ct.bid(batch_bid)``
      (0, 1 or 2): a plain call passes each array with a batch of one and that grid axis 1, and ``jax.vmap``
      makes one launch over the whole batch (that grid axis the batch's size). Without it, a vmapped call
      launches the kernel once per batch element, in one custom call.
    num_ctas, occupancy, opt_level, num_worker_warps: ``ct.kernel``'s options, replacing the kernel's own
      (``kernel.replace_hints``); None keeps the kernel's. A config of ``configs=`` may set them too.
    **constants: the values of its ``ct.Constant`` parameters, by name.

  Raises:
    CutileUnavailable: cuda-tile is missing or of an unsupported release.
  """
  release_lib.check_release(release_lib.release())
  params = parameters_lib.parameters(kernel)
  name = parameters_lib.python_function(kernel).__name__
  made = f"cutile_kernel '{name}'"
  if batch_bid is not None and (isinstance(batch_bid, bool) or batch_bid not in (0, 1, 2)):
    raise LaunchError(f"{made}: batch_bid is the ct.bid axis (0, 1 or 2) that indexes the batch, got {batch_bid!r}")
  by_name = {p.name: p for p in params}
  for key, value in constants.items():
    if key not in by_name:
      raise LaunchError(f"{made}: the kernel has no parameter {key!r}; its parameters are "
                        f"{', '.join(by_name)}")
    if not by_name[key].constant:
      raise LaunchError(f"{made}: parameter {key!r} is not a ct.Constant, so it takes a launch value: pass it as "
                        "an input array or as scalars=(...), not as a keyword here (annotate it ct.Constant[...] to "
                        "compile it in)")
    _check_constant(value, key, made)
  hints = {k: v for k, v in (("num_ctas", num_ctas), ("occupancy", occupancy), ("opt_level", opt_level),
                             ("num_worker_warps", num_worker_warps)) if v is not None}
  if hints:
    try:
      parameters_lib.with_hints(kernel, hints)
    except (TypeError, ValueError) as e:
      raise LaunchError(f"{made}: {e}") from None
  return CutileFunction(kernel, name, params, tuple(constants.items()), tuple(hints.items()),
                        None if targets is None else tuple(targets), batch_bid)


def _check_constant(value, key: str, made: str) -> None:
  try:
    cutile_keys.exact_key(value, key)
  except ValueKeyError as e:
    raise LaunchError(f"{made}: the constant {key}={value!r} cannot be keyed exactly ({e}); constants are bools, "
                      "ints, floats or tuples of them") from None


def missing_constant(p: Parameter) -> bool:
  return p.default is inspect.Parameter.empty
