"""A kernel's parameter types, as C++ spells them: read from the compiler, a mangled symbol, or signature=.

Three sources, one form (a tuple of C++ type spellings, e.g. ``("float const*", "float*", "int")``):

* CUDA C++ through NVRTC: the compile also instantiates ``PROBE`` on the kernel's own function type
  (``jmf_probe::signature<decltype(&axpy)>``), an empty template that is never launched. Its lowered
  (mangled) name carries that function type, for ``extern "C"`` kernels and C++ ones alike, concrete
  after template arguments are substituted; demangled, it gives the parameter list. No regex reads the
  source: the compiler resolved typedefs, templates and macros.
* a mangled symbol of a PTX or cubin kernel (``_Z3addIfEvPKT_S2_PS0_i``): its own parameter list.
* ``signature=["const float*", "float*", "int"]`` (or dtypes) given to `ptx_kernel` / `cubin_kernel`.

`ParamType.parse` reads one spelling; what a type accepts is the call layer's rule (call/param_types.py).
"""

from __future__ import annotations

import dataclasses
import functools
import re

import numpy as np

from jax_mosaic_ffi.toolchain import demangle

# Compiled with every CUDA C++ kernel, after the user's source: a name expression instantiates it on the
# kernel's function type. Empty, and never launched: it adds one empty entry to the module, nothing else.
PROBE_SOURCE = "\nnamespace jmf_probe { template <class T> __global__ void signature() {} }\n"
_PROBE_PREFIX = "void jmf_probe::signature<"
_PROBE_SUFFIX = ">()"


def probe_expression(name: str) -> str:
  """The NVRTC name expression whose lowered name carries ``name``'s function type."""
  return f"jmf_probe::signature<decltype(&{name})>"


# C++ spellings of integer types -> their canonical (demangled) names; typedefs a user may write in signature=.
_SPELLINGS = {
    "signed": "int", "unsigned": "unsigned int", "signed int": "int", "short int": "short",
    "unsigned short int": "unsigned short", "long int": "long", "unsigned long int": "unsigned long",
    "long long int": "long long", "unsigned long long int": "unsigned long long", "signed char": "signed char",
    "int8_t": "signed char", "uint8_t": "unsigned char", "int16_t": "short", "uint16_t": "unsigned short",
    "int32_t": "int", "uint32_t": "unsigned int", "int64_t": "long", "uint64_t": "unsigned long",
    "size_t": "unsigned long", "ptrdiff_t": "long", "intptr_t": "long", "uintptr_t": "unsigned long",
    "half": "__half", "nv_bfloat16": "__nv_bfloat16", "half2": "__half2", "nv_bfloat162": "__nv_bfloat162",
    "CUtensorMap": "CUtensorMap_st",
}

# Element types with a dtype of their own: (numpy dtype name, is an integer).
BUILTIN = {
    "bool": "bool", "char": "int8", "signed char": "int8", "unsigned char": "uint8",
    "short": "int16", "unsigned short": "uint16", "int": "int32", "unsigned int": "uint32",
    "long": "int64", "unsigned long": "uint64", "long long": "int64", "unsigned long long": "uint64",
    "float": "float32", "double": "float64", "__half": "float16", "__nv_bfloat16": "bfloat16",
    "__nv_fp8_e4m3": "float8_e4m3fn", "__nv_fp8_e5m2": "float8_e5m2",
}
# CUDA's vector types, by their lane type: float4 -> float. __half2 and __nv_bfloat162 too.
_VECTOR = re.compile(r"(char|uchar|short|ushort|int|uint|long|ulong|longlong|ulonglong|float|double)([1-4])")
_VECTOR_LANES = {"char": "signed char", "uchar": "unsigned char", "short": "short", "ushort": "unsigned short",
                 "int": "int", "uint": "unsigned int", "long": "long", "ulong": "unsigned long",
                 "longlong": "long long", "ulonglong": "unsigned long long", "float": "float", "double": "double"}
_PAIRS = {"__half2": "__half", "__nv_bfloat162": "__nv_bfloat16"}
# A dtype given in signature= (a scalar of it), as C++ spells that type.
_DTYPE_SPELLINGS = {dtype: spelling for spelling, dtype in BUILTIN.items()
                    if spelling not in ("char", "long long", "unsigned long long")}


# Compiled once: a type's first parse is part of the first typed check, which is timed (benchmarks/).
_QUALIFIERS = re.compile(r"\b(const|volatile|__restrict__|__restrict|restrict|struct|class|__grid_constant__)\b")
_CONST = re.compile(r"\bconst\b")


@dataclasses.dataclass(frozen=True)
class ParamType:
  """One kernel parameter's type: ``text`` as written for the user (``"const float*"``), whether it is a
  pointer, and the type pointed to (or the value's type): ``element`` in its canonical spelling."""

  text: str
  pointer: bool
  element: str
  element_is_pointer: bool = False  # float** and the like

  @property
  def lane(self) -> str | None:
    """The lane type of a CUDA vector type (float4 -> float), else None."""
    if self.element in _PAIRS:
      return _PAIRS[self.element]
    match = _VECTOR.fullmatch(self.element)
    return _VECTOR_LANES[match.group(1)] if match else None

  @classmethod
  def parse(cls, text: str) -> "ParamType":
    """One C++ type spelling (as demangled, ``"float const*"``, or as written, ``"const float *"``)."""
    words = _QUALIFIERS.sub(" ", text)
    stars = words.count("*") + words.count("&")
    base = " ".join(words.replace("*", " ").replace("&", " ").split())
    base = _SPELLINGS.get(base.removeprefix("std::"), base)
    constant = _CONST.search(text) is not None and stars > 0
    shown = ("const " if constant else "") + base + "*" * stars
    return cls(text=shown, pointer=stars > 0, element=base, element_is_pointer=stars > 1)


def builtin_size(element: str) -> int | None:
  """The size in bytes of a value of an element type with a dtype of its own, else None."""
  dtype = BUILTIN.get(element)
  return None if dtype is None else (8 if dtype.endswith("64") else 4 if dtype.endswith("32") else
                                     2 if dtype.endswith("16") else 1)


@functools.lru_cache(maxsize=4096)
def parsed(text: str) -> ParamType:
  return ParamType.parse(text)


def _parameter_list(function: str) -> tuple[str, ...] | None:
  group = demangle.last_group(function)
  if group is None:
    return None
  inside = function[group[0]:group[1]].strip()
  return () if inside in ("", "void") else tuple(demangle.split_top_level(inside))


def of_probe(lowered: str) -> tuple[str, ...] | None:
  """The parameter types in the probe's lowered name; None if it is not what the probe makes."""
  text = demangle.demangle(lowered)
  if text is None or not text.startswith(_PROBE_PREFIX) or not text.endswith(_PROBE_SUFFIX):
    return None
  function_type = text[len(_PROBE_PREFIX):-len(_PROBE_SUFFIX)]
  if "(*)" not in function_type:  # not a function (a __device__ variable's name, say)
    return None
  return _parameter_list(function_type)


def of_symbol(symbol: str) -> tuple[str, ...] | None:
  """The parameter types a mangled kernel symbol carries; None for an ``extern "C"`` name."""
  text = demangle.demangle(symbol)
  return None if text is None else _parameter_list(text)


def of_signature(signature, what: str) -> tuple[str, ...]:
  """``signature=`` as given to ptx_kernel / cubin_kernel: C++ spellings (``"const float*"``), or
  dtypes (``np.int32``, ``jnp.bfloat16``) for scalars of them; a pointer to a dtype is written
  ``"bfloat16*"`` (numpy's name and a star)."""
  if isinstance(signature, (str, bytes)) or not hasattr(signature, "__iter__"):
    raise TypeError(f"{what}: signature must be a list of parameter types, like ['const float*', 'float*', "
                    f"'int'], got {signature!r}")
  types = []
  for index, entry in enumerate(signature):
    if isinstance(entry, str):
      parsed_entry = ParamType.parse(entry)
      element = parsed_entry.element
      if element in _DTYPE_SPELLINGS:  # a numpy name: "bfloat16*"
        element = _DTYPE_SPELLINGS[element]
      if element in BUILTIN or element in ("void", "CUtensorMap_st") or parsed_entry.lane is not None:
        types.append(("const " if parsed_entry.text.startswith("const ") else "") + element +
                     "*" * parsed_entry.text.count("*"))
        continue
      raise ValueError(f"{what}: signature[{index}] = {entry!r} is not a type this check knows; write a C++ "
                       "type ('const float*', '__nv_bfloat16*', 'int', 'unsigned long long', 'void*') or a "
                       "numpy dtype name ('float32*', 'int32')")
    try:
      dtype = np.dtype(entry).name
    except TypeError:
      dtype = None
    if dtype not in _DTYPE_SPELLINGS:
      raise ValueError(f"{what}: signature[{index}] = {entry!r} is neither a C++ type spelling nor a numeric dtype")
    types.append(_DTYPE_SPELLINGS[dtype])
  return tuple(types)
