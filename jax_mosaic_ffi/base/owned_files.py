"""Files and folders the user names (a tuning file, a kernel pack, a pack's recording): what makes them trusted,
said once, and how they are read, bounded. Each reader words its own refusal (what the file is, what to do).

Trusted: owned by the user or root, and writable by no one else (group or others), as ssh and pip trust their
files; anything else could hold another user's timings or code.
"""

from __future__ import annotations

import os
import stat


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
