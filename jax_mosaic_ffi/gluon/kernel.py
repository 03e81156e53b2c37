"""Gluon kernels for `mosaic_kernel`: `gluon_kernel`, `GluonFunction` (compiled per call) and `GluonKernel`.

A ``@gluon.jit`` function is a Triton kernel of another language: the Triton wing's specialization, decorators,
launch and ``triton_call`` binding serve it unchanged (a `GluonFunction` is a `TritonFunction` whose language is
`compiler.language.GLUON`). What is Gluon's own is here: which functions it takes, its source, and what its host
descriptors must hold (a layout Gluon can load with TMA), checked on the host so that a wrong one gets our error.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import numpy as np

from jax_mosaic_ffi.base.errors import LaunchError
from jax_mosaic_ffi.gluon.compiler.language import GLUON
from jax_mosaic_ffi.triton import decorators as triton_decorators
from jax_mosaic_ffi.triton.compiler.compile import TritonKernel
from jax_mosaic_ffi.triton.compiler.release import TritonUnavailable, require_triton
from jax_mosaic_ffi.triton.kernel import TritonFunction, function_type, make_function

# The element widths a TMA descriptor of Gluon's moves (Gluon's own host check: 8, 16 or 32 bits).
_ELEMENT_BITS = (8, 16, 32)


@dataclasses.dataclass(frozen=True, eq=False)
class GluonKernel(TritonKernel):
  """A `Kernel` compiled by Triton from a ``@gluon.jit`` function: `gluon_kernel` with ``signature=`` returns
  one, compiled at once for every target. `mosaic_kernel` launches it as a `TritonKernel`: its block (32 x the
  metadata's warps, a warp-specialized kernel's workers included), shared memory and cluster come from Triton's
  metadata."""

  language = GLUON


class GluonFunction(TritonFunction):
  """A ``@gluon.jit`` function with its constexprs and options, compiled per call signature when a call is
  traced: `gluon_kernel` without ``signature=`` returns one; pass it to `mosaic_kernel`.

  Attributes:
    fn: the ``@gluon.jit`` function.
    constexprs: the values of its ``gl.constexpr`` parameters given to `gluon_kernel` (a parameter named like a
      launch option, ``num_warps: gl.constexpr``, takes the option's value instead).
    options: its compile and launch options (``num_warps``, ``num_stages``, ``num_ctas``, ``maxnreg`` and
      Triton's other options).
    decorators: the ``@triton.autotune`` / ``@triton.heuristics`` layers it came with, outermost first.
  """

  language = GLUON

  @classmethod
  def takes(cls, fn) -> bool:
    is_gluon = getattr(fn, "is_gluon", None)  # JITFunction.is_gluon: Triton's own test, in 3.6 and later
    return bool(is_gluon()) if callable(is_gluon) else False

  def specialize(self, signature: Sequence[Any], scalar_values: Mapping[int, Any] | None = None) -> GluonKernel:
    kernel = super().specialize(signature, scalar_values)
    return GluonKernel(kernel.name, kernel.compiled, kernel.info)

  def check_descriptor(self, descriptor, where: str) -> None:
    """LaunchError, saying what to change, where a host descriptor (a `tensor_descriptor.Bound`) has no layout a
    Gluon TMA descriptor takes: Gluon's own host checks (its ``TensorDescriptor``), made before Triton sees it."""
    check_layout(descriptor.layout, descriptor.aval.dtype, descriptor.block_shape,
                 f"{where}: param_order entry {descriptor.decl}")


def check_layout(layout, dtype, block_shape: Sequence[int], name: str) -> None:
  """LaunchError naming ``name`` unless ``layout`` is a shared layout a Gluon host descriptor of a ``dtype`` array
  moving blocks of ``block_shape`` may have: an ``NVMMASharedLayout`` of the block's rank and the element's width,
  no wider swizzle than the block's rows."""
  from triton.experimental.gluon.language import NVMMASharedLayout  # noqa: PLC0415  (optional dependency: Triton)
  dtype = np.dtype(dtype)
  bits = 8 * dtype.itemsize
  block = list(block_shape)
  suggestion = f"gl.NVMMASharedLayout.get_default_for({block}, gl.{_gluon_dtype(dtype)})"
  if layout is None:
    raise LaunchError(f"{name}: a Gluon kernel's host descriptor needs the block's shared layout: pass "
                      f"layout={suggestion} (or the layout the kernel was written for)")
  if not isinstance(layout, NVMMASharedLayout):
    raise LaunchError(f"{name}: layout={layout!r}; a Gluon host descriptor is a TMA descriptor, whose layout is an "
                      f"NVMMASharedLayout, such as {suggestion}")
  if layout.fp4_padded:
    raise LaunchError(f"{name}: layout={layout!r} is fp4_padded, which jax_mosaic_ffi does not encode (padded fp4 "
                      f"is Blackwell's); use {suggestion}")
  if layout.rank != len(block):
    raise LaunchError(f"{name}: layout={layout!r} has rank {layout.rank}, but block_shape {block} has rank "
                      f"{len(block)}; use {suggestion}")
  if layout.element_bitwidth != bits or bits not in _ELEMENT_BITS:
    fits = "" if bits in _ELEMENT_BITS else f"; Gluon's TMA descriptors move {_ELEMENT_BITS}-bit elements only"
    raise LaunchError(f"{name}: layout={layout!r} has element_bitwidth={layout.element_bitwidth}, but the array "
                      f"is {dtype.name} ({bits}-bit elements){fits or f': use {suggestion}'}")
  row = block[-1] * dtype.itemsize
  if row < layout.swizzle_byte_width:
    raise LaunchError(f"{name}: a block row is {block[-1]} x {dtype.name} = {row} bytes, less than the layout's "
                      f"swizzle_byte_width={layout.swizzle_byte_width}: widen block_shape[-1] to at least "
                      f"{layout.swizzle_byte_width // dtype.itemsize}, or use {suggestion}")


def _gluon_dtype(dtype: np.dtype) -> str:
  """The name of Gluon's dtype for a numpy one (gl.float16, gl.bfloat16, gl.int8, ...)."""
  return {"float8_e4m3fn": "float8e4nv", "float8_e5m2": "float8e5"}.get(dtype.name, dtype.name)


def require_gluon():
  """Triton (a supported release) with its Gluon, or TritonUnavailable saying what to install."""
  triton = require_triton()
  try:
    from triton.experimental import gluon  # noqa: PLC0415,F401  (optional dependency: Triton)
  except ImportError as e:
    raise TritonUnavailable(f"jmf.gluon_kernel needs Triton's Gluon (triton.experimental.gluon); Triton "
                            f"{triton.__version__} has none ({e})") from None
  return triton


def gluon_kernel(fn, *, signature: Mapping[str, str] | Sequence[str] | None = None,
                 constexprs: Mapping[str, Any] | None = None, num_warps: int = 4, num_stages: int = 3,
                 num_ctas: int = 1, targets=None, maxnreg: int | None = None,
                 options: Mapping[str, Any] | None = None):
  """A Gluon kernel for `mosaic_kernel`: as `triton_kernel`, for a ``@gluon.jit`` function.

  Args:
    fn: a ``@gluon.jit`` function, bare or under ``@triton.autotune`` and ``@triton.heuristics``.
    signature: the Triton types of its non-constexpr parameters; given, the kernel is compiled now and a
      `GluonKernel` comes back; left out, the types are read from each call (a `GluonFunction`). A host
      descriptor's type names its layout, as Triton writes it:
      ``tensordesc<fp16[128, 64],NVMMASharedLayout(swizzle_byte_width=128, ...)>``.
    constexprs: values of its ``gl.constexpr`` parameters (layouts, ``@aggregate`` classes, numbers). A parameter
      named like a launch option (``num_warps: gl.constexpr``, as Gluon's tutorials write) takes that option's
      value, as Triton's launcher binds it: pass ``num_warps=``, not a constexpr.
    num_warps, num_stages, num_ctas: Triton's launch options. ``num_warps`` must be what the kernel's layouts
      are written for; a warp-specialized kernel launches more (its workers'), as Triton's metadata says.
      ``num_stages`` does not change a Gluon kernel (Gluon pipelines by hand).
    maxnreg: the most registers a thread may use (PTX ``.maxnreg``), or None.
    targets: archs to compile for (default: the visible GPUs', or sm_90).
    options: Triton's other compile options (``{"debug": True}`` prints Gluon's intermediate forms).

  Its host descriptors are `TensorDescriptor` entries of ``param_order`` with ``layout=`` (a
  ``gl.NVMMASharedLayout``), checked on the host. The function must live in a file. With Triton 3.8 or newer
  (``tma.async_load``; Triton 3.6 and 3.7 call it ``tma.async_copy_global_to_shared``)::

    @gluon.jit
    def copy_tile(in_desc, out_ptr, M: gl.constexpr, N: gl.constexpr):
      smem = gl.allocate_shared_memory(in_desc.dtype, [M, N], in_desc.layout)
      bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
      mbarrier.init(bar, count=1)
      mbarrier.expect(bar, in_desc.block_type.nbytes)
      tma.async_load(in_desc, [0, 0], bar, smem)
      mbarrier.wait(bar, phase=0)
      layout: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [4, 1], [1, 0])
      rows = gl.arange(0, M, layout=gl.SliceLayout(1, layout))[:, None]
      cols = gl.arange(0, N, layout=gl.SliceLayout(0, layout))[None, :]
      gl.store(out_ptr + rows * N + cols, smem.load(layout))

    layout = gl.NVMMASharedLayout.get_default_for([64, 64], gl.float16)
    copy = jmf.mosaic_kernel(
        jmf.gluon_kernel(copy_tile, constexprs={"M": 64, "N": 64}), lambda x: x, grid=1,
        param_order=(jmf.TensorDescriptor.from_tensor("in0", [64, 64], layout=layout), "out0"))
    y = jax.jit(copy)(x)

  :doc:`Triton kernels </guides/triton_kernels>` has the Gluon section: descriptors, warp specialization,
  autotuning, and Gluon's names per Triton release.

  Raises:
    TritonUnavailable: Triton is missing, of an unsupported version, or without Gluon.
    TypeError: ``fn`` is not a ``@gluon.jit`` function (a ``@triton.jit`` one is `triton_kernel`'s).
  """
  require_gluon()
  fn, decorators = triton_decorators.unwrap(fn, made="jmf.gluon_kernel", jit="@gluon.jit")
  if not issubclass(function_type(fn), GluonFunction):
    raise TypeError(f"gluon_kernel '{fn.__name__}' is a @triton.jit function: make it with jmf.triton_kernel(...), "
                    "which takes the same arguments")
  return make_function(GluonFunction, fn, decorators, signature=signature, constexprs=constexprs,
                       num_warps=num_warps, num_stages=num_stages, num_ctas=num_ctas, targets=targets,
                       maxnreg=maxnreg, options=options)
