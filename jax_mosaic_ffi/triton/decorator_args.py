"""A traced call's arguments as Triton's decorators see them: an array as `ArrayArg` (shape, dtype, row-major
strides, torch-style methods, no data and no address yet), its dtype as `ArgDtype` (equal to the names heuristics
compare it with: numpy's, Triton's, torch's). decorated.py hands them to ``@triton.heuristics`` and to
``@triton.autotune``'s ``prune_configs_by`` when a call is traced.
"""

from __future__ import annotations

import numpy as np

from jax_mosaic_ffi.call.tensor_map import row_major_strides
from jax_mosaic_ffi.triton import launch as triton_launch


class ArgDtype:
  """An array's dtype as heuristics test it: equal to its numpy/JAX dtype, its Triton type ("fp16",
  ``tl.float16``), its torch dtype (``torch.float16``) or their names; ``itemsize``; ``is_floating_point``."""

  def __init__(self, dtype):
    self.numpy = np.dtype(dtype)
    self.name = self.numpy.name
    self.triton = triton_launch.triton_type(self.numpy)
    self.itemsize = self.numpy.itemsize
    self.is_floating_point = self.numpy.kind == "f" or self.name in ("bfloat16",) or self.name.startswith("float8")
    self.is_signed = self.numpy.kind in "if" or self.is_floating_point

  def __eq__(self, other):
    if isinstance(other, ArgDtype):
      return self.name == other.name
    if isinstance(other, str):
      return other in (self.name, self.triton, f"torch.{self.name}")
    module = type(other).__module__ or ""
    if module.split(".")[0] == "torch":
      return str(other) == f"torch.{self.name}"
    if module.split(".")[0] == "triton":
      return getattr(other, "name", None) == self.triton
    try:
      return np.dtype(other) == self.numpy
    except TypeError:
      return NotImplemented

  def __hash__(self):
    return hash(self.name)

  def __repr__(self):
    return self.name


class ArrayArg:
  """An array argument as Triton's decorators see it when the call is traced: shape, dtype and row-major
  strides (in elements), torch-style methods too; no data and no address yet."""

  def __init__(self, name: str, aval):
    self.name, self.shape, self.dtype = name, tuple(int(d) for d in aval.shape), ArgDtype(aval.dtype)
    self.ndim = len(self.shape)
    self._strides = row_major_strides(self.shape)

  def numel(self) -> int:
    return int(np.prod(self.shape, dtype=np.int64))

  nelement = numel

  def dim(self) -> int:
    return self.ndim

  def size(self, axis=None):
    return self.shape if axis is None else self.shape[axis]

  def stride(self, axis=None):
    return self._strides if axis is None else self._strides[axis]

  def element_size(self) -> int:
    return self.dtype.itemsize

  def is_contiguous(self) -> bool:
    return True

  def data_ptr(self):
    raise TypeError(f"argument {self.name!r} has no address when the call is traced (XLA allocates it later); "
                    "its buffers are 16-byte aligned")

  def __repr__(self):
    return f"ArrayArg({self.name!r}, shape={self.shape}, dtype={self.dtype})"
