"""Files and folders the user names (a tuning file, a kernel pack, a pack's recording): what makes them trusted,
said once, and how they are read, bounded. Each reader words its own refusal (what the file is, what to do).

Trusted: owned by the user or root, and writable by no one else (group or others), as ssh and pip trust their
files; anything else could hold another user's timings or code.
"""

from __future__ import annotations

import os
import stat

from jax_mosaic_ffi.base.errors import PackError


def foreign(st: os.stat_result) -> bool:
  """Whether a file or folder belongs to someone other than this user or root."""
  return st.st_uid not in (os.geteuid(), 0)


def writable_by_others(st: os.stat_result) -> bool:
  """Whether group or others may write it."""
  return bool(st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def read_at_most(fd: int, limit: int) -> bytes:
  """What an open file holds, up to ``limit + 1`` bytes (one more than allowed, so that the caller sees a file that
  grew past its bound); raises OSError."""
  chunks, left = [], limit + 1
  while left > 0:
    chunk = os.read(fd, min(left, 1 << 24))
    if not chunk:
      break
    chunks.append(chunk)
    left -= len(chunk)
  return b"".join(chunks)


def own_folder(path: str, setting: str) -> None:
  """Makes the folder ``path`` the user named in ``setting`` (mode 0700) where it is missing, and refuses
  (`PackError`) one that is not the user's alone: another user's, or writable by group or others, who could put
  files there that are then taken for this process's own (a recording a pack is built from)."""
  os.makedirs(path, mode=0o700, exist_ok=True)
  st = os.stat(path)  # the user's choice of folder: a symlink to it is followed, and what it leads to judged
  if foreign(st) or writable_by_others(st) or not stat.S_ISDIR(st.st_mode):
    raise PackError(f"{setting}={path} is not a folder of yours that no one else can write (uid {st.st_uid}, "
                    f"mode {stat.S_IMODE(st.st_mode):o}; you are uid {os.geteuid()}): others could put files there "
                    "that would be taken for this program's own. Name a folder of your own (chmod go-w, or a new "
                    "folder)")
