"""Autotuning timings, one per config: kept in memory and on disk, and carried between machines in a file.

A timing belongs to one config of one call, on one kind of machine. Its key
(`TimingKey`) is the call's name, the config, the config's own kernels and
launch (module hashes, grid, block, scalars...: what `autotune` reads off the
config's jaxpr) and the call signature (shapes and dtypes, or the user's
``key``); its `Environment` is the device name and compute capability, the
CUDA driver, jax_mosaic_ffi and the front ends' toolchains (their releases, as
each front end names them: call/front_end.py's ``toolchains``). Adding a config to a list therefore
times that config alone, and an edited kernel only re-times the configs
that use it: the winner is picked among the stored timings of the current
list (`autotune.py`).

`save_tuning(path)` writes this process's timings for its device to a JSON
file; `load_tuning(path)` reads one into memory, so that a cluster tunes on
one machine and ships the file. A file is ignored, with one
`TuningFileIgnored` warning saying why, when it is not ours (a file that is
not regular, too large, owned by another user or writable by others, as the
disk cache's trust rules say: docs/threat_model.md), malformed (every value
is type-checked and bounded before use), of another format version, or
tuned on another device, compute capability, driver, jax_mosaic_ffi or
toolchain release. Nothing in a file can add code: a timing only ranks configs the
program itself lists, and a config is only chosen once it builds here.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import math
import os
import secrets
import stat
import threading
import warnings
from typing import Any

import jax

from jax_mosaic_ffi.base import disk_cache
from jax_mosaic_ffi.base import gpu_info
from jax_mosaic_ffi.base import module_format
from jax_mosaic_ffi.base import value_key
from jax_mosaic_ffi.base.errors import ValueKeyError
from jax_mosaic_ffi.base.paths import PACKAGE_DIR
from jax_mosaic_ffi.call import front_end
from jax_mosaic_ffi.toolchain import packs

FILE_FORMAT = "jax_mosaic_ffi tuning"
# 2: the environment's "toolchains" (every front end's) took the place of "triton"; a version 1 file is refused.
FILE_VERSION = 2
_RECORD_FORMAT = "tuning-record-1"
_PACK_FORMAT = "pack-tuning-1"
# Bounds on everything read (a file, a disk entry) before it is used.
MAX_FILE_BYTES = 16 << 20
MAX_RECORDS = 100_000        # in a file, and in memory (oldest dropped first)
MAX_TEXT = 4096              # a name, config, signature or error
MAX_KERNELS = 64             # launches in one config
MAX_US = 1e9                 # a timing of over 1000 s per call is not one
_ENV_FIELDS = (("device", "device"), ("compute_capability", "compute capability"),
               ("driver", "CUDA driver"), ("jax_mosaic_ffi", "jax_mosaic_ffi"),
               ("toolchains", "toolchains"))


class TuningFileIgnored(UserWarning):
  """A tuning file was not loaded: not ours, malformed, or from another machine or version.

  `load_tuning` warns with it, saying why (e.g. ``it was tuned with device 'NVIDIA H100 80GB HBM3', and
  this process has 'NVIDIA H200'``), and loads nothing: autotuning then times the configs itself. To make
  it an error: ``warnings.simplefilter("error", jmf.TuningFileIgnored)``.
  """


@dataclasses.dataclass(frozen=True)
class Environment:
  """What a timing is valid for besides its call and config."""

  device: str
  compute_capability: str
  driver: str
  jax_mosaic_ffi: str
  toolchains: str             # "nvidia-cutlass-dsl 4.2.1, triton 3.6.0": each front end's, sorted


@dataclasses.dataclass(frozen=True)
class TimingKey:
  """One config of one call, for one call signature."""

  name: str
  config: str                 # canonical JSON of the config
  launches: tuple[str, ...]   # the config's kernels and their launch values, one string per launch
  signature: str              # shapes and dtypes, or the user's key


@dataclasses.dataclass(frozen=True)
class Timing:
  us: float | None            # median microseconds per call; None when it failed to run
  error: str | None


@dataclasses.dataclass(frozen=True)
class _Stored:
  environment: Environment
  key: TimingKey
  timing: Timing
  source: str                 # "timed", "disk" or "file"


_lock = threading.Lock()
_memory: dict[str, _Stored] = {}


def _package_version() -> str:
  try:
    return importlib.metadata.version("jax_mosaic_ffi")
  except importlib.metadata.PackageNotFoundError:
    return "unknown"


def _toolchains() -> str:
  """The installed front ends' toolchains and their releases, as one text (each front end reads its own once)."""
  releases = {name: release for end in front_end.installed() for name, release in end.toolchains().items()}
  return ", ".join(f"{name} {releases[name]}" for name in sorted(releases))


def environment(device) -> Environment:
  """The environment of a jax device: a GPU's name and compute capability, or the CPU's kind."""
  capability = "none"
  if device.platform in ("gpu", "cuda"):
    ordinal = getattr(device, "local_hardware_id", None)
    ordinal = device.id if ordinal is None else ordinal
    for gpu in gpu_info.visible_gpus():
      if gpu.ordinal == ordinal:
        capability = f"{gpu.arch // 10}.{gpu.arch % 10}"
  return Environment(device=str(getattr(device, "device_kind", device.platform)), compute_capability=capability,
                     driver=gpu_info.driver_version(), jax_mosaic_ffi=_package_version(),
                     toolchains=_toolchains())


def bounded_text(text: str) -> str:
  """`text`, or its hash where it is too long to store (a user key's repr may be anything)."""
  return text if len(text) <= MAX_TEXT else "sha256:" + disk_cache.key(text)


def exact_text(value) -> str:
  """A call's signature (its shapes and dtypes, or what the user's ``key=`` returned) in a timing's key: its text,
  then, where it can be keyed exactly, its content's key (`value_key`): text alone is lossy (numpy prints a long
  array with "..."). One that cannot be keyed exactly (an object of the user's) keeps its text alone: the timing
  is still of the same kernels and launch values (keyed too), only perhaps on inputs the user tells apart."""
  text = repr(value)
  try:
    return f"{text} {value_key.value_key(value).hex()[:32]}"
  except ValueKeyError:
    return text


def _record_id(env: Environment, key: TimingKey) -> str:
  return disk_cache.key(_RECORD_FORMAT, f"format{module_format.FORMAT_VERSION}",
                        *(getattr(env, field) for field, _ in _ENV_FIELDS),
                        key.name, key.config, str(len(key.launches)), *key.launches, key.signature)


def pack_key(device: str, compute_capability: str, key: TimingKey) -> str:
  """A timing's key in a kernel pack: its call and config on a GPU model (name and compute capability). The driver
  and the releases are left out: the config's kernels are in the key (their hashes), and a pack serves its winners
  on whatever driver the machine that loads it has."""
  return disk_cache.key(_PACK_FORMAT, f"format{module_format.FORMAT_VERSION}", device, compute_capability,
                        key.name, key.config, str(len(key.launches)), *key.launches, key.signature)


def pack_payload(timing: Timing) -> bytes:
  return json.dumps({"format": _PACK_FORMAT, "us": timing.us, "error": timing.error}).encode()


def lookup(env: Environment, key: TimingKey) -> tuple[Timing, str] | None:
  """The stored timing of this config, and where it came from ("timed", "pack", "disk", "file"); None if none."""
  record_id = _record_id(env, key)
  with _lock:
    stored = _memory.get(record_id)
  if stored is not None:
    return stored.timing, stored.source
  entry = packs.lookup(pack_key(env.device, env.compute_capability, key), "tuning")
  if entry is not None:
    timing, source = _decode_pack_entry(entry.payload), "pack"
  else:
    timing, source = disk_cache.load_decoded(record_id, _decode_entry), "disk"
  if timing is None:
    return None
  _remember(record_id, _Stored(env, key, timing, source))
  return timing, source


def store(env: Environment, key: TimingKey, timing: Timing) -> None:
  """Keeps a timing this process measured, in memory and in the disk cache."""
  record_id = _record_id(env, key)
  _remember(record_id, _Stored(env, key, timing, "timed"))
  disk_cache.store(record_id, json.dumps({"format": _RECORD_FORMAT, "us": timing.us,
                                          "error": timing.error}).encode())


def clear_memory() -> None:
  with _lock:
    _memory.clear()


def _remember(record_id: str, stored: _Stored) -> None:
  with _lock:
    _memory.pop(record_id, None)
    _memory[record_id] = stored
    while len(_memory) > MAX_RECORDS:
      del _memory[next(iter(_memory))]


class _Malformed(ValueError):
  """A value read from a file or an entry that is not what we write."""


def _text(value, what: str) -> str:
  if not isinstance(value, str):
    raise _Malformed(f"{what} is not a string")
  if len(value) > MAX_TEXT:
    raise _Malformed(f"{what} is longer than {MAX_TEXT} characters")
  return value


def _timing(us, error, where: str) -> Timing:
  if us is not None:
    if isinstance(us, bool) or not isinstance(us, (int, float)) or not (math.isfinite(us) and 0 < us <= MAX_US):
      raise _Malformed(f"{where}.us is not null or a number of microseconds in (0, {MAX_US:g}]")
    us = float(us)
  if error is not None:
    error = _text(error, f"{where}.error")
  if (us is None) == (error is None):
    raise _Malformed(f"{where} needs exactly one of us and error")
  return Timing(us, error)


def _decode_entry(data: bytes, format: str = _RECORD_FORMAT) -> Timing | None:
  """A disk entry of ours; raises on one that is damaged (disk_cache then deletes it)."""
  if len(data) > MAX_TEXT * 2:
    raise _Malformed("entry too large")
  entry = json.loads(data)
  if not isinstance(entry, dict) or entry.get("format") != format:
    raise _Malformed("not a timing entry")
  return _timing(entry.get("us"), entry.get("error"), "entry")


def _decode_pack_entry(data: bytes) -> Timing | None:
  """A pack's timing (verified with its pack), or None for one that does not read as one (never used)."""
  try:
    return _decode_entry(data, _PACK_FORMAT)
  except (ValueError, RecursionError):
    return None


# ------------------------------------------------------------------------------------------- the file


def save_tuning(path: str | os.PathLike, device=None) -> int:
  """Writes this process's autotuning timings for ``device`` (jax's first device by default) to
  ``path``, replacing it atomically; returns how many. `load_tuning` reads the file on another
  machine of the same GPU, driver, jax_mosaic_ffi and toolchains (Triton, CuTe DSL): a cluster tunes
  once and ships the file::

    jmf.save_tuning("tuning.json")   # after tuning: the timings this process used (measured, from disk, loaded)
  """
  env = environment(device if device is not None else jax.devices()[0])
  with _lock:
    records = [s for s in _memory.values() if s.environment == env]
  document = {
      "format": FILE_FORMAT,
      "version": FILE_VERSION,
      "environment": dataclasses.asdict(env),
      "timings": [{"name": s.key.name, "config": s.key.config, "launches": list(s.key.launches),
                   "signature": s.key.signature, "us": s.timing.us, "error": s.timing.error} for s in records],
  }
  data = json.dumps(document, indent=1).encode()
  path = os.fspath(path)
  temp = os.path.join(os.path.dirname(os.path.abspath(path)),
                      f".{os.path.basename(path)}.{os.getpid()}-{secrets.token_hex(8)}.partial")
  fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
  try:
    with os.fdopen(fd, "wb") as f:
      f.write(data)
    os.replace(temp, path)
  except BaseException:
    if os.path.lexists(temp):
      os.unlink(temp)
    raise
  return len(records)


def load_tuning(path: str | os.PathLike, device=None) -> int:
  """Reads a `save_tuning` file into this process's timings for ``device`` (jax's first device by
  default); returns how many were loaded. A file that is not ours, malformed, or from another device,
  compute capability, driver, jax_mosaic_ffi or toolchain release is ignored with a `TuningFileIgnored`
  warning saying which, and 0 comes back. Every value is type-checked and bounded before use; a file over
  16 MiB, not a regular file, owned by another user or writable by others is refused::

    jmf.load_tuning("tuning.json")   # before the first call: autotuning picks winners without timing
  """
  env = environment(device if device is not None else jax.devices()[0])
  path = os.fspath(path)
  try:
    theirs, records = _read_file(path)
    for field, label in _ENV_FIELDS:
      if getattr(theirs, field) != getattr(env, field):
        raise _Malformed(f"it was tuned with {label} {getattr(theirs, field)!r}, and this process has "
                         f"{getattr(env, field)!r}")
  except _Malformed as e:
    warnings.warn(f"jax_mosaic_ffi.load_tuning: {path} is ignored: {e}; nothing was loaded", TuningFileIgnored,
                  skip_file_prefixes=(PACKAGE_DIR,))
    return 0
  for key, timing in records:
    _remember(_record_id(env, key), _Stored(env, key, timing, "file"))
  return len(records)


def read_file(path: str | os.PathLike) -> tuple[Environment, list[tuple[TimingKey, Timing]]]:
  """A tuning file's environment and timings, whatever machine tuned it (for a kernel pack's winners); raises
  ValueError saying why a file is refused, by the rules `load_tuning` applies."""
  return _read_file(os.fspath(path))


def _read_file(path: str) -> tuple[Environment, list[tuple[TimingKey, Timing]]]:
  # The file is the user's own choice, so a symlink to it is followed; what it is then must be ours.
  try:
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
  except OSError as e:
    raise _Malformed(f"it cannot be opened ({e.strerror})") from None
  try:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
      raise _Malformed("it is not a regular file")
    if st.st_uid not in (os.geteuid(), 0):
      raise _Malformed(f"it belongs to uid {st.st_uid}, not to you (uid {os.geteuid()}) or root")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
      raise _Malformed(f"others can write to it (mode {stat.S_IMODE(st.st_mode):o}); run chmod go-w on it")
    if st.st_size > MAX_FILE_BYTES:
      raise _Malformed(f"it holds {st.st_size} bytes, over the limit of {MAX_FILE_BYTES}")
    chunks, left = [], MAX_FILE_BYTES + 1
    while left > 0:
      chunk = os.read(fd, min(left, 1 << 20))
      if not chunk:
        break
      chunks.append(chunk)
      left -= len(chunk)
    data = b"".join(chunks)
  except OSError as e:
    raise _Malformed(f"it cannot be read ({e.strerror})") from None
  finally:
    os.close(fd)
  if len(data) > MAX_FILE_BYTES:
    raise _Malformed(f"it holds over {MAX_FILE_BYTES} bytes")
  try:
    document = json.loads(data)
  except (ValueError, RecursionError) as e:
    raise _Malformed(f"it is not JSON ({type(e).__name__})") from None
  return _parse_document(document)


def _parse_document(document: Any) -> tuple[Environment, list[tuple[TimingKey, Timing]]]:
  if not isinstance(document, dict) or document.get("format") != FILE_FORMAT:
    raise _Malformed(f"it is not a jax_mosaic_ffi tuning file (no \"format\": \"{FILE_FORMAT}\")")
  version = document.get("version")
  if version != FILE_VERSION or isinstance(version, bool):
    raise _Malformed(f"it has format version {_shown(version)}; this jax_mosaic_ffi reads version {FILE_VERSION}")
  theirs = document.get("environment")
  if not isinstance(theirs, dict):
    raise _Malformed("environment is not an object")
  env = Environment(**{field: _text(theirs.get(field), f"environment.{field}") for field, _ in _ENV_FIELDS})
  timings = document.get("timings")
  if not isinstance(timings, list):
    raise _Malformed("timings is not a list")
  if len(timings) > MAX_RECORDS:
    raise _Malformed(f"it has {len(timings)} timings, over the limit of {MAX_RECORDS}")
  records = []
  for k, row in enumerate(timings):
    where = f"timings[{k}]"
    if not isinstance(row, dict):
      raise _Malformed(f"{where} is not an object")
    launches = row.get("launches")
    if not isinstance(launches, list) or len(launches) > MAX_KERNELS:
      raise _Malformed(f"{where}.launches is not a list of at most {MAX_KERNELS} strings")
    key = TimingKey(name=_text(row.get("name"), f"{where}.name"), config=_text(row.get("config"), f"{where}.config"),
                    launches=tuple(_text(s, f"{where}.launches[{j}]") for j, s in enumerate(launches)),
                    signature=_text(row.get("signature"), f"{where}.signature"))
    records.append((key, _timing(row.get("us"), row.get("error"), where)))
  return env, records


def _shown(value) -> str:
  text = repr(value)
  return text if len(text) <= 40 else text[:37] + "..."
