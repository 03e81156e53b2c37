"""An on-disk cache of NVRTC output, so a new process does not compile again.

Settings (read on every use, so tests and users can change them at run time):

* ``JAX_MOSAIC_FFI_CACHE_DIR``: where entries live (``~`` is expanded). Default
  ``$XDG_CACHE_HOME/jax_mosaic_ffi`` (``~/.cache/jax_mosaic_ffi``). Set it to
  ``off`` (or ``0``, or an empty string) to turn the cache off.
* ``JAX_MOSAIC_FFI_CACHE_MAX_BYTES``: the size bound, a whole number of bytes,
  1 GiB by default. The least recently used entries go first once a write
  crosses it. ``check_settings()`` reports a bad value before any compile.

The cache trusts only folders of the current user that no one else can write
(as ssh and pip do): a configured folder or ``<xx>`` folder owned by another
user, or writable by group or others, is refused with one warning per process
naming it, and kernels are compiled without the cache (slower, never wrong).
Folders the cache creates are mode 0700.

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
rebuilt, and so is one that its reader cannot decode (`load_decoded`).
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
import threading
import time
import warnings
from typing import Callable, TypeVar

_ENTRY_MAGIC = b"JMFFICE1"
_ENTRY_HEADER = struct.Struct("<8sQ32s")
_DEFAULT_MAX_BYTES = 1 << 30
# No read is larger, whatever the bound: a kernel's binaries are far smaller.
_MAX_ENTRY_BYTES = 256 << 20
# A temporary file this old belongs to a writer that died; younger ones may be
# another process's write in flight.
_STALE_TEMP_S = 24 * 3600
_OFF = {"", "0", "off", "false", "none"}
DIR_ENV = "JAX_MOSAIC_FFI_CACHE_DIR"
MAX_BYTES_ENV = "JAX_MOSAIC_FFI_CACHE_MAX_BYTES"
# The package's folder (base/paths.py has it too; this module imports nothing of the package, as a test
# loads it alone from its file): warnings skip its frames to name the user's line.
_PACKAGE_DIR = os.path.dirname(os.path.dirname(__file__))

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


_T = TypeVar("_T")


class CacheFolderRefused(UserWarning):
  """A cache folder another user could write to: the cache is not used."""


_refused: set[str] = set()
_refused_lock = threading.Lock()


def cache_dir() -> pathlib.Path | None:
  configured = os.environ.get(DIR_ENV)
  if configured is not None:
    if configured.strip().lower() in _OFF:
      return None
    # os.path's expanduser, not pathlib's: "~nosuchuser" stays as written instead of raising.
    return pathlib.Path(os.path.expanduser(configured))
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return pathlib.Path(base) / "jax_mosaic_ffi"


def max_bytes() -> int:
  value = os.environ.get(MAX_BYTES_ENV, "").strip()
  if not value:
    return _DEFAULT_MAX_BYTES
  try:
    bound = int(value)
  except ValueError:
    bound = -1
  if bound < 0:
    raise ValueError(
        f"{MAX_BYTES_ENV}={value!r} is not a size: set it to a whole number of bytes, e.g. "
        f"{MAX_BYTES_ENV}=1073741824 for 1 GiB (0 keeps nothing), or unset it for the default 1 GiB")
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
    with (_opened(directory, _DIR) as root, _opened(entry_key[:2], _DIR_NOFOLLOW, root) as folder):
      if not (_trusted(root, directory) and _trusted(folder, directory / entry_key[:2], directory)):
        return None
      with _opened(name, _READ, folder) as fd:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit or st.st_uid != os.geteuid():
          return None  # a device, FIFO, oversized or foreign file is not ours: leave it be
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


def load_decoded(entry_key: str, decode: Callable[[bytes], _T | None]) -> _T | None:
  """``decode(load(entry_key))``, or None. An entry of ours that ``decode``
  raises on, whatever the error (a RecursionError from deeply nested JSON
  included), is a bad entry: it is deleted, so that the caller rebuilds it
  instead of every later process failing on it. ``decode`` returns None for
  an entry that reads back but does not apply; that one is kept."""
  payload = load(entry_key)
  if payload is None:
    return None
  try:
    return decode(payload)
  except Exception:
    discard(entry_key)
    return None


def discard(entry_key: str) -> None:
  """Deletes the entry stored under `entry_key`, if there is one of ours."""
  directory = cache_dir()
  if directory is None:
    return
  name = _entry_name(entry_key)
  try:
    with _opened(directory, _DIR) as root:
      if _trusted(root, directory):
        st = os.stat(os.path.join(entry_key[:2], name), dir_fd=root, follow_symlinks=False)
        _remove_if_ours(root, entry_key[:2], name, st, directory)
  except OSError:
    pass


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
      if not _write(directory, entry_key[:2], name, blob):
        return
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
      if not _trusted(root, directory):
        return
      for folder_name, name, st in _scan(root, directory):
        _remove_if_ours(root, folder_name, name, st, directory)
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


def _write(directory: pathlib.Path, folder_name: str, name: str, blob: bytes) -> bool:
  """Writes one entry; False where a folder is refused (`_trusted`)."""
  directory.mkdir(parents=True, exist_ok=True, mode=0o700)
  with _opened(directory, _DIR) as root:
    if not _trusted(root, directory):
      return False
    with contextlib.suppress(FileExistsError):
      os.mkdir(folder_name, 0o700, dir_fd=root)
    # O_NOFOLLOW: a symlink in place of the folder fails here and the store is skipped.
    with _opened(folder_name, _DIR_NOFOLLOW, root) as folder:
      if not _trusted(folder, directory / folder_name, directory):
        return False
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
  return True


def _evict(directory: pathlib.Path, budget: int) -> None:
  try:
    with _opened(directory, _DIR) as root:
      if not _trusted(root, directory):
        return
      entries = []
      for found in _scan(root, directory):
        if _TEMP_NAME.fullmatch(found[1]):
          _remove_if_ours(root, *found, directory)
        elif _is_ours(root, *found):
          # Only our entries are the cache's size: a foreign file named like one,
          # however large, must not make every store empty the cache.
          entries.append(found)
      total = sum(st.st_size for _, _, st in entries)
      for folder_name, name, st in sorted(entries, key=lambda e: e[2].st_mtime):
        if total <= budget:
          break
        _remove_if_ours(root, folder_name, name, st, directory)
        # Counted off even when not deleted: one we cannot delete must not make us delete all the rest.
        total -= st.st_size
  except OSError:
    pass


def _scan(root: int, directory: pathlib.Path) -> list[tuple[str, str, os.stat_result]]:
  """Regular files named like our entries or temporary files, in real two-hex folders we trust."""
  found = []
  with os.scandir(root) as listing:
    folders = [e.name for e in listing if _FOLDER_NAME.fullmatch(e.name) and e.is_dir(follow_symlinks=False)]
  for folder_name in folders:
    try:
      with _opened(folder_name, _DIR_NOFOLLOW, root) as folder:
        if not _trusted(folder, directory / folder_name, directory):
          continue
        with os.scandir(folder) as listing:
          entries = list(listing)
        for e in entries:
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


def _is_ours(root: int, folder_name: str, name: str, st: os.stat_result) -> bool:
  """Whether the entry `_scan` found (still) starts with our magic."""
  try:
    with _opened(folder_name, _DIR_NOFOLLOW, root) as folder, _opened(name, _READ, folder) as fd:
      now = os.fstat(fd)
      return (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino) and _read(fd, len(_ENTRY_MAGIC)) == _ENTRY_MAGIC
  except OSError:
    return False


def _remove_if_ours(root: int, folder_name: str, name: str, st: os.stat_result, directory: pathlib.Path) -> bool:
  """Deletes what `_scan` found once it is known to be ours: an entry with our magic, or a stale temp."""
  try:
    with _opened(folder_name, _DIR_NOFOLLOW, root) as folder:
      if not _trusted(folder, directory / folder_name, directory):
        return False
      if _TEMP_NAME.fullmatch(name):
        if time.time() - st.st_mtime < _STALE_TEMP_S:
          return False  # another process may be writing it right now
      elif not _is_ours(root, folder_name, name, st):
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


def _trusted(fd: int, path: pathlib.Path, root: pathlib.Path | None = None) -> bool:
  """Whether the open folder `fd` is the current user's and writable by no one else.

  Otherwise another local user could plant an entry (a kernel that would run
  in this process): refused, with one warning per process and cache folder.
  """
  st = os.fstat(fd)
  owner_ok = st.st_uid == os.geteuid()
  if owner_ok and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
    return True
  root = root or path
  with _refused_lock:
    if str(root) in _refused:
      return False
    _refused.add(str(root))
  if not owner_ok:
    why = f"owned by uid {st.st_uid}, not by you (uid {os.geteuid()})"
  else:
    writers = " and ".join(w for w, bit in (("group", stat.S_IWGRP), ("others", stat.S_IWOTH)) if st.st_mode & bit)
    why = f"writable by {writers} (mode {stat.S_IMODE(st.st_mode):04o})"
  warnings.warn(
      f"jax_mosaic_ffi does not use its kernel cache in {root}: {path} is {why}, so another user could put a "
      f"kernel there that this process would run. Kernels are compiled without the cache meanwhile. Make the "
      f"folder yours and private (chown -R $(id -u) {root}; chmod -R go-w {root}; chmod 700 {root}), or set "
      "JAX_MOSAIC_FFI_CACHE_DIR to a folder of your own (or to off).", CacheFolderRefused,
      skip_file_prefixes=(_PACKAGE_DIR,))
  return False
