"""Triton kernels for `mosaic_kernel`: `triton_kernel`, and `TritonFunction`, a function compiled per call.

Without ``signature=``, the Triton types are read from each call's avals and scalars (`launch.py`, which also
launches them), and the kernel is compiled when the call is traced (`compiler/compile.py`).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from jax_mosaic_ffi.base.errors import LaunchError
from jax_mosaic_ffi.toolchain.kernel import parse_targets
from jax_mosaic_ffi.triton import decorators as decorators_lib
from jax_mosaic_ffi.triton.compiler.compile import TritonKernel, compile_triton
from jax_mosaic_ffi.triton.compiler.release import require_triton
from jax_mosaic_ffi.triton.compiler.languages import TRITON, Language
from jax_mosaic_ffi.triton.compiler.options import LAUNCH_OPTIONS, TritonOptions, backend_options


class TritonFunction:
  """A ``@triton.jit`` function with its constexprs and options, compiled per call signature (the Triton
  types of its parameters, from the call's avals) when a call is traced.

  `triton_kernel` without ``signature=`` returns one; pass it to `mosaic_kernel`.

  Attributes:
    fn: the ``@triton.jit`` function.
    constexprs: the values of its ``tl.constexpr`` parameters given to `triton_kernel`.
    options: its compile and launch options (``num_warps``, ``num_stages``, ``num_ctas``, ``maxnreg`` and
      Triton's other options).
    decorators: the ``@triton.autotune`` / ``@triton.heuristics`` layers it came with, outermost first,
      which `mosaic_kernel` applies per call.
  """

  # The language its functions are written in (compiler/languages.py). A language built on Triton's compiler subclasses
  # this class for its functions (gluon/: GluonFunction), naming its own and saying which functions it `takes`;
  # `function_type` then picks the subclass for a function, so triton_call and the launch serve both.
  language: Language = TRITON

  def __init__(self, fn, constexprs: Mapping[str, Any], options: TritonOptions, targets, decorators: tuple = ()):
    self.fn, self.constexprs, self.options, self.targets = fn, dict(constexprs), options, targets
    self.decorators = tuple(decorators)
    self.name = fn.__name__

  def __repr__(self) -> str:
    return (f"{type(self).__name__}({self.name!r}, constexprs={self.constexprs}, "
            f"num_warps={self.options.num_warps})")

  @classmethod
  def takes(cls, fn) -> bool:
    """Whether ``fn`` (a JIT function) is written in this class's language: any, for Triton's own."""
    del fn
    return True

  @property
  def meta(self) -> dict:
    """The constexprs and launch options, as the launch's callables get them."""
    return {**self.constexprs, **self.options.meta()}

  def with_meta(self, meta: Mapping[str, Any]) -> "TritonFunction":
    """The same function, undecorated, with constexprs and launch options from an autotuning config."""
    names = _constexpr_names(self.fn)
    constexprs = {**self.constexprs, **{k: v for k, v in meta.items() if k in names and k not in LAUNCH_OPTIONS}}
    return type(self)(self.fn, constexprs, self.options.updated(meta), self.targets)

  def specialize(self, signature: Sequence[Any], scalar_values: Mapping[int, Any] | None = None) -> TritonKernel:
    """Compiled for parameters of these Triton types (a tuple parameter's: a tuple of types) and the scalar
    values known now, by index among the leaves (specialize.flat_types). A constexpr parameter named like a launch
    option (``num_warps: gl.constexpr``, as Gluon's tutorials write) gets the option's value, as Triton's launcher
    binds the launch's ``num_warps=`` to it."""
    names = _constexpr_names(self.fn)
    constexprs = {**self.constexprs, **{k: v for k, v in self.options.meta().items() if k in names}}
    return compile_triton(self.fn, tuple(signature), constexprs, self.options, self.targets, scalar_values or {},
                          self.language)

  def check_descriptor(self, descriptor, where: str) -> None:
    """LaunchError where the kernel cannot take this host descriptor (a `tensor_descriptor.Bound`): a
    ``@triton.jit`` kernel's compiler picks the block's shared layout, so it takes none."""
    if descriptor.layout is not None:
      raise LaunchError(f"{where}: param_order entry {descriptor.decl} has layout={descriptor.layout!r}, but a "
                        f"{self.language.name} kernel's compiler picks its descriptors' shared layouts; drop layout= "
                        "(a Gluon kernel, @gluon.jit, takes one)")


def function_type(fn) -> type[TritonFunction]:
  """The `TritonFunction` class that compiles the JIT function ``fn``: the most derived one that `takes` it."""
  found = TritonFunction
  while True:
    deeper = [cls for cls in found.__subclasses__() if cls.takes(fn)]
    if not deeper:
      return found
    found = deeper[0]


def _constexpr_names(fn) -> list[str]:
  return [p.name for p in fn.params if p.is_constexpr]


def runtime_params(fn) -> list[str]:
  return [p.name for p in fn.params if not p.is_constexpr]


def make_function(function_class: type[TritonFunction], fn, decorators=(), *, signature=None, constexprs=None,
                  num_warps: int = 4, num_stages: int = 3, num_ctas: int = 1, targets=None,
                  maxnreg: int | None = None, options=None):
  """`triton_kernel`'s work for a JIT function of ``function_class``'s language, its decorators already read
  (`decorators.unwrap`): a function of that class, or compiled now for ``signature`` (a `TritonKernel`)."""
  made = f"{function_class.language.maker} '{fn.__name__}'"
  constexprs = dict(constexprs or {})
  names = _constexpr_names(fn)
  unknown = [k for k in constexprs if k not in names]
  if unknown:
    raise ValueError(f"{made}: {unknown[0]!r} is not one of its tl.constexpr parameters "
                     f"({', '.join(names) or 'none'})")
  for key in constexprs.keys() & set(LAUNCH_OPTIONS):
    raise ValueError(f"{made}: its constexpr parameter {key!r} takes the launch option's value, as Triton's "
                     f"launcher binds it; pass {key}= itself, not in constexprs=")
  decorators_lib.check_constexprs(decorators, constexprs, fn.__name__)
  options = TritonOptions(num_warps, num_stages, num_ctas, maxnreg, backend_options(options, fn.__name__)).check(
      fn.__name__)
  function = function_class(fn, constexprs, options, parse_targets(targets), decorators)
  if signature is None:
    return function
  if decorators:
    raise ValueError(f"{made}: signature= compiles one kernel now, but its @triton.autotune/@triton.heuristics "
                     "choose constexprs per call; leave signature= out")
  names = runtime_params(fn)
  if isinstance(signature, Mapping):
    missing = [n for n in names if n not in signature]
    extra = [n for n in signature if n not in names]
    if missing or extra:
      raise ValueError(f"{made}: signature must give a type for each non-constexpr parameter ({', '.join(names)}); "
                       f"missing {missing or 'none'}, unknown {extra or 'none'}")
    types = [signature[n] for n in names]
  else:
    types = list(signature)
    if len(types) != len(names):
      raise ValueError(f"{made}: signature has {len(types)} types for its {len(names)} non-constexpr parameters "
                       f"({', '.join(names)})")
  return function.specialize(types)


def triton_kernel(fn, *, signature: Mapping[str, str] | Sequence[str] | None = None,
                  constexprs: Mapping[str, Any] | None = None, num_warps: int = 4, num_stages: int = 3,
                  num_ctas: int = 1, targets=None, maxnreg: int | None = None,
                  options: Mapping[str, Any] | None = None):
  """A Triton kernel for `mosaic_kernel`.

  Args:
    fn: a ``@triton.jit`` function, bare or under ``@triton.autotune`` and
      ``@triton.heuristics`` (:doc:`decorated Triton kernels </guides/triton_kernels>` says how they
      apply).
    signature: the Triton types of its non-constexpr parameters (``{"x_ptr":
      "*fp32", "n": "i32"}`` or ``["*fp32", "i32"]``). Given, the kernel is
      compiled now and a `Kernel` (a `TritonKernel`) comes back; left out, the
      types are read from each call's avals and scalars, and the kernel is
      compiled when the call is traced (a `TritonFunction`).
    constexprs: values of its ``tl.constexpr`` parameters.
    num_warps, num_stages, num_ctas: Triton's launch options.
    maxnreg: the most registers a thread may use (PTX ``.maxnreg``), or None.
    targets: archs to compile for (default: the visible GPUs', or sm_90).
    options: Triton's other compile options, by the names of its NVIDIA
      backend's (``{"enable_fp_fusion": False, "debug": True}``); those that
      would change the launch (``launch_cooperative_grid``, ``arch``, ...)
      are refused, saying what to use instead. With ``debug``, each compile
      prints Triton's intermediate forms (TTIR, TTGIR, LLVM IR, PTX).

  The function must live in a file (``@triton.jit`` reads its source)::

    @triton.jit
    def add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
      offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
      mask = offsets < n
      x = tl.load(x_ptr + offsets, mask=mask)
      tl.store(out_ptr + offsets, x + tl.load(y_ptr + offsets, mask=mask), mask=mask)

    add_call = jmf.mosaic_kernel(
        jmf.triton_kernel(add, constexprs={"BLOCK": 1024}), out_shape=lambda x, y: x,
        grid=lambda meta, x, y: jmf.cdiv(x.size, meta["BLOCK"]),
        scalars=lambda meta, x, y: (np.int32(x.size),), fallback=lambda x, y: x + y)
    z = jax.jit(add_call)(x, y)

  :doc:`Triton kernels </guides/triton_kernels>` says how the kernel is specialized, autotuned and
  launched.

  Raises:
    TritonUnavailable: Triton is missing or of an unsupported version.
  """
  require_triton()
  fn, decorators = decorators_lib.unwrap(fn)  # the @triton.jit function, and the decorators read as data
  function_class = function_type(fn)
  if function_class is not TritonFunction:
    maker = function_class.language.maker
    raise TypeError(f"triton_kernel '{fn.__name__}' is a {function_class.language.name} kernel: make it with "
                    f"jmf.{maker}(...), which takes the same arguments")
  return make_function(TritonFunction, fn, decorators, signature=signature, constexprs=constexprs,
                       num_warps=num_warps, num_stages=num_stages, num_ctas=num_ctas, targets=targets,
                       maxnreg=maxnreg, options=options)
