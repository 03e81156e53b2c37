"""The serialized kernel module: the bytes that travel in the custom call.

The layout is part of the contract (docs/contract.md) and is parsed again,
with every length and offset checked, by ``csrc/module_format.cc``. All
integers are little-endian.

    header   magic "JMFFIMOD" | u32 format_version | u32 flags (0)
             | u32 num_images | u32 symbol_length | symbol (UTF-8, no NUL)
    image    u32 kind (1 cubin, 2 ptx) | u32 arch (e.g. 90)
             | u32 arch_suffix (0 none, 1 'a', 2 'f') | u32 reserved (0)
             | u64 size | size bytes

Readers refuse versions they do not know, so a change of layout is a new
``FORMAT_VERSION``; the runtime keeps reading every older version.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import re
import struct

MAGIC = b"JMFFIMOD"
FORMAT_VERSION = 1

_HEADER = struct.Struct("<8sIIII")
_IMAGE = struct.Struct("<IIIIQ")

# Bounds shared with the C++ parser (csrc/module_format.h).
MAX_SYMBOL_LENGTH = 4096
MAX_IMAGES = 64


class ImageKind(enum.IntEnum):
  CUBIN = 1
  PTX = 2


_SUFFIXES = {"": 0, "a": 1, "f": 2}
_SUFFIX_NAMES = {v: k for k, v in _SUFFIXES.items()}
_ARCH_RE = re.compile(r"^(?:sm_|compute_)?(\d+)([af]?)$")


@dataclasses.dataclass(frozen=True)
class Arch:
  """A GPU architecture such as ``sm_90`` or ``sm_90a``."""

  number: int
  suffix: str = ""

  @classmethod
  def parse(cls, text: str | int) -> "Arch":
    match = _ARCH_RE.match(str(text).strip())
    if not match:
      raise ValueError(
          f"cannot read {text!r} as a GPU architecture; write it like 'sm_90', "
          "'sm_90a' or 90")
    return cls(int(match.group(1)), match.group(2))

  @property
  def sm(self) -> str:
    return f"sm_{self.number}{self.suffix}"

  def __str__(self) -> str:
    return self.sm


@dataclasses.dataclass(frozen=True)
class Image:
  """One compiled form of a kernel: a cubin for one arch, or PTX."""

  kind: ImageKind
  arch: Arch
  data: bytes

  def __repr__(self) -> str:
    return f"Image({self.kind.name.lower()}, {self.arch}, {len(self.data)} bytes)"


@dataclasses.dataclass(frozen=True)
class Module:
  symbol: str
  images: tuple[Image, ...]


class ModuleFormatError(ValueError):
  pass


def serialize(module: Module) -> bytes:
  symbol = module.symbol.encode("utf-8")
  if not symbol or len(symbol) > MAX_SYMBOL_LENGTH:
    raise ModuleFormatError(
        f"kernel symbol must have 1 to {MAX_SYMBOL_LENGTH} bytes, got {len(symbol)}")
  if not module.images or len(module.images) > MAX_IMAGES:
    raise ModuleFormatError(
        f"a module holds 1 to {MAX_IMAGES} images, got {len(module.images)}")
  parts = [_HEADER.pack(MAGIC, FORMAT_VERSION, 0, len(module.images), len(symbol)),
           symbol]
  for image in module.images:
    parts.append(_IMAGE.pack(int(image.kind), image.arch.number,
                             _SUFFIXES[image.arch.suffix], 0, len(image.data)))
    parts.append(image.data)
  return b"".join(parts)


def parse(data: bytes) -> Module:
  """Reads a module back; the inverse of :func:`serialize`."""
  view = memoryview(data)
  if len(view) < _HEADER.size:
    raise ModuleFormatError(f"module is {len(view)} bytes, shorter than its header")
  magic, version, flags, num_images, symbol_length = _HEADER.unpack_from(view, 0)
  if magic != MAGIC:
    raise ModuleFormatError("not a jax_mosaic_ffi module (bad magic)")
  if version != FORMAT_VERSION:
    raise ModuleFormatError(f"module format version {version} is not supported")
  if flags != 0:
    raise ModuleFormatError(f"unknown module flags {flags:#x}")
  if not 0 < num_images <= MAX_IMAGES:
    raise ModuleFormatError(f"module declares {num_images} images")
  if not 0 < symbol_length <= MAX_SYMBOL_LENGTH:
    raise ModuleFormatError(f"module declares a symbol of {symbol_length} bytes")
  offset = _HEADER.size
  if offset + symbol_length > len(view):
    raise ModuleFormatError("module is truncated inside the kernel symbol")
  symbol = bytes(view[offset:offset + symbol_length]).decode("utf-8")
  offset += symbol_length
  images = []
  for index in range(num_images):
    if offset + _IMAGE.size > len(view):
      raise ModuleFormatError(f"module is truncated in the header of image {index}")
    kind, arch, suffix, reserved, size = _IMAGE.unpack_from(view, offset)
    offset += _IMAGE.size
    if kind not in (ImageKind.CUBIN, ImageKind.PTX) or suffix not in _SUFFIX_NAMES:
      raise ModuleFormatError(f"image {index} has unknown kind {kind} or arch suffix {suffix}")
    if size > len(view) - offset:
      raise ModuleFormatError(f"image {index} declares {size} bytes past the end")
    images.append(Image(ImageKind(kind), Arch(arch, _SUFFIX_NAMES[suffix]),
                        bytes(view[offset:offset + size])))
    offset += size
  if offset != len(view):
    raise ModuleFormatError(f"{len(view) - offset} trailing bytes after the last image")
  return Module(symbol, tuple(images))


def kernel_hash(module_bytes: bytes) -> bytes:
  """The 32-byte key the runtime caches compiled kernels by."""
  return hashlib.sha256(module_bytes).digest()
