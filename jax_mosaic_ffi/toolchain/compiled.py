"""A kernel module as the caches keep it: bytes and parsed, with what is derived from it, computed once."""

from __future__ import annotations

import dataclasses
import json
import struct

from jax_mosaic_ffi.base import file_deps
from jax_mosaic_ffi.base import module_format
from jax_mosaic_ffi.base import ptx_info
from jax_mosaic_ffi.base.module_format import ImageKind, ParsedModule

# The JSON header of a cache entry: its list of headers read is the large part.
_MAX_ENTRY_HEADER = 16 << 20
# A parameter type's spelling, as the demangler writes it ("__nv_bfloat16 const*"): bounded when read back.
_MAX_TYPE_TEXT = 512


@dataclasses.dataclass(frozen=True, eq=False)
class Compiled:
  """A kernel module, as bytes and parsed, with what is derived from it, computed once."""

  parsed: ParsedModule
  module_bytes: bytes
  hash: bytes
  param_sizes: tuple[int, ...] | None  # from the PTX, when the module has some
  deps: file_deps.Deps = ()  # the files the compile read, with their hashes
  # Each parameter's C++ type (toolchain/param_types.py), when the compiler, the symbol or signature= said.
  param_types: tuple[str, ...] | None = None

  @classmethod
  def of(cls, parsed: ParsedModule, param_sizes: tuple[int, ...] | None, deps: file_deps.Deps = (),
         param_types: tuple[str, ...] | None = None) -> "Compiled":
    data = module_format.serialize(parsed)
    if param_types is not None and param_sizes is not None and len(param_types) != len(param_sizes):
      param_types = None  # types that do not describe these parameters are no types
    return cls(parsed, data, module_format.kernel_hash(data), param_sizes, deps, param_types)

  def image_names(self) -> list[str]:
    """Its images as a pack's manifest names them (module_format.image_name): ["cubin sm_90", "ptx sm_90"]."""
    return [module_format.image_name(i.kind, i.arch) for i in self.parsed.images]

  def to_bytes(self) -> bytes:
    header = json.dumps({"param_sizes": self.param_sizes, "deps": self.deps,
                         "param_types": self.param_types}).encode()
    return struct.pack("<I", len(header)) + header + self.module_bytes

  @classmethod
  def from_bytes(cls, data: bytes) -> "Compiled":
    """Reads `to_bytes` back; raises ValueError on anything malformed."""
    if len(data) < 4:
      raise ValueError("truncated")
    (length,) = struct.unpack_from("<I", data)
    if length > min(len(data) - 4, _MAX_ENTRY_HEADER):
      raise ValueError("bad header length")
    header = json.loads(data[4:4 + length])
    sizes = header.get("param_sizes") if isinstance(header, dict) else None
    if sizes is not None and not (isinstance(sizes, list) and len(sizes) <= module_format.LIMITS["max_params"]
                                  and all(type(s) is int and 1 <= s <= 4096 for s in sizes)):
      raise ValueError("bad param_sizes")
    types = header.get("param_types") if isinstance(header, dict) else None
    if types is not None and not (isinstance(types, list) and len(types) <= module_format.LIMITS["max_params"]
                                  and all(isinstance(t, str) and len(t) <= _MAX_TYPE_TEXT for t in types)):
      raise ValueError("bad param_types")
    deps = file_deps.checked(header.get("deps", []))
    module_bytes = data[4 + length:]
    if types is not None and sizes is not None and len(types) != len(sizes):
      raise ValueError("param_types and param_sizes disagree")
    return cls(module_format.parse(module_bytes), module_bytes, module_format.kernel_hash(module_bytes),
               tuple(sizes) if sizes is not None else None, deps, tuple(types) if types is not None else None)


def param_sizes(parsed: ParsedModule) -> tuple[int, ...] | None:
  """The kernel's parameter sizes, read from the module's PTX when it has one."""
  for image in parsed.images:
    if image.kind == ImageKind.PTX:
      return ptx_info.entries(image.data.decode(errors="replace")).get(parsed.symbol)
  return None


class PendingCompiled:
  """A `Compiled` being made ahead (store/ahead.py), in a kernel that was returned before its compile ended: each of
  its attributes waits for the compile, and raises the compile's error where it failed.

  ``resolve``: returns the `Compiled` once made (or raises its error).
  """

  __slots__ = ("_resolve", "_value")

  def __init__(self, resolve):
    self._resolve, self._value = resolve, None

  def resolved(self) -> Compiled:
    if self._value is None:
      self._value = self._resolve()
      self._resolve = None  # what it held (the lookup, the user's frames) goes with it
    return self._value

  def __getattr__(self, name):
    return getattr(self.resolved(), name)

  def __reduce__(self):
    return self.resolved().__reduce__()
