"""What a shared library asks of the system that loads it, read from its ELF file.

The libraries it links (DT_NEEDED) and the symbol versions it needs from each
(GLIBC_2.28, GLIBCXX_3.4.29...): what decides on which Linux a wheel runs. Read
with the standard library alone, so the wheel tests need neither binutils nor
pyelftools.
"""

import struct

SHT_DYNAMIC = 6
SHT_GNU_VERNEED = 0x6FFFFFFE
DT_NEEDED = 1


def _sections(data: bytes):
  assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, "a 64-bit little-endian ELF file"
  shoff, = struct.unpack_from("<Q", data, 0x28)
  shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
  for i in range(shnum):
    _, sh_type, _, _, offset, size, link, _, _, _ = struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
    yield i, sh_type, offset, size, link


def _string(data: bytes, table_offset: int, index: int) -> str:
  start = table_offset + index
  return data[start:data.index(b"\0", start)].decode()


def needs(data: bytes) -> tuple[list[str], dict[str, set[str]]]:
  """(the libraries it links, {library: the symbol versions it needs from it})."""
  sections = {i: (sh_type, offset, size, link) for i, sh_type, offset, size, link in _sections(data)}
  libraries, versions = [], {}
  for sh_type, offset, size, link in sections.values():
    strings = sections[link][1]
    if sh_type == SHT_DYNAMIC:
      for entry in range(offset, offset + size, 16):
        tag, value = struct.unpack_from("<qQ", data, entry)
        if tag == DT_NEEDED:
          libraries.append(_string(data, strings, value))
    elif sh_type == SHT_GNU_VERNEED:
      entry = offset
      while True:  # Elf64_Verneed records, each with its Elf64_Vernaux list
        _, count, file, aux, next_entry = struct.unpack_from("<HHIII", data, entry)
        names = versions.setdefault(_string(data, strings, file), set())
        item = entry + aux
        for _ in range(count):
          _, _, _, name, next_aux = struct.unpack_from("<IHHII", data, item)
          names.add(_string(data, strings, name))
          item += next_aux
        if not next_entry:
          break
        entry += next_entry
  return libraries, versions


def newest(versions: set[str], prefix: str) -> tuple[int, ...]:
  """The newest of versions named prefix_X.Y.Z, as a tuple; () when none is."""
  found = [tuple(map(int, v[len(prefix) + 1:].split("."))) for v in versions if v.startswith(prefix + "_")]
  return max(found, default=())
