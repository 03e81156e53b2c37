"""A recording folder read back for a pack's build: what ``JAX_MOSAIC_FFI_PACK_RECORD`` processes wrote there
(store/pack_record.py, the writing half, which every compile reaches), as one `Recording`.

`read` trusts the folder as a pack is trusted (the user's, writable by no one else) and bounds every value before
use.
"""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import struct

from jax_mosaic_ffi.base import owned_files
from jax_mosaic_ffi.base import pack_file
from jax_mosaic_ffi.base.errors import PackError
from jax_mosaic_ffi.store import pack_record


@dataclasses.dataclass
class Recorded:
  key: str
  kind: str
  payload: bytes
  about: dict


@dataclasses.dataclass
class Recording:
  """What one or more recording folders hold: entries by key (their about merged: every arch and call site they
  were recorded for), autotuning decisions and failures."""

  entries: dict[str, Recorded] = dataclasses.field(default_factory=dict)
  tuning: list[dict] = dataclasses.field(default_factory=list)
  failed: list[dict] = dataclasses.field(default_factory=list)


def read(folder: str, into: Recording | None = None) -> Recording:
  """The recording in ``folder`` (added to ``into``); raises PackError for a folder that is not the user's or is
  writable by others, or for a file in it that is not what we write."""
  found = into if into is not None else Recording()
  try:
    dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
  except OSError as e:
    raise PackError(f"recording {folder} cannot be opened ({e.strerror})") from None
  try:
    st = os.fstat(dir_fd)
    if owned_files.foreign(st) or owned_files.writable_by_others(st):
      raise PackError(f"recording {folder} is not a folder of yours that no one else can write (uid {st.st_uid}, "
                      f"mode {stat.S_IMODE(st.st_mode):o}): record into a folder of your own")
    for name in sorted(os.listdir(dir_fd)):
      entry_match, note_match = pack_record.ENTRY_NAME.fullmatch(name), pack_record.NOTE_NAME.fullmatch(name)
      if entry_match is None and note_match is None:
        continue
      data = _read_file(dir_fd, name, folder)
      try:
        if entry_match is not None:
          _add_entry(found, entry_match.group(1), data)
        else:
          document = json.loads(data)
          if not isinstance(document, dict):
            raise ValueError("not an object")
          if note_match.group(1) == "compiling":
            document = {k: v for k, v in document.items() if k not in ("pid", "token")} | {"error": pack_record.CRASHED}
          (found.tuning if note_match.group(1) == "tuning" else found.failed).append(document)
      except (ValueError, RecursionError, struct.error) as e:
        raise PackError(f"recording {folder}: {name} is not a recorded entry ({e}): record again") from None
  finally:
    os.close(dir_fd)
  return found


def _read_file(dir_fd: int, name: str, folder: str) -> bytes:
  try:
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
  except OSError as e:
    raise PackError(f"recording {folder}: {name} cannot be opened ({e.strerror})") from None
  try:
    st = os.fstat(fd)
    limit = pack_file.MAX_ENTRY_BYTES + pack_record.MAX_NOTE_BYTES
    if not stat.S_ISREG(st.st_mode) or st.st_size > limit or owned_files.foreign(st):
      raise PackError(f"recording {folder}: {name} is not a regular file of yours of at most {limit} bytes")
    return owned_files.read_at_most(fd, limit)
  finally:
    os.close(fd)


def _add_entry(found: Recording, key: str, data: bytes) -> None:
  magic, length = pack_record.HEADER.unpack_from(data)
  if magic != pack_record.MAGIC or length > min(len(data) - pack_record.HEADER.size, pack_record.MAX_NOTE_BYTES):
    raise ValueError("bad header")
  header = json.loads(data[pack_record.HEADER.size:pack_record.HEADER.size + length])
  payload = data[pack_record.HEADER.size + length:]
  if not isinstance(header, dict) or header.get("key") != key or header.get("kind") not in pack_file.KINDS:
    raise ValueError("bad header")
  about = pack_record.bounded(header.get("about") if isinstance(header.get("about"), dict) else {})
  known = found.entries.get(key)
  if known is None:
    found.entries[key] = Recorded(key, header["kind"], payload, about)
    return
  # The first payload is kept: two runs may compile one key into bytes that differ where a compiler is not
  # deterministic (both are the kernel of that key).
  for field in ("recorded_for", "call_sites"):
    merged = list(dict.fromkeys([*known.about.get(field, ()), *about.get(field, ())]))
    if merged:
      known.about[field] = merged[:pack_file.MAX_LIST]
