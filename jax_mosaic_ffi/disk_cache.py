"""An on-disk cache of NVRTC output, so a new process does not compile again.

Settings (read on every use, so tests and users can change them at run time):

* ``JAX_MOSAIC_FFI_CACHE_DIR``: where entries live (``~`` is expanded). Default
  ``$XDG_CACHE_HOME/jax_mosaic_ffi`` (``~/.cache/jax_mosaic_ffi``). Set it to
  ``off`` (or ``0``, or an empty string) to turn the cache off.
* ``JAX_MOSAIC_FFI_CACHE_MAX_BYTES``: the size bound, a whole number of bytes,
  1 GiB by default. The least recently used entries go first once a write
  crosses it. ``check_settings()`` reports a bad value before any compile.

The folder may hold other files, so the cache only ever reads, replaces or
deletes its own entries: ``<xx>/<key>.bin``, where ``<key>`` is 64 lowercase
hex digits, ``<xx>`` its first two and a real folder, and the entry a regular
file that starts with our magic. Nothing below the configured folder is
reached through a symlink: a linked ``<xx>`` folder or entry is a miss and is
never written through or deleted. The configured folder itself may be a
symlink; it is followed, being the user's own choice.

Each entry is written to a temporary file and renamed into place, so
concurrent writers never expose half an entry. An entry carries the sha256
of its payload; one of ours that is truncated or altered is deleted and
rebuilt.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pathlib
import re
import secrets
import stat
import struct
import time

_ENTRY_MAGIC = b"JMFFICE1"
_ENTRY_HEADER = struct.Struct("<8sQ32s")
_DEFAULT_MAX_BYTES = 1 << 30
# No read is larger, whatever the bound: a kernel's binaries are far smaller.
_MAX_ENTRY_BYTES = 256 << 20
# A temporary file this old belongs to a writer that died; younger ones may be
# another process's write in flight.
_STALE_TEMP_S = 24 * 3600
_OFF = {"", "0", "off", "false", "none"}
_MAX_BYTES_ENV = "JAX_MOSAIC_FFI_CACHE_MAX_BYTES"

_KEY = re.compile(r"[0-9a-f]{64}")
_FOLDER_NAME = re.compile(r"[0-9a-f]{2}")
_ENTRY_NAME = re.compile(r"[0-9a-f]{64}\.bin")
# Not *.bin, so that no version of the cache takes one for an entry.
_TEMP_NAME = re.compile(r"\.tmp-[0-9]+-[0-9a-f]{16}\.partial")

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_DIR_NOFOLLOW = _DIR | os.O_NOFOLLOW
# O_NONBLOCK: a FIFO planted at an entry's name must not wait for a writer.
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def cache_dir() -> pathlib.Path | None:
  configured = os.environ.get("JAX_MOSAIC_FFI_CACHE_DIR")
  if configured is not None:
    if configured.strip().lower() in _OFF:
      return None
    # os.path's expanduser, not pathlib's: "~nosuchuser" stays as written instead of raising.
    return pathlib.Path(os.path.expanduser(configured))
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return pathlib.Path(base) / "jax_mosaic_ffi"


def max_bytes() -> int:
  value = os.environ.get(_MAX_BYTES_ENV, "").strip()
  if not value:
    return _DEFAULT_MAX_BYTES
  try:
    bound = int(value)
  except ValueError:
    bound = -1
  if bound < 0:
    raise ValueError(
        f"{_MAX_BYTES_ENV}={value!r} is not a size: set it to a whole number of bytes, e.g. "
        f"{_MAX_BYTES_ENV}=1073741824 for 1 GiB (0 keeps nothing), or unset it for the default 1 GiB")
  return bound


def check_settings() -> None:
  """Raises ValueError for a setting the cache cannot use. Cheap: call it before compiling."""
  max_bytes()


def key(*parts: bytes | str) -> str:
  """A cache key from length-prefixed parts, so no two inputs can collide."""
  digest = hashlib.sha256()
  for part in parts:
    data = part.encode() if isinstance(part, str) else part
    digest.update(len(data).to_bytes(8, "little"))
    digest.update(data)
  return digest.hexdigest()


def load(entry_key: str) -> bytes | None:
  """The payload stored under `entry_key`, or None: a miss, damaged, or not ours."""
  directory = cache_dir()
  if directory is None:
    return None
  name = _entry_name(entry_key)
  limit = min(max_bytes(), _MAX_ENTRY_BYTES)
  try:
    with (_opened(directory, _DIR) as root, _opened(entry_key[:2], _DIR_NOFOLLOW, root) as folder,
          _opened(name, _READ, folder) as fd):
      st = os.fstat(fd)
      if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
        return None  # a device, FIFO or oversized file is not ours: leave it be
      data = _read(fd, st.st_size)
      payload = _unpack(data)
      if payload is not None:
        with contextlib.suppress(OSError):
          os.utime(fd)  # marks it recently used for eviction
        return payload
      if data.startswith(_ENTRY_MAGIC):  # ours but damaged: drop it so the next store rebuilds it
        _unlink_if_same(folder, name, st)
  except OSError:
    pass
  return None


def store(entry_key: str, payload: bytes) -> None:
  """Writes an entry; a cache that cannot be written is skipped, not fatal."""
  directory = cache_dir()
  if directory is None:
    return
  name = _entry_name(entry_key)
  budget = max_bytes()
  blob = _ENTRY_HEADER.pack(_ENTRY_MAGIC, len(payload), hashlib.sha256(payload).digest()) + payload
  if len(blob) <= min(budget, _MAX_ENTRY_BYTES):  # else load would never read it back
    try:
      _write(directory, entry_key[:2], name, blob)
    except OSError:
      return
  _evict(directory, budget)


def clear() -> None:
  """Deletes our entries and stale temporary files; nothing else in the folder."""
  directory = cache_dir()
  if directory is None:
    return
  try:
    with _opened(directory, _DIR) as root:
      for folder_name, name, st in _scan(root):
        _remove_if_ours(root, folder_name, name, st)
  except OSError:
    pass


def _entry_name(entry_key: str) -> str:
  if not _KEY.fullmatch(entry_key):
    raise ValueError(f"a disk cache key is 64 lowercase hex digits (see disk_cache.key), got {entry_key!r}")
  return f"{entry_key}.bin"


@contextlib.contextmanager
def _opened(path, flags: int, dir_fd: int | None = None, mode: int = 0o777):
  fd = os.open(path, flags, mode, dir_fd=dir_fd)
  try:
    yield fd
  finally:
    os.close(fd)


def _read(fd: int, size: int) -> bytes:
  chunks = []
  while size > 0:
    chunk = os.read(fd, size)
    if not chunk:
      break
    chunks.append(chunk)
    size -= len(chunk)
  return b"".join(chunks)


def _unpack(data: bytes) -> bytes | None:
  if len(data) < _ENTRY_HEADER.size:
    return None
  magic, size, digest = _ENTRY_HEADER.unpack_from(data)
  payload = data[_ENTRY_HEADER.size:]
  if magic == _ENTRY_MAGIC and size == len(payload) and hashlib.sha256(payload).digest() == digest:
    return payload
  return None


def _write(directory: pathlib.Path, folder_name: str, name: str, blob: bytes) -> None:
  directory.mkdir(parents=True, exist_ok=True)
  with _opened(directory, _DIR) as root:
    with contextlib.suppress(FileExistsError):
      os.mkdir(folder_name, dir_fd=root)
    # O_NOFOLLOW: a symlink in place of the folder fails here and the store is skipped.
    with _opened(folder_name, _DIR_NOFOLLOW, root) as folder:
      temp = f".tmp-{os.getpid()}-{secrets.token_hex(8)}.partial"
      fd = os.open(temp, _CREATE, 0o600, dir_fd=folder)
      try:
        with os.fdopen(fd, "wb") as f:
          f.write(blob)
        # Replaces whatever holds the name, a symlink or FIFO included, never writing through it.
        os.replace(temp, name, src_dir_fd=folder, dst_dir_fd=folder)
      except BaseException:
        with contextlib.suppress(OSError):
          os.unlink(temp, dir_fd=folder)
        raise


def _evict(directory: pathlib.Path, budget: int) -> None:
  try:
    with _opened(directory, _DIR) as root:
      entries = []
      for found in _scan(root):
        if _TEMP_NAME.fullmatch(found[1]):
          _remove_if_ours(root, *found)
        else:
          entries.append(found)
      total = sum(st.st_size for _, _, st in entries)
      for folder_name, name, st in sorted(entries, key=lambda e: e[2].st_mtime):
        if total <= budget:
          break
        _remove_if_ours(root, folder_name, name, st)
        # Counted off even when not deleted: a file that is not ours is not the
        # cache's size, and one we cannot delete must not make us delete all the rest.
        total -= st.st_size
  except OSError:
    pass


def _scan(root: int) -> list[tuple[str, str, os.stat_result]]:
  """Regular files named like our entries or temporary files, in real two-hex folders."""
  found = []
  with os.scandir(root) as listing:
    folders = [e.name for e in listing if _FOLDER_NAME.fullmatch(e.name) and e.is_dir(follow_symlinks=False)]
  for folder_name in folders:
    try:
      with _opened(folder_name, _DIR_NOFOLLOW, root) as folder, os.scandir(folder) as listing:
        for e in listing:
          if not ((_ENTRY_NAME.fullmatch(e.name) and e.name.startswith(folder_name))
                  or _TEMP_NAME.fullmatch(e.name)):
            continue
          try:
            st = e.stat(follow_symlinks=False)
          except OSError:
            continue
          if stat.S_ISREG(st.st_mode):
            found.append((folder_name, e.name, st))
    except OSError:
      continue
  return found


def _remove_if_ours(root: int, folder_name: str, name: str, st: os.stat_result) -> bool:
  """Deletes what `_scan` found once it is known to be ours: an entry with our magic, or a stale temp."""
  try:
    with _opened(folder_name, _DIR_NOFOLLOW, root) as folder:
      if _TEMP_NAME.fullmatch(name):
        if time.time() - st.st_mtime < _STALE_TEMP_S:
          return False  # another process may be writing it right now
      else:
        with _opened(name, _READ, folder) as fd:
          now = os.fstat(fd)
          if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino) or _read(fd, len(_ENTRY_MAGIC)) != _ENTRY_MAGIC:
            return False
      return _unlink_if_same(folder, name, st)
  except OSError:
    return False


def _unlink_if_same(folder: int, name: str, st: os.stat_result) -> bool:
  # A concurrent store may have just renamed a good entry over the one we checked.
  now = os.stat(name, dir_fd=folder, follow_symlinks=False)
  if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
    return False
  os.unlink(name, dir_fd=folder)
  return True
