"""The typed check of a launch: each kernel parameter's declared C++ type against what the call passes.

Sizes alone let bf16 or int32 arrays into a ``const float*`` kernel, or an int and a float scalar of the
same width swapped; the GPU then computes garbage. Where the kernel's parameter types are known
(toolchain/param_types.py: NVRTC's type probe, a mangled symbol, or ``signature=``), each one is checked
at trace time against the array or scalar the call passes there. The rule, per declared type:

* ``void*``, ``char*``, ``unsigned char*``: any array (bytes); every pointer takes the scratch buffer.
* a pointer to a float type (``float``, ``double``, ``__half``, ``__nv_bfloat16``, ``__nv_fp8_e4m3``,
  ``__nv_fp8_e5m2``): arrays of exactly that dtype.
* a pointer to an integer type: integer (or bool) arrays of its width, of either sign; those of 1 and 2
  bytes also take floats of their width, as raw bits (``uint16_t*`` for bf16 / fp16, ``uint8_t*`` fp8).
* a pointer to a CUDA vector type (``float4*``, ``__half2*``): arrays of its lane's dtype, as above
  (and complex64 for ``float2*``, complex128 for ``double2*``).
* a pointer to any other struct or class: any array, as ``void*`` (the layout is yours); a pointer to a
  pointer (``float**``): arrays of 8-byte integers (addresses).
* a value of a type above: a scalar of the dtype its pointer would take; structs and vector types by value
  (``CUtensorMap``), by size only (which the PTX check already did).
* 8-byte integer values (``uintptr_t``) also take an array (its address), and pointers an 8-byte integer
  scalar (an address).

Const-ness does not matter. Parameters are named by position (``parameter 2``, counted from 0 as PTX
does), with their declared type.
"""

from __future__ import annotations

import functools
from typing import Any

import jax.numpy as jnp
import numpy as np

from jax_mosaic_ffi.base.errors import LaunchError
from jax_mosaic_ffi.base.native import core
from jax_mosaic_ffi.toolchain.param_types import BUILTIN, ParamType

_TENSOR_MAP_CODE = core.LIMITS["tensor_map_code"]
_ANY_BYTES = ("void", "char", "unsigned char")
_COMPLEX_OF = {"float2": "complex64", "double2": "complex128"}
# dtype name -> the C++ element type a message suggests declaring for it.
_SPELLING_OF = {"bool": "bool", "int8": "int8_t", "uint8": "uint8_t", "int16": "int16_t", "uint16": "uint16_t",
                "int32": "int", "uint32": "unsigned int", "int64": "int64_t", "uint64": "uint64_t",
                "float16": "__half", "bfloat16": "__nv_bfloat16", "float32": "float", "float64": "double",
                "float8_e4m3fn": "__nv_fp8_e4m3", "float8_e5m2": "__nv_fp8_e5m2"}


@functools.lru_cache(maxsize=64)
def _dtype(name: str) -> np.dtype:
  return jnp.dtype(name)


def _element_takes(element: str, dtype: np.dtype) -> bool:
  """Whether memory of ``element``s may be read as ``dtype`` data (see the module's rule)."""
  if element in _ANY_BYTES:
    return True
  if element in _COMPLEX_OF and dtype.name == _COMPLEX_OF[element]:
    return True
  lane = ParamType("", True, element).lane
  wanted = BUILTIN.get(lane or element)
  if wanted is None:
    return True  # a struct or class of the user's
  want = _dtype(wanted)
  if want.kind in "iub":
    return dtype.itemsize == want.itemsize and (dtype.kind in "iub" or want.itemsize <= 2)
  return dtype == want


def _wanted(declared: ParamType) -> str:
  """What a pointer parameter takes, for a message: "float32 data (x.astype(jnp.float32))"."""
  wanted = BUILTIN.get(declared.lane or declared.element)
  if wanted is None:
    return "data of its type"
  want = _dtype(wanted)
  if want.kind in "iub":
    extra = {2: ", float16 or bfloat16", 1: " or float8"}.get(want.itemsize, "")
    return f"{want.itemsize * 8}-bit integer{extra} data (x.astype(jnp.{wanted}))"
  return f"{wanted} data (x.astype(jnp.{wanted}))"


def _is_address_integer(declared: ParamType) -> bool:
  return not declared.pointer and BUILTIN.get(declared.element) in ("int64", "uint64")


def _passed(spec, in_avals, out_avals) -> list[tuple[str, np.dtype | None, Any]]:
  """What the call passes, per kernel parameter: (kind, dtype, where to find its description), kind "array",
  "scalar", "scratch" or "opaque" (a tensor map, the collective metadata: the runtime's, checked by size).
  Descriptions are written only for a message (`_describe`): a passing check builds no strings."""
  n_in, n_buffers = len(in_avals), len(in_avals) + len(out_avals)
  passed = []
  for code in spec.param_order:
    if code >= _TENSOR_MAP_CODE:
      passed.append(("opaque", None, ("tensor map", code - _TENSOR_MAP_CODE)))
    elif code >= n_buffers - spec.num_scratch:
      passed.append(("scratch", None, ("scratch",)))
    elif code >= 0:
      aval = in_avals[code] if code < n_in else out_avals[code - n_in]
      passed.append(("array", aval.dtype, ("array", f"in{code}" if code < n_in else f"out{code - n_in}", aval)))
    else:
      k = -code - 1
      dtype = _dtype(spec.scalar_dtypes[k]) if k < len(spec.scalar_dtypes) else None
      passed.append(("scalar" if dtype is not None else "opaque", dtype, ("scalar", k, dtype)))
  if spec.batch_grid_axis is not None:
    passed.append(("scalar", np.dtype(np.uint32), ("grid length",)))
    passed += [("scalar", np.dtype(np.uint64), ("stride", b)) for b in range(spec.num_inputs + spec.num_outputs)]
  if spec.collective is not None:
    passed.append(("opaque", None, ("metadata",)))
  return passed


def _describe(what) -> str:
  """A passed parameter, for a message: "in0, a bfloat16[1024] array"."""
  kind = what[0]
  if kind == "array":
    return f"{what[1]}, {_a(what[2].dtype)}{list(what[2].shape)} array"
  if kind == "scalar":
    return f"scalars[{what[1]}], {_a(what[2])} value"
  return {"tensor map": lambda: f"tensor map {what[1]}", "scratch": lambda: "the scratch buffer",
          "grid length": lambda: "the element's grid length, a uint32 value",
          "stride": lambda: f"the batch stride of buffer {what[1]}, a uint64 value",
          "metadata": lambda: "the collective metadata pointer"}[kind]()


def _a(dtype) -> str:
  return f"{'an' if str(dtype)[0] in 'aeio' else 'a'} {dtype}"


@functools.lru_cache(maxsize=4096)
def _mismatch(declared: ParamType, kind: str, dtype) -> bool:
  if kind == "opaque":
    return False
  if kind == "scratch":  # bytes, for the kernel to use as any type
    return not (declared.pointer or _is_address_integer(declared) or declared.element not in BUILTIN)
  if kind == "array":
    if not declared.pointer:
      return not (_is_address_integer(declared) or declared.element not in BUILTIN)
    if declared.element_is_pointer:
      return dtype.kind not in "iu" or dtype.itemsize != 8
    return not _element_takes(declared.element, dtype)
  if declared.pointer:  # a scalar where a pointer goes: an address as an 8-byte integer only
    return dtype.kind not in "iu" or dtype.itemsize != 8
  if declared.element not in BUILTIN:
    return False  # a struct or vector by value: its size was checked
  return not _element_takes(declared.element, dtype)


def _advice(declared: ParamType, kind: str, dtype, name: str) -> str:
  const = "const " if declared.text.startswith("const ") else ""
  if kind == "array" and declared.pointer:
    wanted = _wanted(declared)
    if name.startswith("out"):
      wanted = wanted.split(" (x.astype")[0] + f" (set {name}'s dtype in out_shape)"
    spelling = _SPELLING_OF.get(dtype.name)
    retype = f"'{const}{spelling}*' (or '{const}void*' for any dtype)" if spelling else f"'{const}void*'"
    return f"pass {wanted}, or declare the parameter {retype}"
  if kind in ("array", "scratch"):
    return "a value goes here, not an array: check the order (inputs, outputs, then scalars) or param_order"
  if declared.pointer:
    return ("a pointer goes here: pass an array at this position, or check the order (inputs, outputs, then "
            "scalars) and param_order")
  wanted = BUILTIN[declared.element]
  make = f"ml_dtypes.{wanted}(...)" if wanted.startswith(("bfloat16", "float8")) else f"np.{wanted}(...)"
  return f"pass {make} as {name}, or declare the parameter '{_SPELLING_OF.get(dtype.name, dtype)}'"


def check(kernel, spec, in_avals, out_avals, where: str) -> None:
  """Raises LaunchError at the first parameter whose declared type does not take what the call passes."""
  declared_types = kernel.param_types
  if declared_types is None:
    return
  passed = _passed(spec, in_avals, out_avals)
  if len(passed) != len(declared_types):
    if kernel.param_sizes is not None:
      return  # the size check says what is passed where, by size
    # A cubin's signature=: nothing else counts its parameters before it is loaded.
    listed = ", ".join(f"'{t.text}'" for t in declared_types)
    raise LaunchError(f"{where}: the kernel takes {len(declared_types)} parameters ({listed}), but the call passes "
                      f"{len(passed)}: {'; '.join(_describe(w) for _, _, w in passed) or 'none'}; the order is "
                      "inputs, outputs, then scalars")
  for index, (declared, (kind, dtype, what)) in enumerate(zip(declared_types, passed)):
    if _mismatch(declared, kind, dtype):
      described = _describe(what)
      name = described.split(",", 1)[0]
      raise LaunchError(f"{where}: the kernel's parameter {index} is '{declared.text}', but the call passes "
                        f"{described}; {_advice(declared, kind, dtype, name)}")
