"""An on-disk cache of NVRTC output, so a new process does not compile again.

Settings (read on every use, so tests and users can change them at run time):

* ``JAX_MOSAIC_FFI_CACHE_DIR``: where entries live. Default
  ``$XDG_CACHE_HOME/jax_mosaic_ffi`` (``~/.cache/jax_mosaic_ffi``). Set it to
  ``off`` (or ``0``, or an empty string) to turn the cache off.
* ``JAX_MOSAIC_FFI_CACHE_MAX_BYTES``: the size bound, 1 GiB by default. The
  least recently used entries go first once a write crosses it.

Each entry is written to a temporary file and renamed into place, so
concurrent writers never expose half an entry. An entry carries the sha256
of its payload; one that is truncated or altered is deleted and rebuilt.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import struct
import tempfile

_ENTRY_MAGIC = b"JMFFICE1"
_ENTRY_HEADER = struct.Struct("<8sQ32s")
_DEFAULT_MAX_BYTES = 1 << 30
_OFF = {"", "0", "off", "false", "none"}


def cache_dir() -> pathlib.Path | None:
  configured = os.environ.get("JAX_MOSAIC_FFI_CACHE_DIR")
  if configured is not None:
    return None if configured.strip().lower() in _OFF else pathlib.Path(configured)
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return pathlib.Path(base) / "jax_mosaic_ffi"


def max_bytes() -> int:
  value = os.environ.get("JAX_MOSAIC_FFI_CACHE_MAX_BYTES")
  if not value:
    return _DEFAULT_MAX_BYTES
  try:
    return max(0, int(value))
  except ValueError:
    raise ValueError(
        f"JAX_MOSAIC_FFI_CACHE_MAX_BYTES must be a number of bytes, got {value!r}") from None


def key(*parts: bytes | str) -> str:
  """A cache key from length-prefixed parts, so no two inputs can collide."""
  digest = hashlib.sha256()
  for part in parts:
    data = part.encode() if isinstance(part, str) else part
    digest.update(len(data).to_bytes(8, "little"))
    digest.update(data)
  return digest.hexdigest()


def _path(directory: pathlib.Path, entry_key: str) -> pathlib.Path:
  return directory / entry_key[:2] / f"{entry_key}.bin"


def load(entry_key: str) -> bytes | None:
  directory = cache_dir()
  if directory is None:
    return None
  path = _path(directory, entry_key)
  try:
    data = path.read_bytes()
  except OSError:
    return None
  if len(data) >= _ENTRY_HEADER.size:
    magic, size, digest = _ENTRY_HEADER.unpack_from(data)
    payload = data[_ENTRY_HEADER.size:]
    if magic == _ENTRY_MAGIC and size == len(payload) and hashlib.sha256(payload).digest() == digest:
      try:
        os.utime(path)  # marks it recently used for eviction
      except OSError:
        pass
      return payload
  try:  # corrupt: drop it so the next store rebuilds it
    path.unlink()
  except OSError:
    pass
  return None


def store(entry_key: str, payload: bytes) -> None:
  """Writes an entry; a cache that cannot be written is skipped, not fatal."""
  directory = cache_dir()
  if directory is None:
    return
  path = _path(directory, entry_key)
  blob = _ENTRY_HEADER.pack(_ENTRY_MAGIC, len(payload), hashlib.sha256(payload).digest()) + payload
  try:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".bin")
    try:
      with os.fdopen(fd, "wb") as f:
        f.write(blob)
      os.replace(tmp, path)
    except BaseException:
      try:
        os.unlink(tmp)
      except OSError:
        pass
      raise
  except OSError:
    return
  _evict(directory, max_bytes())


def _evict(directory: pathlib.Path, budget: int) -> None:
  entries = []
  total = 0
  for path in directory.glob("*/*.bin"):
    try:
      stat = path.stat()
    except OSError:
      continue
    entries.append((stat.st_mtime, stat.st_size, path))
    total += stat.st_size
  if total <= budget:
    return
  for _, size, path in sorted(entries):
    try:
      path.unlink()
    except OSError:
      continue
    total -= size
    if total <= budget:
      break


def clear() -> None:
  directory = cache_dir()
  if directory is None:
    return
  for path in directory.glob("*/*.bin"):
    try:
      path.unlink()
    except OSError:
      pass
