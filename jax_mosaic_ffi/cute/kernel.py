"""`CuteKernel`: a compiled CuTe DSL specialization as a `Kernel`, and `CuteFunction`, what `cute_kernel` returns."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from jax_mosaic_ffi.toolchain.kernel import Kernel, buffer_name


@dataclasses.dataclass(frozen=True, eq=False)
class CuteKernel(Kernel):
  """A `Kernel` whose module holds CuTe DSL objects (``cute.compile``'s output, one per target), made when a
  `CuteFunction`'s call is traced; ``host_args`` are its host function's arguments after the stream, as
  the contract's (kind, buffer, dimension) triples."""

  host_args: tuple[int, ...] = ()
  alignment: int = 256  # the largest address alignment its tensors assume (TensorSpec.ptr_assumed_align)

  def batch_misalignment(self, strides, param_order, num_inputs) -> str | None:
    # It was compiled taking each buffer as aligned as its TensorSpec says (at most as XLA aligns them).
    misaligned = [b for b, s in enumerate(strides) if s % self.alignment]
    if not misaligned:
      return None
    b = misaligned[0]
    return (f"each batch element of {buffer_name(b, num_inputs)} starts {strides[b]} bytes after the last, not a "
            f"multiple of the {self.alignment} bytes the CuTe DSL kernel assumes its buffers are aligned to "
            "(TensorSpec.ptr_assumed_align). Lower it in the spec, or call the kernel in a lax.map")


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
