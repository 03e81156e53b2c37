"""What a tile kernel's cubin says about its launch, read from its ELF file with the standard library alone.

tileiras writes a tile kernel: its entry declares the threads it runs per block (``.reqntid``: the ``.nv.info``
attribute REQNTID) and the static shared memory it uses (the size of its ``.nv.shared.<entry>`` section), and the
cubin carries the tile launch's metadata (``___NV_TILE_LAUNCH_META_DATA___``), from which the driver runs each
tile block with those threads and that memory. A tile kernel is launched with a block of one (the tile compiler,
not the caller, decides its threads: CUDA's programming guide, "Writing Tile Kernels") and no dynamic shared
memory, as cuTile's own launchers do; these values are what the launch then uses, for messages and the guide.
"""

from __future__ import annotations

import dataclasses
import struct

_NV_INFO = 0x70000000  # SHT_CUDA_INFO
_EIATTR_REQNTID = 0x10
_EIFMT_SVAL = 4
_TILE_METADATA = b"___NV_TILE_LAUNCH_META_DATA___"
_MAX_SECTIONS = 1 << 16


@dataclasses.dataclass(frozen=True)
class LaunchInfo:
  """A tile kernel's resources per block: ``threads`` (REQNTID), ``static_smem`` bytes, and whether the cubin
  carries the tile launch's metadata (``tile``)."""

  threads: tuple[int, int, int]
  static_smem: int
  tile: bool


def _sections(data: bytes):
  if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
    raise ValueError("not a 64-bit little-endian ELF file")
  shoff, = struct.unpack_from("<Q", data, 0x28)
  shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
  if shentsize < 64 or shnum > _MAX_SECTIONS or shoff + shnum * shentsize > len(data) or shstrndx >= shnum:
    raise ValueError("bad section table")
  headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
  names_at = headers[shstrndx][4]
  for name, sh_type, _, _, offset, size, _, _, _, _ in headers:
    if offset + size > len(data) and sh_type != 8:  # SHT_NOBITS (.nv.shared) occupies no bytes of the file
      raise ValueError("a section runs past the file")
    end = data.index(b"\0", names_at + name)
    yield data[names_at + name:end].decode(errors="replace"), sh_type, offset, size


def _reqntid(data: bytes, offset: int, size: int) -> tuple[int, int, int] | None:
  p, end = offset, offset + size
  while p + 4 <= end:
    fmt, attr = data[p], data[p + 1]
    if fmt != _EIFMT_SVAL:
      p += 4
      continue
    length, = struct.unpack_from("<H", data, p + 2)
    if attr == _EIATTR_REQNTID and length == 12 and p + 16 <= end:
      return struct.unpack_from("<III", data, p + 4)
    p += 4 + length
  return None


def launch_info(cubin: bytes, symbol: str) -> LaunchInfo:
  """The entry ``symbol``'s launch, as its cubin declares it; ValueError for bytes that are not a cubin."""
  threads, smem = None, 0
  for name, sh_type, offset, size in _sections(cubin):
    if name == f".nv.info.{symbol}" and sh_type == _NV_INFO:
      threads = _reqntid(cubin, offset, size)
    elif name == f".nv.shared.{symbol}":
      smem = size
  return LaunchInfo(threads or (0, 0, 0), smem, _TILE_METADATA in cubin)


def sm_number(cubin: bytes) -> int:
  """The SM a cubin is for, from its ELF header's flags (bits 8-15 in the CUDA ELF ABI 8 that tileiras writes)."""
  flags, = struct.unpack_from("<I", cubin, 0x30)
  return (flags >> 8) & 0xFF
