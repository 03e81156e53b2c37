"""A `Plan` as the signature cuTile compiles for (``cuda.tile.compilation.KernelSignature``), in the calling
convention our launch passes (``cutile_python_v1``: shapes never compiled in). Imports cuTile."""

from __future__ import annotations

from jax_mosaic_ffi.cutile.compiler import release as release_lib
from jax_mosaic_ffi.cutile.compiler.plan import SCALAR_TYPES, ArrayArg, ConstantArg, Plan, ScalarArg, TupleArg, \
    XLA_BUFFER_ALIGNMENT

# jax dtype names cuTile has a type for (numpy's name to cuTile's), the element types an array may have.
ARRAY_TYPES = {"bool": "bool_", "int8": "int8", "int16": "int16", "int32": "int32", "int64": "int64",
               "uint8": "uint8", "uint16": "uint16", "uint32": "uint32", "uint64": "uint64", "float16": "float16",
               "bfloat16": "bfloat16", "float32": "float32", "float64": "float64",
               "float8_e4m3fn": "float8_e4m3fn", "float8_e5m2": "float8_e5m2", "float8_e8m0fnu": "float8_e8m0fnu",
               "float4_e2m1fn": "float4_e2m1fn"}


def _constraint(arg, itemsize):
  ct = release_lib.require_cutile()
  from cuda.tile import compilation  # noqa: PLC0415  (optional dependency: cuTile)
  if isinstance(arg, TupleArg):
    return compilation.TupleConstraint([_constraint(a, itemsize) for a in arg.items])
  if isinstance(arg, ConstantArg):
    return compilation.ConstantConstraint(arg.value)
  if isinstance(arg, ScalarArg):
    return compilation.ScalarConstraint(getattr(ct, SCALAR_TYPES[arg.dtype]))
  assert isinstance(arg, ArrayArg)
  shape_div, stride_div = arg.divisors(itemsize(arg))
  return compilation.ArrayConstraint(
      dtype=getattr(ct, ARRAY_TYPES[arg.dtype]), ndim=arg.rank,
      index_dtype=ct.int64 if arg.index_bits == 64 else ct.int32,
      stride_lower_bound_incl=0, alias_groups=() if arg.alias_group is None else (arg.alias_group,),
      may_alias_internally=False, stride_constant=tuple(1 if d == arg.rank - 1 else None for d in range(arg.rank)),
      stride_divisible_by=stride_div, shape_divisible_by=shape_div, base_addr_divisible_by=XLA_BUFFER_ALIGNMENT)


def kernel_signature(plan: Plan, name: str, itemsize):
  """The signature of ``plan``, its entry named as cuTile names it (``name`` mangled with the signature).
  ``itemsize(array)``: an array's element size in bytes."""
  release_lib.require_cutile()
  from cuda.tile import compilation  # noqa: PLC0415  (optional dependency: cuTile)
  constraints = [_constraint(a, itemsize) for a in plan.args]
  convention = compilation.CallingConvention.cutile_python_v1()
  return compilation.KernelSignature(constraints, convention).with_mangled_symbol(name)
