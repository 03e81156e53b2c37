"""The files a compile read from disk, and whether they are still as they were.

A kernel's binary depends on every header NVRTC read: those of ``-I``
folders, this package's ``include/``, the CUDA and CCCL headers. The cache
key cannot name them before the compile, so the cache entry lists them with
the sha256 of their contents (`snapshot`), and an entry is used only while
each one still hashes the same (`unchanged`): an edited header means a new
compile, in this process or the next. Paths are kept as the compiler named
them; a relative one is relative to the working directory, as it was for the
compiler.

Hashing is the truth; re-reading every header on each cache hit is what a
stat avoids: a file whose device, inode, size, mtime and ctime are those this
process last hashed is taken as unchanged, except within a few seconds of its
last change, when a same-size edit may share a coarse timestamp.
"""

from __future__ import annotations

import hashlib
import os
import stat
import time

Deps = tuple[tuple[str, str | None], ...]  # (path, sha256 hex, or None: it must stay absent)

MAX_FILES = 50000  # headers read plus the paths searched before them (include_search.py)
MAX_PATH_CHARS = 4096
# Larger files are not hashed: a compile that read one is not cached.
_MAX_FILE_BYTES = 64 << 20
_RECENT_NS = 3_000_000_000
# File timestamps come from a coarse clock, a few milliseconds behind time.time_ns().
_CLOCK_SLACK_NS = 20_000_000

_memo: dict[str, tuple[tuple[int, ...], str]] = {}


class Unreadable(OSError):
  """A file that is there but cannot be hashed."""


def digest(path: str) -> str | None:
  """The sha256 hex of the file at `path`, or None if there is none; raises Unreadable."""
  try:
    st = os.stat(path)
  except (FileNotFoundError, NotADirectoryError):
    return None
  except OSError as e:
    raise Unreadable(f"{path}: {e}") from None
  if not stat.S_ISREG(st.st_mode) or st.st_size > _MAX_FILE_BYTES:
    raise Unreadable(f"{path}: not a regular file of at most {_MAX_FILE_BYTES} bytes")
  identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
  where = os.path.abspath(path)
  known = _memo.get(where)
  if known is not None and known[0] == identity and time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) > _RECENT_NS:
    return known[1]
  try:
    with open(path, "rb") as f:
      data = f.read(_MAX_FILE_BYTES + 1)
  except OSError as e:
    raise Unreadable(f"{path}: {e}") from None
  value = hashlib.sha256(data).hexdigest()
  _memo[where] = (identity, value)
  return value


def snapshot(paths, since_ns: int) -> Deps | None:
  """`paths` with their hashes, or None where they cannot stand for what the compiler read:
  too many, unreadable, or changed since ``since_ns`` (time.time_ns() before the compile)."""
  if paths is None or len(paths) > MAX_FILES:
    return None
  deps = []
  for path in sorted(set(paths)):
    if not isinstance(path, str) or not path or len(path) > MAX_PATH_CHARS:
      return None
    try:
      st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
      deps.append((path, None))  # built into NVRTC: recorded as absent, to stay so
      continue
    except OSError:
      return None
    if max(st.st_mtime_ns, st.st_ctime_ns) >= since_ns - _CLOCK_SLACK_NS:
      return None  # edited while it compiled: the binary may hold either version
    try:
      deps.append((path, digest(path)))
    except OSError:
      return None
  return tuple(deps)


def settle(paths, since_ns: int) -> bool:
  """Where a compile that started at ``since_ns`` could not be snapshot only because a file it read changed too
  close to its start to tell before from after (a coarse clock's timestamps): waits until that change is safely
  in the past and returns True, so that a compile started now orders against it. False where the files change
  still (a writer at work) or cannot be read: then nothing is cached."""
  newest = 0
  for path in set(paths or ()):
    try:
      st = os.stat(path)
    except OSError:
      continue
    newest = max(newest, st.st_mtime_ns, st.st_ctime_ns)
  if newest < since_ns - _CLOCK_SLACK_NS or newest > time.time_ns():
    return False
  time.sleep(max(0, newest + 2 * _CLOCK_SLACK_NS - time.time_ns()) / 1e9)
  return True


def unchanged(deps: Deps) -> bool:
  """Whether every file of `deps` still hashes as recorded (and each absent one is still absent)."""
  try:
    return all(digest(path) == value for path, value in deps)
  except OSError:
    return False


def checked(value) -> Deps:
  """`value` read back from a cache entry, bounded; raises ValueError."""
  if not isinstance(value, list) or len(value) > MAX_FILES:
    raise ValueError("bad deps")
  deps = []
  for item in value:
    if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)
            and 0 < len(item[0]) <= MAX_PATH_CHARS and "\0" not in item[0]
            and (item[1] is None or (isinstance(item[1], str) and len(item[1]) == 64))):
      raise ValueError("bad deps")
    deps.append((item[0], item[1]))
  return tuple(deps)
