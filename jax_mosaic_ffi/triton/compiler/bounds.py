"""The tensors a Triton or Gluon kernel may hold, checked before Triton's passes and ptxas run: `BoundedSource`.

A constexpr that sizes a block (``BLOCK=2**20``) makes tensors of that many elements. Triton compiles them, and
ptxas then works through each thread's share of them, spilled to local memory, for minutes and gigabytes (2**20
fp32 elements: 18 minutes and 2.9 GB). Triton's frontend shows every tensor's shape cheaply: the module that a
source's ``make_ir`` returns (TTIR before any pass; a Gluon kernel's, with its layouts) holds each value's type.
`BoundedSource`, a mixin ahead of the source classes our languages hand ``triton.compile`` (languages.py, Gluon's
language), walks that module inside the compile, once, and refuses the largest tensor over `bound_bytes` of the
target with `OversizedTensor`, before any stage runs; compile.py turns it into `TensorTooLarge`. The mixin adds no
method but ``make_ir``, so the source's ``hash()``, Triton's cache key and ours, is the same.

The bound is twice what an SM's registers (65536 32-bit registers, 256 KiB, on every GPU Triton targets) and its
shared memory (`SMEM_KIB`, the most a CTA may have) hold together: 968 KiB on sm_90 and sm_100, 840 KiB on sm_80,
712 KiB on sm_86, sm_89 and sm_120. A CTA keeps a tensor in its registers and shared memory, spilling some; one
larger than twice both lives in local memory, an access per element. A tensor's bytes are its elements times its
element type's (a pointer 8, an i1 1): a 128x256 fp32 accumulator is 128 KiB, a 64K-element row of fp32 256 KiB
(its pointers 512 KiB), both well inside; 2**20 fp32 elements are 4 MiB. The bound is per tensor and per CTA: fewer
warps give each thread more of it, and a compile that is slow within it is stopped by
``JAX_MOSAIC_FFI_COMPILE_TIMEOUT_S`` instead (toolchain/forked_compile.py). Shared memory a Gluon kernel allocates
(``memdesc``) is not counted: a launch refuses more than the GPU has.
"""

from __future__ import annotations

import dataclasses
import re

from jax_mosaic_ffi.base.errors import CompileError

REGISTER_FILE_KIB = 256
# The most shared memory a CTA may have on an SM, by compute capability (CUDA's programming guide); an arch takes the
# entry of the newest one at or below it (sm_103 and sm_110 sm_100's, sm_121 sm_120's), one below them all sm_75's.
SMEM_KIB = {70: 96, 75: 64, 80: 164, 86: 100, 87: 164, 89: 100, 90: 228, 100: 228, 120: 100}
# How many times what an SM holds a tensor may take.
HEADROOM = 2

_TENSOR = re.compile(r"^tensor<((?:\d+x)+)([^,]+?)(?:,.*)?>$")
_BITS = re.compile(r"^[a-z]+(\d+)")


def bound_bytes(arch: int) -> int:
  """The most bytes one tensor of a kernel compiled for ``arch`` (90 for sm_90) may take."""
  known = [a for a in SMEM_KIB if a <= arch]
  smem = SMEM_KIB[max(known)] if known else min(SMEM_KIB.values())
  return HEADROOM * (REGISTER_FILE_KIB + smem) * 1024


@dataclasses.dataclass(frozen=True)
class Tensor:
  """A tensor type of the IR: ``tensor<1048576xf32>`` has shape (1048576,) and element ``f32``."""

  text: str
  shape: tuple[int, ...]
  element: str

  @property
  def element_bytes(self) -> int:
    if self.element.startswith("!tt.ptr") or self.element == "index":
      return 8
    bits = _BITS.match(self.element)
    return max(1, int(bits.group(1)) // 8) if bits else 4

  @property
  def bytes(self) -> int:
    count = 1
    for n in self.shape:
      count *= n
    return count * self.element_bytes

  def describe(self) -> str:
    """``tensor<1048576xf32> (1048576 elements of 4 bytes: 4096 KiB)``; a shape of several dimensions with its
    product (``256x512 = 131072 elements``)."""
    count = self.bytes // self.element_bytes
    shape = f"{'x'.join(map(str, self.shape))} = " if len(self.shape) > 1 else ""
    return (f"{self.text} ({shape}{count} elements of {self.element_bytes} "
            f"byte{'s' if self.element_bytes > 1 else ''}: {self.bytes // 1024} KiB)")


def parse(type_text: str) -> Tensor | None:
  """The tensor a type of the IR is, or None (a scalar, a pointer, a descriptor, shared memory)."""
  found = _TENSOR.match(type_text)
  if found is None:
    return None
  shape = tuple(int(n) for n in found.group(1).split("x")[:-1])
  element = found.group(2).strip()
  # A layout's text may hold commas: only the element type's own, up to the first, is the element.
  return Tensor(type_text.split(",")[0] + (">" if "," in type_text else ""), shape, element)


class OversizedTensor(Exception):
  """A tensor over the target's bound, found by `check` inside Triton's compile (compile.py names the kernel)."""

  def __init__(self, tensor: Tensor, arch: int):
    self.tensor, self.arch, self.bound = tensor, arch, bound_bytes(arch)
    super().__init__(f"{tensor.describe()} is over the {self.bound // 1024} KiB bound of sm_{arch}")


class TensorTooLarge(CompileError):
  """A Triton or Gluon kernel refused before its compile: one of its tensors is larger than a CTA can hold.

  A constexpr that sizes a block (``BLOCK=2**20``) makes tensors of that many elements, which ptxas would work on
  for minutes and gigabytes. Before Triton's passes run, the compile reads every tensor's shape and type from
  Triton's frontend and refuses one larger than twice an SM's registers and shared memory on the target (968 KiB
  on sm_90; :doc:`Triton kernels </guides/triton_kernels>` has the table). The message names the kernel, its
  constexprs and launch options, the target, the tensor's shape and type, and what to change (smaller blocks).
  A `CompileError`, so autotuning skips such a config::

    try:
      jmf.triton_kernel(add, constexprs={"BLOCK": 2**20}, signature=["*fp32", "*fp32", "*fp32", "i32"])
    except jmf.TensorTooLarge as e:
      print(e.shape, e.element, e.bound)   # (1048576,) f32 991232

  Attributes:
    shape: the tensor's shape; element: its element type, as Triton's IR writes it (``f32``, ``!tt.ptr<f16>``).
    bound: the most bytes a tensor may take on the target.
  """

  def __init__(self, kernel: str, message: str, tensor: Tensor, bound: int):
    self.shape, self.element, self.bound = tensor.shape, tensor.element, bound
    super().__init__(kernel, message, "", "", message=message, compiler="Triton")


def largest(module) -> Tensor | None:
  """The largest tensor a module of Triton's IR computes (each operation's results, block arguments inside loops
  included: they are a loop's results too), or None."""
  found: list[Tensor] = []

  def visit(op):
    for k in range(op.get_num_results()):
      tensor = parse(str(op.get_result(k).get_type()))
      if tensor is not None and (not found or tensor.bytes > found[0].bytes):
        found[:] = [tensor]

  module.walk(visit)  # the callback only records; `check` raises after the walk, outside Triton's C++
  return found[0] if found else None


def check(module, arch: int) -> None:
  """OversizedTensor where the module's largest tensor is over `bound_bytes` of ``arch``."""
  tensor = largest(module)
  if tensor is not None and tensor.bytes > bound_bytes(arch):
    raise OversizedTensor(tensor, arch)


class BoundedSource:
  """Put ahead of a Triton source class (``class Source(BoundedSource, ASTSource)``): its ``make_ir``, which
  ``triton.compile`` calls before any stage, `check`s the module it makes against the target's bound."""

  def make_ir(self, target, *args, **kwargs):
    module = super().make_ir(target, *args, **kwargs)
    check(module, int(target.arch))
    return module
