"""The serialized kernel module: the bytes that travel in the custom call.

The layout is part of the contract (docs/contract.md). This module writes
it; reading it is the runtime's job: `parse` calls the C++ parser XLA's
instantiate stage runs (csrc/contract/module_format.cc), and the limits come from the
same place, so what lowers here is exactly what the runtime accepts. All
integers are little-endian.

    header   magic "JMFFIMOD" | u32 format_version (2; 1 is still read) | u32 flags
             (bit 0: every image's entry waits for the prerequisite grid: PDL-safe;
              bit 1: linked with NVSHMEM's device library: the runtime starts NVSHMEM for it)
             | u32 num_images | u32 symbol_length | symbol (UTF-8, no NUL)
    image    u32 kind (1 cubin, 2 ptx, 3 CuTe DSL object) | u32 arch (e.g. 90)
             | u32 arch_suffix (0 none, 1 'a', 2 'f') | u32 encoding (0 stored, 1 zlib; format 1: 0)
             | u64 size | size bytes: the payload, or for zlib u64 its size | its zlib stream
    CuTe DSL object payload (kind 3): u32 version_length | the DSL release that made it
             | u32 num_args | u32 per host-function argument after the stream (1 pointer, 2 int64)
             | the object (ELF: the host launch function and the cubin)
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import re
import struct
import zlib

from jax_mosaic_ffi.base.native import core

MAGIC = b"JMFFIMOD"
LIMITS = core.LIMITS
FORMAT_VERSION = LIMITS["module_format_version"]
_SUFFIXES = LIMITS["arch_suffixes"]  # index = the arch_suffix field
FLAG_PDL_WAIT = LIMITS["module_flag_pdl_wait"]
FLAG_NVSHMEM = LIMITS["module_flag_nvshmem"]
ENCODING_ZLIB = LIMITS["encoding_zlib"]
MAX_INFLATED_BYTES = LIMITS["max_inflated_module_bytes"]  # all of a module's compressed images, inflated
# zlib's default: within 1% of its best on cubins and PTX, at a quarter of the time.
_ZLIB_LEVEL = 6

_HEADER = struct.Struct("<8sIIII")
_IMAGE = struct.Struct("<IIIIQ")
_ARCH_RE = re.compile(r"^(?:sm_|compute_)?(\d{1,6})([a-z]?)$")


class ImageKind(enum.IntEnum):
  CUBIN = 1
  PTX = 2
  CUTE = 3  # a CuTe DSL object (`dump_to_object`), run through NVIDIA's CuTe DSL runtime library


# What a CuTe DSL object's host function takes after the stream, each as an 8-byte value.
HOST_ARG_POINTER = LIMITS["host_arg_pointer"]
HOST_ARG_INT64 = LIMITS["host_arg_int64"]


class ModuleFormatError(ValueError):
  pass


@dataclasses.dataclass(frozen=True)
class Arch:
  """A GPU architecture such as ``sm_90`` or ``sm_90a``."""

  number: int
  suffix: str = ""

  def __post_init__(self):
    if not LIMITS["min_arch"] <= self.number <= LIMITS["max_arch"] or self.suffix not in _SUFFIXES:
      raise ValueError(
          f"sm_{self.number}{self.suffix} is not a GPU architecture this runtime can load: archs are "
          f"sm_{LIMITS['min_arch']}..sm_{LIMITS['max_arch']}, with a suffix of "
          f"{' or '.join(repr(s) for s in _SUFFIXES if s)} or none")

  @classmethod
  def parse(cls, text: str | int) -> "Arch":
    match = _ARCH_RE.match(str(text).strip()) if isinstance(text, (str, int)) and not isinstance(text, bool) else None
    if not match:
      raise ValueError(f"cannot read {text!r} as a GPU architecture; write it like 'sm_90', 'sm_90a' or 90")
    return cls(int(match.group(1)), match.group(2))

  @property
  def sm(self) -> str:
    return f"sm_{self.number}{self.suffix}"

  def __str__(self) -> str:
    return self.sm


@dataclasses.dataclass(frozen=True)
class Image:
  """One compiled form of a kernel: a cubin for one arch, PTX, or a CuTe DSL object (with the DSL release
  that made it and the kinds of its host function's arguments)."""

  kind: ImageKind
  arch: Arch
  data: bytes
  dsl_version: str = ""
  host_arg_kinds: tuple[int, ...] = ()

  def payload(self) -> bytes:
    if self.kind != ImageKind.CUTE:
      return self.data
    version = self.dsl_version.encode("ascii")
    return b"".join([struct.pack("<I", len(version)), version, struct.pack("<I", len(self.host_arg_kinds)),
                     struct.pack(f"<{len(self.host_arg_kinds)}I", *self.host_arg_kinds), self.data])

  def __repr__(self) -> str:
    return f"Image({self.kind.name.lower()}, {self.arch}, {len(self.data)} bytes)"


@dataclasses.dataclass(frozen=True)
class ParsedModule:
  """A module's contents: the entry symbol, its images and the format's flags."""

  symbol: str
  images: tuple[Image, ...]
  flags: int = 0

  @property
  def pdl_wait(self) -> bool:
    """Every image's entry waits for the prerequisite grid: the kernel may launch with PDL."""
    return bool(self.flags & FLAG_PDL_WAIT)

  @property
  def host_code(self) -> bool:
    """Its images carry host code the runtime runs (CuTe DSL objects, launched by their own host function)."""
    return any(i.kind == ImageKind.CUTE for i in self.images)

  @property
  def nvshmem(self) -> bool:
    """The kernel calls NVSHMEM: launched only by NVSHMEM calls, after the runtime started NVSHMEM."""
    return bool(self.flags & FLAG_NVSHMEM)


def serialize(module: ParsedModule, compress: bool = True) -> bytes:
  """The module's bytes, checked by the runtime's own parser before they are returned.

  Each image is stored zlib-compressed where that makes it smaller (``compress=False``: never): the module
  travels in every lowered program, exported artifact and cache entry.
  """
  symbol = module.symbol.encode("utf-8")
  parts = [_HEADER.pack(MAGIC, FORMAT_VERSION, module.flags, len(module.images), len(symbol)), symbol]
  inflated = 0  # what the reader will inflate: bounded by the runtime, so past the bound images stay stored
  for image in module.images:
    payload, encoding = image.payload(), 0
    if compress and inflated + len(payload) <= MAX_INFLATED_BYTES:
      packed = struct.pack("<Q", len(payload)) + zlib.compress(payload, _ZLIB_LEVEL)
      if len(packed) < len(payload):
        inflated += len(payload)
        payload, encoding = packed, ENCODING_ZLIB
    parts.append(_IMAGE.pack(int(image.kind), image.arch.number, _SUFFIXES.index(image.arch.suffix), encoding,
                             len(payload)))
    parts.append(payload)
  data = b"".join(parts)
  parse(data)  # the runtime would refuse it later, on a GPU: refuse it now
  return data


def parse(data: bytes) -> ParsedModule:
  """Reads a module with the runtime's parser; raises ModuleFormatError."""
  try:
    symbol, images, flags = core.parse_module(bytes(data))
  except ValueError as e:
    raise ModuleFormatError(str(e)) from None
  return ParsedModule(symbol, tuple(_image(*image) for image in images), flags)


def _image(kind, arch, suffix, blob, version="", kinds=()) -> Image:
  return Image(ImageKind(kind), Arch(arch, _SUFFIXES[suffix]), blob, version, tuple(kinds))


def image_name(kind: ImageKind, arch: Arch) -> str:
  """An image as a pack's manifest names it: "cubin sm_100f", "ptx sm_90", "cute sm_100a"."""
  return f"{kind.name.lower()} {arch.sm}"


def parse_image_name(text: str) -> tuple[ImageKind, Arch]:
  """`image_name` read back; raises ValueError for text it does not write."""
  kind, _, arch = str(text).partition(" ")
  if kind.upper() not in ImageKind.__members__:
    raise ValueError(f"{text!r} does not name an image")
  return ImageKind[kind.upper()], Arch.parse(arch)


def served_image(images: list[tuple[ImageKind, Arch]], capability: int) -> int | None:
  """The index of the image a GPU of compute ``capability`` (103) loads from a module with ``images``, by the
  runtime's own rule (csrc/runtime: an exact cubin, else a family or generic one of its major version, else PTX
  it can JIT; for a CuTe DSL module, its own rule), or None: what a node would run, told without a GPU."""
  index = core.served_image([(int(kind), arch.number, _SUFFIXES.index(arch.suffix)) for kind, arch in images],
                            capability)
  return None if index < 0 else index


def kernel_hash(module_bytes: bytes) -> bytes:
  """The 32-byte key the runtime caches parsed kernels by."""
  return hashlib.sha256(module_bytes).digest()
