"""Recording a program's kernels for a pack: ``JAX_MOSAIC_FFI_PACK_RECORD=DIR``.

While it is set, every entry of a recorded kind the process uses (a compile or a Triton specialization: compiled,
or a hit in memory, on disk, in a pack or from a peer; `Recorder` watches the store for them) is written into
``DIR`` once, with what its front end says of it (kernel, front end,
specialization, targets, toolchain, call site) and the default targets it was made for; so is every autotuning
decision (its configs' timing keys: transforms/autotune.py) and every compile that failed (the front end refused
the arch, say). ``python -m jax_mosaic_ffi.pack record`` sets it for the program it runs, once per arch, and builds
the pack from the folder, which pack/recordings.py reads (the reading is the command line's: this half is what a
recording process runs).

Files are written whole (a temporary file renamed into place), one per entry and process, so processes may record
into one folder at once.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import struct
import contextlib
import threading
from typing import Any, Callable, Mapping

from jax_mosaic_ffi.base import flags
from jax_mosaic_ffi.base import owned_files
from jax_mosaic_ffi.base import pack_file
from jax_mosaic_ffi.base import source_location
from jax_mosaic_ffi.store import packs
from jax_mosaic_ffi.store.entries import Observer, own
from jax_mosaic_ffi.toolchain import kernel as kernel_lib
from jax_mosaic_ffi.toolchain.compiled import Compiled

ENV = flags.PACK_RECORD
MAGIC = b"JMFREC1\0"
HEADER = struct.Struct("<8sI")
MAX_NOTE_BYTES = 4 << 20
ENTRY_NAME = re.compile(r"([0-9a-f]{64})\.[0-9]+-[0-9a-f]{16}\.entry")
NOTE_NAME = re.compile(r"(tuning|failed|compiling)-[0-9a-f]{64}\.json")
# A compile that never ended: the process died in it (a compiler's native crash on an arch it cannot target).
CRASHED = ("the process ended while this compile ran (the compiler crashed: it cannot build this kernel for "
           "that arch, or the program was killed)")

_lock = threading.Lock()
_written: set[tuple[str, str]] = set()  # (folder, entry key or note name): each written once per process


def directory() -> str | None:
  value = os.environ.get(ENV, "").strip()
  return os.path.expanduser(value) if value else None


def on() -> bool:
  return directory() is not None


def recorded_for() -> list[str]:
  """The default targets of this process: what the entries it records were made for."""
  return [a.sm for a in kernel_lib.default_targets()]


def written(entry_key: str) -> bool:
  """Whether this process recorded ``entry_key`` into the folder already (each entry is written once)."""
  folder = directory()
  with _lock:
    return (folder, entry_key) in _written


def entry(entry_key: str, kind: str, payload: bytes, about: Mapping[str, Any]) -> None:
  """Records one compile-cache entry (once per process)."""
  folder = directory()
  if folder is None:
    return
  with _lock:
    if (folder, entry_key) in _written:
      return
    _written.add((folder, entry_key))
  header = json.dumps({"key": entry_key, "kind": kind,
                       "about": bounded({**about, "recorded_for": recorded_for()})}).encode()
  _write(folder, f"{entry_key}.{os.getpid()}-{secrets.token_hex(8)}.entry",
         HEADER.pack(MAGIC, len(header)) + header + payload)


def note(kind: str, document: Mapping[str, Any]) -> None:
  """Records a note: "tuning" (an autotuning decision's configs) or "failed" (a compile that raised)."""
  folder = directory()
  if folder is None:
    return
  data = json.dumps({**document, "recorded_for": recorded_for()}, sort_keys=True, default=str).encode()
  name = f"{kind}-{hashlib.sha256(data).hexdigest()}.json"
  with _lock:
    if (folder, name) in _written:
      return
    _written.add((folder, name))
  _write(folder, name, data[:MAX_NOTE_BYTES])


def compiling(about: Mapping[str, Any]) -> str | None:
  """Notes a compile about to run; `compiled` removes the note when it ends, in any way Python sees. A note left
  behind names the compile a native crash ended the process in. Returns the note's path (None: not recording)."""
  folder = directory()
  if folder is None:
    return None
  data = json.dumps({**about, "recorded_for": recorded_for(), "pid": os.getpid(), "token": secrets.token_hex(8)},
                    sort_keys=True, default=str).encode()
  name = f"compiling-{hashlib.sha256(data).hexdigest()}.json"
  _write(folder, name, data[:MAX_NOTE_BYTES])
  return os.path.join(folder, name)


def compiled(note: str | None) -> None:
  if note is not None:
    try:
      os.unlink(note)
    except FileNotFoundError:
      pass


def bounded(about: Mapping[str, Any]) -> dict:
  """``about`` as a pack's manifest holds it: known fields, text (or lists of text), each bounded."""
  out = {}
  for field in pack_file.ABOUT_FIELDS:
    value = about.get(field)
    if value is None:
      continue
    if isinstance(value, (list, tuple)):
      out[field] = [_clip(str(v)) for v in value][:pack_file.MAX_LIST]
    else:
      out[field] = _clip(str(value))
  return out


def _clip(text: str) -> str:
  return text if len(text) <= pack_file.MAX_TEXT else text[:pack_file.MAX_TEXT - 3] + "..."


def _write(folder: str, name: str, data: bytes) -> None:
  owned_files.own_folder(folder, ENV)
  temp = os.path.join(folder, f".{name}.partial")
  fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
  try:
    with os.fdopen(fd, "wb") as f:
      f.write(data)
    os.replace(temp, os.path.join(folder, name))
  except BaseException:
    if os.path.lexists(temp):
      os.unlink(temp)
    raise


@contextlib.contextmanager
def noted(about: Callable[[], Mapping[str, Any]] | None):
  """While recording, a failure inside (a front end that cannot target an arch) is noted with what ``about`` says
  of the compile, then raised as it was; so is a crash that ends the process (a note made before)."""
  if not on():
    yield
    return
  found = packs.with_call_site(about, source_location.current())
  running = compiling(found)
  try:
    yield
  except Exception as e:
    note("failed", {**found, "error": f"{type(e).__name__}: {str(e)[:2000]}"})
    raise
  finally:
    compiled(running)


def unpackable(about: Callable[[], Mapping[str, Any]] | None, why: str) -> None:
  """Notes a compile no pack can hold (``pack check`` fails on it)."""
  note("failed", {**packs.with_call_site(about, source_location.current()), "error": f"not packable: {why}"})


class Recorder(Observer):
  """Recording as the store's observer: each entry of a recorded kind served or made is written once, with what
  its front end says of it and the images it holds; each compile runs `noted`; one kept nowhere is noted."""

  def watches(self, ask) -> bool:
    return ask.codec.recorded and on()

  def making(self, ask):
    return noted(ask.about)

  def served(self, ask, found) -> None:
    self._record(ask, found.value, found.key or own(ask.key))

  def made(self, ask, found, unkept) -> None:
    if unkept is not None:
      unpackable(ask.about, unkept)
    else:
      self._record(ask, found.value, own(ask.key))

  @staticmethod
  def _record(ask, value, key: str) -> None:
    """Writes the entry under the key a pack holds it by (for one served from a pack under another target's key,
    that key: the pack it came from holds it)."""
    if written(key):
      return
    data = ask.codec.packed(value)
    if data is None:
      if ask.codec.kind == "compile":  # a specialization that cannot be written is only answered again on the node
        unpackable(ask.about, "it is kept in memory only (its values cannot be written)")
      return
    held = value if isinstance(value, Compiled) else getattr(value, "compiled", None)  # every front end's holds one
    images = {"images": held.image_names()} if isinstance(held, Compiled) else {}
    entry(key, ask.codec.kind, data, {**packs.with_call_site(ask.about, source_location.current()), **images})


RECORDER = Recorder()
