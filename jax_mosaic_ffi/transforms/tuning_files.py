"""Tuning files: autotuning timings carried between machines (`save_tuning`, `load_tuning`), so a cluster tunes on
one machine and ships the file.

A file is ignored, with one `TuningFileIgnored` warning saying why, when it is not ours (a file that is not
regular, too large, owned by another user or writable by others, as the disk cache's trust rules say:
docs/threat_model.md), malformed (every value is type-checked and bounded before use), of another format version,
or tuned on another device, compute capability, driver, jax_mosaic_ffi or toolchain release. Nothing in a file
can add code: a timing only ranks configs the program itself lists, and a config is only chosen once it builds
here.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import stat
import warnings
from typing import Any

import jax

from jax_mosaic_ffi.base import owned_files
from jax_mosaic_ffi.base.paths import PACKAGE_DIR
from jax_mosaic_ffi.store.tuning_records import (ENV_FIELDS, MAX_KERNELS, MAX_RECORDS, Environment, Malformed,
                                                 Timing, TimingKey, checked_text, checked_timing, of_environment,
                                                 remember_loaded)
from jax_mosaic_ffi.transforms.tuning_environment import environment

FILE_FORMAT = "jax_mosaic_ffi tuning"
# 2: the environment's "toolchains" (every front end's) took the place of "triton"; a version 1 file is refused.
FILE_VERSION = 2
MAX_FILE_BYTES = 16 << 20


class TuningFileIgnored(UserWarning):
  """A tuning file was not loaded: not ours, malformed, or from another machine or version.

  `load_tuning` warns with it, saying why (e.g. ``it was tuned with device 'NVIDIA H100 80GB HBM3', and
  this process has 'NVIDIA H200'``), and loads nothing: autotuning then times the configs itself. To make
  it an error: ``warnings.simplefilter("error", jmf.TuningFileIgnored)``.
  """


def save_tuning(path: str | os.PathLike, device=None) -> int:
  """Writes this process's autotuning timings for ``device`` (jax's first device by default) to
  ``path``, replacing it atomically; returns how many. `load_tuning` reads the file on another
  machine of the same GPU, driver, jax_mosaic_ffi and toolchains (Triton, CuTe DSL): a cluster tunes
  once and ships the file::

    jmf.save_tuning("tuning.json")   # after tuning: the timings this process used (measured, from disk, loaded)
  """
  env = environment(device if device is not None else jax.local_devices()[0])
  records = of_environment(env)
  document = {
      "format": FILE_FORMAT,
      "version": FILE_VERSION,
      "environment": dataclasses.asdict(env),
      "timings": [{"name": key.name, "config": key.config, "launches": list(key.launches),
                   "signature": key.signature, "us": timing.us, "error": timing.error} for key, timing in records],
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
  env = environment(device if device is not None else jax.local_devices()[0])
  path = os.fspath(path)
  try:
    theirs, records = _read_file(path)
    for field, label in ENV_FIELDS:
      if getattr(theirs, field) != getattr(env, field):
        raise Malformed(f"it was tuned with {label} {getattr(theirs, field)!r}, and this process has "
                         f"{getattr(env, field)!r}")
  except Malformed as e:
    warnings.warn(f"jax_mosaic_ffi.load_tuning: {path} is ignored: {e}; nothing was loaded", TuningFileIgnored,
                  skip_file_prefixes=(PACKAGE_DIR,))
    return 0
  remember_loaded(env, records)
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
    raise Malformed(f"it cannot be opened ({e.strerror})") from None
  try:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
      raise Malformed("it is not a regular file")
    if owned_files.foreign(st):
      raise Malformed(f"it belongs to uid {st.st_uid}, not to you (uid {os.geteuid()}) or root")
    if owned_files.writable_by_others(st):
      raise Malformed(f"others can write to it (mode {stat.S_IMODE(st.st_mode):o}); run chmod go-w on it")
    if st.st_size > MAX_FILE_BYTES:
      raise Malformed(f"it holds {st.st_size} bytes, over the limit of {MAX_FILE_BYTES}")
    data = owned_files.read_at_most(fd, MAX_FILE_BYTES)
  except OSError as e:
    raise Malformed(f"it cannot be read ({e.strerror})") from None
  finally:
    os.close(fd)
  if len(data) > MAX_FILE_BYTES:
    raise Malformed(f"it holds over {MAX_FILE_BYTES} bytes")
  try:
    document = json.loads(data)
  except (ValueError, RecursionError) as e:
    raise Malformed(f"it is not JSON ({type(e).__name__})") from None
  return _parse_document(document)


def _parse_document(document: Any) -> tuple[Environment, list[tuple[TimingKey, Timing]]]:
  if not isinstance(document, dict) or document.get("format") != FILE_FORMAT:
    raise Malformed(f"it is not a jax_mosaic_ffi tuning file (no \"format\": \"{FILE_FORMAT}\")")
  version = document.get("version")
  if version != FILE_VERSION or isinstance(version, bool):
    raise Malformed(f"it has format version {_shown(version)}; this jax_mosaic_ffi reads version {FILE_VERSION}")
  theirs = document.get("environment")
  if not isinstance(theirs, dict):
    raise Malformed("environment is not an object")
  env = Environment(**{field: checked_text(theirs.get(field), f"environment.{field}") for field, _ in ENV_FIELDS})
  timings = document.get("timings")
  if not isinstance(timings, list):
    raise Malformed("timings is not a list")
  if len(timings) > MAX_RECORDS:
    raise Malformed(f"it has {len(timings)} timings, over the limit of {MAX_RECORDS}")
  records = []
  for k, row in enumerate(timings):
    where = f"timings[{k}]"
    if not isinstance(row, dict):
      raise Malformed(f"{where} is not an object")
    launches = row.get("launches")
    if not isinstance(launches, list) or len(launches) > MAX_KERNELS:
      raise Malformed(f"{where}.launches is not a list of at most {MAX_KERNELS} strings")
    key = TimingKey(name=checked_text(row.get("name"), f"{where}.name"),
                    config=checked_text(row.get("config"), f"{where}.config"),
                    launches=tuple(checked_text(s, f"{where}.launches[{j}]") for j, s in enumerate(launches)),
                    signature=checked_text(row.get("signature"), f"{where}.signature"))
    records.append((key, checked_timing(row.get("us"), row.get("error"), where)))
  return env, records


def _shown(value) -> str:
  text = repr(value)
  return text if len(text) <= 40 else text[:37] + "..."
