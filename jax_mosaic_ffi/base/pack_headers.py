"""The header table of a kernel pack (format version 3): each header an NVRTC compile read, stored once per pack.

An NVRTC compile's entry (toolchain/compiled.py's ``to_bytes``: a u32 length, a JSON header, the module) lists
every header it read, and every path its include search found empty, with the header's sha256
(base/file_deps.py); kernels of one program read the same CUDA headers, so in a pack of many of them four fifths
of the bytes were those lists again and again. A pack of version 3 keeps each (path, sha256) pair once, in the
manifest's ``headers`` table, and an entry's JSON header holds ``"deps": []`` where its list was, with the rows it
refers to (in order) in the manifest entry's ``headers``.

`joined` makes the entry's bytes again, and the pack's reader compares their sha256 with the one the manifest holds
for the entry, as it does for every entry: so every check the loader makes on the headers (each one's sha256, the
paths that must be empty: cuda/nvrtc/portable.py) sees exactly what was recorded, and a table altered after the
pack was made is refused as the entries it feeds do not match. An entry whose bytes are not of that shape, or that
would not come back byte for byte, is stored whole.

A row is held once but may be referred to by every entry, many times each: so an entry's size once joined is
computed from its rows' lengths before it is joined (`joined_size`), and bounded by its reader, never found out
by joining it (a 150 KiB pack once joined into 198 MiB).
"""

from __future__ import annotations

import json
import struct

from jax_mosaic_ffi.base import file_deps

_LENGTH = struct.Struct("<I")
_FIELD = b'"deps": '
_EMPTY = _FIELD + b"[]"
MAX_ROWS = 200_000  # distinct headers in one pack


class Table:
  """The header rows of a pack being written: each distinct (path, sha256 or None) once, by first use."""

  def __init__(self) -> None:
    self.rows: list[list] = []
    self._index: dict[tuple, int] = {}

  def factored(self, payload: bytes) -> tuple[bytes, list[int]] | None:
    """(``payload`` with its header list left out, the rows it refers to), or None where it is not an entry with a
    list to leave out (it is stored whole)."""
    parts = _split(payload)
    if parts is None:
      return None
    header, module = parts
    try:
      deps = json.loads(header).get("deps")
      file_deps.checked(deps)
    except (ValueError, AttributeError, RecursionError):
      return None
    listed = _FIELD + json.dumps(deps).encode()
    if not deps or header.count(listed) != 1 or header.count(_FIELD) != 1:
      return None
    stored = _framed(header.replace(listed, _EMPTY), module)
    if joined(stored, list(range(len(deps))), deps) != payload:
      return None  # it would not come back byte for byte: stored whole
    refs = [self._index.setdefault((path, value), len(self._index)) for path, value in deps]
    self.rows += [[path, value] for path, value in list(self._index)[len(self.rows):]]
    return stored, refs


class Rows:
  """A pack's header table as its reader uses it: each row's length in JSON computed once."""

  def __init__(self, rows: list[list]) -> None:
    self.rows = rows
    self._lengths: dict[int, int] = {}

  def joined_size(self, stored: bytes, refs: list[int]) -> int:
    """How many bytes `joined` would make of ``stored`` and ``refs`` (exactly, where it makes any), without
    making them."""
    lengths = self._lengths
    listed = 0
    for k in refs:
      found = lengths.get(k)
      if found is None:
        found = lengths[k] = len(json.dumps(self.rows[k]).encode())
      listed += found
    separators = 2 * max(len(refs) - 1, 0)  # json.dumps's ", " between rows
    return len(stored) - len(_EMPTY) + len(_FIELD) + 2 + listed + separators


def joined(stored: bytes, refs: list[int], rows: list[list]) -> bytes | None:
  """The entry's bytes: ``stored`` with the header rows ``refs`` put back in its list; None where ``stored`` has no
  empty list to put them in. Its size is `Rows.joined_size`'s: bound that first."""
  parts = _split(stored)
  if parts is None or parts[0].count(_EMPTY) != 1:
    return None
  header, module = parts
  return _framed(header.replace(_EMPTY, _FIELD + json.dumps([rows[k] for k in refs]).encode()), module)


def check_table(rows, entries: list) -> None:
  """Raises ValueError unless ``rows`` (the manifest's ``headers``) and each entry's ``headers`` (indices into it)
  are bounded as an entry's own list is (file_deps.checked)."""
  if not isinstance(rows, list) or len(rows) > MAX_ROWS:
    raise ValueError(f"headers is not a list of at most {MAX_ROWS}")
  for start in range(0, len(rows), file_deps.MAX_FILES):  # each row as an entry's own list bounds it
    file_deps.checked(rows[start:start + file_deps.MAX_FILES])
  for k, row in enumerate(entries):
    refs = row.get("headers", [])
    if not isinstance(refs, list) or len(refs) > file_deps.MAX_FILES or not all(
        type(i) is int and 0 <= i < len(rows) for i in refs):
      raise ValueError(f"entries[{k}].headers is not a list of rows of the headers table")


def _split(payload: bytes) -> tuple[bytes, bytes] | None:
  if len(payload) < _LENGTH.size:
    return None
  (length,) = _LENGTH.unpack_from(payload)
  if length > len(payload) - _LENGTH.size:
    return None
  return bytes(payload[_LENGTH.size:_LENGTH.size + length]), bytes(payload[_LENGTH.size + length:])


def _framed(header: bytes, module: bytes) -> bytes:
  return _LENGTH.pack(len(header)) + header + module
