"""The CuTe DSL wing's kernels: `cute_kernel`, which makes a `CuteFunction` (a launcher with how to compile it); what
one compiles to, `CuteKernel`, is the compiler room's (compiler/compile.py), as Triton's `TritonKernel` is."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from jax_mosaic_ffi.base.errors import LaunchError, ValueKeyError
from jax_mosaic_ffi.cute.compiler import options as compile_options_lib
from jax_mosaic_ffi.cute.compiler import dsl
from jax_mosaic_ffi.cute.compiler import keys as cute_keys
from jax_mosaic_ffi.cute.compiler import package


@dataclasses.dataclass(frozen=True, eq=False)
class CuteFunction:
  """A ``@cute.jit`` launcher ``(stream, *inputs, *outputs, **constexprs)`` with how to compile it; compiled
  per specialization (shapes, dtypes, tensor specs, constexprs, target) when a call is traced.

  `cute_kernel` returns one; pass it to `mosaic_kernel` (:doc:`CuTe DSL kernels </guides/cute_kernels>`)."""

  fn: Callable[..., None]
  name: str
  input_spec: Any = None
  output_spec: Any = None
  use_static_tensors: bool = False
  constexprs: tuple[tuple[str, Any], ...] = ()
  compile_options: str | None = None
  compile_key: Any = None
  targets: tuple[Any, ...] | None = None
  allow_cuda_graph: bool = True
  # cute_call's pytrees: the inputs' (None leaves included, `input_present` says which are tensors) and the
  # outputs' the launcher gets; None: flat.
  input_tree: Any = None
  input_present: tuple[bool, ...] | None = None
  output_tree: Any = None
  # The mode position at which the launcher's tensors take a batch axis (None: it takes none, and vmap runs it
  # once per batch element).
  batch_mode: int | None = None

  def with_meta(self, meta: dict) -> "CuteFunction":
    """The same launcher with constexprs from an autotuning config."""
    return dataclasses.replace(self, constexprs=tuple({**dict(self.constexprs), **dict(meta)}.items()))

  @property
  def meta(self) -> dict:
    return dict(self.constexprs)

  def __repr__(self) -> str:
    return f"CuteFunction({self.name!r}, constexprs={dict(self.constexprs)})"


def _name(fn) -> str:
  name = getattr(fn, "__name__", None) or type(fn).__name__
  return "lambda" if name == "<lambda>" else name


def cute_kernel(fn: Callable[..., None], *, input_spec=None, output_spec=None, use_static_tensors: bool = False,
                compile_options: str | None = None, compile_key=None, targets=None, allow_cuda_graph: bool = True,
                batch_mode: int | None = None, **constexprs) -> CuteFunction:
  """A CuTe DSL launcher for `mosaic_kernel`.

  ``fn`` is a ``@cute.jit`` function (or any callable that calls one) taking ``(stream, *inputs, *outputs,
  **constexprs)``: each array arrives as a ``cute.Tensor``. It is compiled with ``cute.compile`` per
  specialization when a call is traced, once ever (the compile cache keeps the object on disk)::

      @cute.jit
      def add_one(stream, x: cute.Tensor, y: cute.Tensor, *, BLOCK: cutlass.Constexpr):
        ...  # add_one_kernel(x, y).launch(grid=..., block=(BLOCK, 1, 1), stream=stream)

      f = jmf.mosaic_kernel(jmf.cute_kernel(add_one, BLOCK=256), jax.ShapeDtypeStruct(x.shape, x.dtype))
      y = jax.jit(f)(x)

  Args:
    fn: the launcher.
    input_spec, output_spec: ``cutlass.jax.TensorSpec`` per tensor (layout, mode, static, divisibility,
      ptr_assumed_align), as `cute_call` takes them. ``layout`` is the buffer's physical stride order (CuTe's
      minor-to-major: ``(0, 1)`` is column-major): XLA lays the array out so (copying it where it is laid out
      otherwise), and the launcher's tensor is compact in that order. An input and output that alias need the
      same layout.
    use_static_tensors: compile every tensor's shape and strides in.
    compile_options: more ``cute.compile`` options (``"--opt-level 3"``); not ``--gpu-arch`` (``targets=`` says
      what to compile for) nor ``--host-target`` or ``--enable-tvm-ffi`` (the runtime runs x86-64 objects of the
      DSL's own calling convention).
    compile_key: a stable value that identifies the launcher's code and state: the cache then keys on it
      instead of reading the code. Keyed by its content (a str, bytes, numbers, tuples of them...); one that
      cannot be keyed exactly is refused.
    targets: archs to compile for (default: the visible GPUs', arch-specific: ``sm_90a``).
    allow_cuda_graph: False keeps the call out of XLA's CUDA graphs.
    batch_mode: for a launcher whose tensors take a batch mode (as the DSL's GEMM examples take (M, K, L)): the
      mode position of that batch in every tensor (``2``, or ``-1`` for the last). Each tensor then has it: of
      extent 1 in a plain call, and the whole batch under ``jax.vmap``, which makes one call (inputs vmap does
      not batch are broadcast to the batch). The arrays keep their own shapes: ``(M, K)`` arrays reach the
      launcher as ``(M, K, 1)`` tensors. Without it, ``vmap`` runs the launcher once per batch element.
    **constexprs: keyword arguments passed to ``fn`` as compile-time constants.

  Raises:
    CuteUnavailable: nvidia-cutlass-dsl is missing or of an unsupported release.
  """
  dsl.check_release(package.compiler_release())
  if not callable(fn):
    raise TypeError(f"cute_kernel needs a @cute.jit launcher (a callable), got {type(fn).__name__}")
  if batch_mode is not None and (isinstance(batch_mode, bool) or not isinstance(batch_mode, int)):
    raise TypeError(f"cute_kernel: batch_mode is a mode position (an int, -1 for the last), got {batch_mode!r}")
  made = f"cute_kernel '{_name(fn)}'"
  if compile_key is not None:
    try:
      cute_keys.exact_key(compile_key, "compile_key")
    except ValueKeyError as e:
      raise LaunchError(f"{made}: compile_key={compile_key!r} cannot be keyed exactly ({e}); the cache would take "
                        "another launcher's kernel for this one. Pass a str, bytes, number, or a tuple of them "
                        "(a version string of the launcher's code and state)") from None
  compile_options = compile_options_lib.checked_options(compile_options, made)
  return CuteFunction(fn, _name(fn), input_spec, output_spec, bool(use_static_tensors), tuple(constexprs.items()),
                      compile_options, compile_key, None if targets is None else tuple(targets),
                      bool(allow_cuda_graph), batch_mode=batch_mode)
