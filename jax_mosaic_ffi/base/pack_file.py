"""A kernel pack's file: our format, versioned and bounded, written whole and verified whole before any use.

    offset 0   magic b"JMFPACK\\0"
           8   format version, u32 little-endian (FORMAT_VERSION)
          12   the manifest's length in bytes, u32
          16   the manifest: UTF-8 JSON (entries in order: key, kind, size, sha256, about, and from version 3
               headers; the table of NVRTC headers, base/pack_headers.py)
           .   the entries' payloads as stored, one after another in the manifest's order, nothing between
    end - 32   sha256 of every byte before it: the pack's digest

A payload is what a compile-cache entry holds (the front end's ``encode`` bytes, store/compile_cache.py), or a
timing (``kind`` "tuning"); an entry's ``size`` is what is stored, its ``sha256`` that of the payload (with its
headers put back, where the pack's table holds them). `read` refuses a file, by name and with what to do, before
exposing any entry: not a regular file, owned by someone else than the user or root, writable by group or others,
in a folder that is, over `MAX_PACK_BYTES`; not ours (magic), of another format version, truncated or altered (the
digest), or with any manifest value out of bounds or any payload whose sha256 is not its entry's. Nothing of a
pack is half-used. What a read holds is bounded by what it holds once joined (an entry's header rows put back in
it), before it is joined: each entry by `MAX_ENTRY_BYTES`, all of them by `HELD_PER_BYTE` times the file's size and
by `MAX_HELD_BYTES`; any failure, running out of memory included, is a `PackError` naming the pack.

Nothing here depends on jax: a pack made under one jax release reads the same under every other.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import secrets
import stat
import struct
import unicodedata
from typing import Any, Callable, Iterable, Mapping

from jax_mosaic_ffi.base import owned_files
from jax_mosaic_ffi.base import pack_headers
from jax_mosaic_ffi.base.errors import PackError

MAGIC = b"JMFPACK\0"
FORMAT = "jax_mosaic_ffi pack"
# Version 2: a compile's "about" may name its images, its source pack and its keyed settings (a release that reads
# only version 1 refuses such a pack by its version, not as damaged); version 1 packs are read as they are.
# Version 3: the headers NVRTC compiles read are stored once per pack, in a table the entries refer to.
FORMAT_VERSION = 3
READ_VERSIONS = (1, 2, 3)
_HEADER = struct.Struct("<8sII")
_DIGEST_BYTES = 32
SUFFIX = ".jmfpack"

# Bounds on everything read, checked before use.
MAX_PACK_BYTES = 4 << 30
MAX_MANIFEST_BYTES = 64 << 20
MAX_ENTRIES = 200_000
MAX_ENTRY_BYTES = 256 << 20   # as the disk cache: a kernel's binaries are far smaller
# What the entries a process holds may come to once their header rows are put back: a pack keeps each header once,
# so its entries hold more than its file, but a table row (about 150 bytes) costs an entry at least 2 bytes.
HELD_PER_BYTE = 128
MAX_HELD_BYTES = 8 << 30
MAX_TEXT = 4096
MAX_LIST = 256
KINDS = ("compile", "specialization", "tuning")
# What an entry's "about" may hold (all text, or lists of text): for listings, messages and `pack check` (a compile's
# "images": module_format.image_name of each; a merged entry's "from_pack"; "settings": the keyed environment
# variables set where it compiled), never for a lookup.
ABOUT_FIELDS = ("front_end", "kernel", "specialization", "targets", "toolchain", "call_sites", "recorded_for",
                "device", "compute_capability", "name", "signature", "config", "images", "from_pack",
                "settings")
# What the manifest's other lists hold (autotuning winners, calls without one, compiles a front end refused): each a
# list of objects of text (or lists of text).
NOTE_LISTS = ("winners", "untuned", "refused")
_KEY = re.compile(r"[0-9a-f]{64}")


@dataclasses.dataclass(frozen=True)
class Entry:
  key: str
  kind: str
  payload: bytes
  about: Mapping[str, Any]

  @property
  def sha256(self) -> str:
    return hashlib.sha256(self.payload).hexdigest()


@dataclasses.dataclass(frozen=True)
class Pack:
  """A verified pack: its entries by key and the manifest's other fields (``created``, ``untuned``, ...)."""

  path: str
  digest: str
  size: int
  entries: Mapping[str, Entry]
  created: Mapping[str, Any]
  notes: Mapping[str, tuple]
  left_out: int = 0  # entries verified (in the digest) but not held: `read`'s ``keep`` left them out


def write(path: str, entries: Iterable[Entry], created: Mapping[str, Any],
          notes: Mapping[str, Iterable[Mapping[str, Any]]] | None = None) -> str:
  """Writes a pack to ``path`` (atomically: a temporary file renamed into place, mode 0644); returns its digest.
  Everything written is bounded as `read` bounds it, so a pack we write is one we read back."""
  entries = list(entries)
  notes = {k: [dict(n) for n in v] for k, v in (notes or {}).items()}
  table = pack_headers.Table()
  rows, stored = [], []
  for e in entries:
    factored = table.factored(e.payload) if e.kind == "compile" else None
    stored.append(e.payload if factored is None else factored[0])
    rows.append({"key": e.key, "kind": e.kind, "size": len(stored[-1]), "sha256": e.sha256, "about": dict(e.about),
                 **({"headers": factored[1]} if factored else {})})
  manifest = {"format": FORMAT, "version": FORMAT_VERSION, "created": dict(created), "entries": rows, **notes,
              **({"headers": table.rows} if table.rows else {})}
  text = json.dumps(manifest, sort_keys=True).encode()
  try:
    _check_manifest(json.loads(text), sum(map(len, stored)), FORMAT_VERSION)
  except ValueError as e:
    raise PackError(f"the pack {path} cannot be written: {e} (over the bounds a pack is read with)") from None
  body = b"".join([_HEADER.pack(MAGIC, FORMAT_VERSION, len(text)), text, *stored])
  if len(body) + _DIGEST_BYTES > MAX_PACK_BYTES:
    raise PackError(f"the pack would hold {len(body)} bytes, over the limit of {MAX_PACK_BYTES}: split it (prune "
                    "archs, or make one pack per model)")
  digest = hashlib.sha256(body).digest()
  path = os.path.abspath(os.fspath(path))
  temp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{os.getpid()}-{secrets.token_hex(8)}.partial")
  fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
  try:
    with os.fdopen(fd, "wb") as f:
      f.write(body)
      f.write(digest)
    os.chmod(temp, 0o644)  # whatever the umask: never group- or world-writable
    os.replace(temp, path)
  except BaseException:
    if os.path.lexists(temp):
      os.unlink(temp)
    raise
  return digest.hex()


def read(path: str | os.PathLike, keep: Callable[[str, Mapping[str, Any]], bool] | None = None) -> Pack:
  """The pack at ``path``, verified whole; raises `PackError` naming it, why, and what to do. ``keep(kind, about)``
  says which entries this process holds (None: all): the file is read once, in pieces, every byte into its digest,
  and only the payloads of the entries kept are held; the others are hashed and dropped (`Pack.left_out`). So a
  process per GPU holds its GPU's entries, not the whole pack, and nothing of the file is mapped (a file truncated
  or rewritten while it is read is refused, never half-used)."""
  shown = os.fspath(path)
  fd, size = _open_trusted(shown)
  try:
    return _read_stream(shown, _Stream(fd, size), keep)
  except OSError as e:
    raise PackError(f"pack {shown} cannot be read ({e.strerror})") from None
  except MemoryError:
    raise PackError(f"pack {shown} cannot be read: this process ran out of memory reading it (it holds "
                    f"{size} bytes); read it where more memory is free, or split it") from None
  finally:
    os.close(fd)


class _Stream:
  """The open pack, read in order into one running sha256."""

  _CHUNK = 1 << 20

  def __init__(self, fd: int, size: int) -> None:
    self.fd, self.size, self.hasher, self.read_bytes = fd, size, hashlib.sha256(), 0

  def take(self, count: int, hold: bool = True, hashed: bool = True) -> bytes | None:
    """The next ``count`` bytes (None where not ``hold``: hashed and dropped); raises _Changed short of them."""
    data = bytearray(count if hold else min(count, self._CHUNK))
    with memoryview(data) as view:
      got = 0
      while got < count:
        part = view[got:] if hold else view[:min(count - got, len(data))]
        n = os.readv(self.fd, [part])
        if n == 0:
          raise _Changed()
        if hashed:
          self.hasher.update(part[:n])
        got += n
    self.read_bytes += count
    return bytes(data) if hold else None

  def at_end(self) -> bool:
    return os.read(self.fd, 1) == b""


class _Changed(Exception):
  """The file held fewer bytes than its size said: it changed while it was read."""


def _read_stream(shown: str, stream: _Stream, keep) -> Pack:
  if stream.size < _HEADER.size + _DIGEST_BYTES:
    raise PackError(f"pack {shown} is not a jax_mosaic_ffi pack (no {MAGIC!r} at its start): name a file made by "
                    "python -m jax_mosaic_ffi.pack")
  try:
    magic, version, manifest_size = _HEADER.unpack(stream.take(_HEADER.size))
    if magic != MAGIC:
      raise PackError(f"pack {shown} is not a jax_mosaic_ffi pack (no {MAGIC!r} at its start): name a file made by "
                      "python -m jax_mosaic_ffi.pack")
    if version not in READ_VERSIONS:
      raise PackError(f"pack {shown} has pack format version {version}, and this jax_mosaic_ffi reads versions "
                      f"{', '.join(map(str, READ_VERSIONS))}: build it again with this release "
                      "(python -m jax_mosaic_ffi.pack record ...)")
    body = stream.size - _DIGEST_BYTES
    # What is wrong with the manifest is said only once the digest holds: a truncated or altered file is damaged.
    problem, kept = f"its manifest's length {manifest_size} is out of bounds", []
    if manifest_size <= min(MAX_MANIFEST_BYTES, body - _HEADER.size):
      try:
        manifest = json.loads(stream.take(manifest_size))
        _check_manifest(manifest, body - _HEADER.size - manifest_size, version)
        problem = ""
      except (ValueError, RecursionError) as e:
        problem = f"{e}; nothing of it was used. Build it again"
    if not problem:
      for row in manifest["entries"]:
        held = keep is None or keep(row["kind"], row["about"])
        kept.append((row, stream.take(row["size"], hold=held)))
    else:
      stream.take(body - stream.read_bytes, hold=False)
    digest = stream.take(_DIGEST_BYTES, hashed=False)
    if not stream.at_end():
      raise _Changed()
  except _Changed:
    raise PackError(f"pack {shown} changed while it was read: read it when nothing writes it") from None
  if stream.hasher.digest() != digest:
    raise PackError(f"pack {shown} is damaged: its digest does not match its contents (truncated or altered after "
                    "it was written); nothing of it was used. Copy it again from where it was built, or build it again")
  if problem:
    raise PackError(f"pack {shown} is damaged: {problem}")
  entries, table = {}, pack_headers.Rows(manifest.get("headers", []))
  held, limit = 0, min(HELD_PER_BYTE * stream.size, MAX_HELD_BYTES)
  for row, payload in kept:
    if payload is None:
      continue
    size = table.joined_size(payload, row["headers"]) if "headers" in row else len(payload)
    held += size
    if size > MAX_ENTRY_BYTES or held > limit:  # known before anything is joined
      what = (f"entry {row['key']} would hold {size} bytes once its headers are put back, over the limit of "
              f"{MAX_ENTRY_BYTES}") if size > MAX_ENTRY_BYTES else (
              f"its entries would hold over {limit} bytes once their headers are put back ({HELD_PER_BYTE} "
              f"times its {stream.size} bytes, at most {MAX_HELD_BYTES})")
      raise PackError(f"pack {shown} is refused: {what}; nothing of it was used. Build it again")
    if "headers" in row:  # its headers from the pack's table (the sha256 below checks what that makes)
      payload = pack_headers.joined(payload, row["headers"], table.rows) or b""
    if hashlib.sha256(payload).hexdigest() != row["sha256"]:
      raise PackError(f"pack {shown} is damaged: entry {row['key']} does not match its sha256; nothing of it was "
                      "used. Build it again")
    entries[row["key"]] = Entry(row["key"], row["kind"], payload, row["about"])
  return Pack(path=shown, digest=digest.hex(), size=stream.size, entries=entries, created=manifest["created"],
              notes={k: tuple(manifest.get(k, ())) for k in NOTE_LISTS}, left_out=len(kept) - len(entries))


def escaped(value) -> str:
  """``value`` as text with every control or format character escaped (\\x1b, \\u202e): text from a manifest
  is anyone's, and a terminal escape or a line break in it could rewrite what a listing shows (the digest)."""
  return "".join(c if c == " " or unicodedata.category(c)[0] not in "CZ" else
                 (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}" if ord(c) < 0x10000 else
                  f"\\U{ord(c):08x}") for c in str(value))


def _open_trusted(path: str) -> tuple[int, int]:
  """The open file the user named and its size, refused unless it and its folder are the user's (or root's) and
  writable by no one else. The name is the user's choice, so a symlink to it is followed (as for a tuning file);
  the folder is opened, checked, and the file opened inside it without following a link."""
  real = os.path.realpath(path)
  folder, name = os.path.split(real)
  try:
    dir_fd = os.open(folder or "/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
  except OSError as e:
    raise PackError(f"pack {path} cannot be read: its folder {folder} cannot be opened ({e.strerror})") from None
  try:
    # Opened before its folder is judged, so that a pack that is not there is said to be missing; nothing of it is
    # read before both are.
    try:
      fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as e:
      raise PackError(f"pack {path} cannot be opened ({e.strerror}): name a pack file that is there") from None
    try:
      _check_owner(os.fstat(dir_fd), f"pack {path}: its folder {folder}", "chmod go-w on the folder, or move the "
                   "pack into a folder of your own")
    except PackError:
      os.close(fd)
      raise
  finally:
    os.close(dir_fd)
  try:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
      raise PackError(f"pack {path} is not a regular file: name the pack file itself")
    _check_owner(st, f"pack {path}", "chmod go-w on it")
    if st.st_size > MAX_PACK_BYTES:
      raise PackError(f"pack {path} holds {st.st_size} bytes, over the limit of {MAX_PACK_BYTES}: split it")
  except BaseException:
    os.close(fd)
    raise
  return fd, st.st_size


# How a container or a shared machine installs a pack the way it is trusted (docs/guides/deploying.md).
_RECIPE = ("in a container, unpack it with tar --no-same-owner (or COPY --chown=root:root) and chmod 0755 its "
           "folders, 0644 the pack")


def _check_owner(st: os.stat_result, what: str, fix: str) -> None:
  if owned_files.foreign(st):
    raise PackError(f"{what} belongs to uid {st.st_uid}, not to you (uid {os.geteuid()}) or root, so its owner "
                    f"could put code there that this process would run: copy the pack into a folder of your own, "
                    f"or make root its owner ({_RECIPE})")
  if owned_files.writable_by_others(st):
    who = " and ".join(w for w, bit in (("its group", stat.S_IWGRP), ("all users", stat.S_IWOTH)) if st.st_mode & bit)
    raise PackError(f"{what} is writable by {who} (mode {stat.S_IMODE(st.st_mode):o}), who could put code there "
                    f"that this process would run: {fix} ({_RECIPE})")


def _text(value, what: str) -> str:
  if not isinstance(value, str) or len(value) > MAX_TEXT:
    raise ValueError(f"{what} is not a string of at most {MAX_TEXT} characters")
  return value


def _texts(value, what: str) -> None:
  """Text, or a list of at most MAX_LIST texts."""
  if isinstance(value, list):
    if len(value) > MAX_LIST:
      raise ValueError(f"{what} has over {MAX_LIST} items")
    for k, item in enumerate(value):
      _text(item, f"{what}[{k}]")
  else:
    _text(value, what)


def _object_of_texts(value, what: str, fields: tuple[str, ...] | None = None) -> None:
  if not isinstance(value, dict) or len(value) > len(ABOUT_FIELDS) + 16:
    raise ValueError(f"{what} is not an object")
  for field, item in value.items():
    if fields is not None and field not in fields:
      raise ValueError(f"{what} has an unknown field {_text(field, 'a field')!r}")
    _texts(item, f"{what}.{field}")


def _check_manifest(manifest, blob_bytes: int, version: int) -> None:
  """Raises ValueError unless ``manifest`` is one we write, of the file's format ``version``, with every value
  bounded and the entries' sizes adding up to exactly ``blob_bytes``."""
  if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or manifest.get("version") != version:
    raise ValueError("its manifest is not a jax_mosaic_ffi pack manifest of this version")
  _object_of_texts(manifest.get("created"), "created")
  rows = manifest.get("entries")
  if not isinstance(rows, list) or len(rows) > MAX_ENTRIES:
    raise ValueError(f"entries is not a list of at most {MAX_ENTRIES}")
  total, seen = 0, set()
  for k, row in enumerate(rows):
    where = f"entries[{k}]"
    fields = {"key", "kind", "size", "sha256", "about"}
    if not isinstance(row, dict) or set(row) - {"headers"} != fields or ("headers" in row and version < 3):
      raise ValueError(f"{where} is not an entry")
    if not isinstance(row["key"], str) or not _KEY.fullmatch(row["key"]) or row["key"] in seen:
      raise ValueError(f"{where}.key is not a new key of 64 hex digits")
    seen.add(row["key"])
    if row["kind"] not in KINDS:
      raise ValueError(f"{where}.kind is not one of {', '.join(KINDS)}")
    if type(row["size"]) is not int or not 0 <= row["size"] <= MAX_ENTRY_BYTES:
      raise ValueError(f"{where}.size is not a size of at most {MAX_ENTRY_BYTES} bytes")
    if not isinstance(row["sha256"], str) or not _KEY.fullmatch(row["sha256"]):
      raise ValueError(f"{where}.sha256 is not 64 hex digits")
    _object_of_texts(row["about"], f"{where}.about", ABOUT_FIELDS)
    total += row["size"]
  if total != blob_bytes:
    raise ValueError(f"its entries hold {total} bytes, and it has {blob_bytes}")
  for name in NOTE_LISTS:
    notes = manifest.get(name, [])
    if not isinstance(notes, list) or len(notes) > MAX_ENTRIES:
      raise ValueError(f"{name} is not a list of at most {MAX_ENTRIES}")
    for k, note in enumerate(notes):
      _object_of_texts(note, f"{name}[{k}]")
  pack_headers.check_table(manifest.get("headers", []), rows)
  extra = set(manifest) - {"format", "version", "created", "entries", *NOTE_LISTS,
                           *(("headers",) if version >= 3 else ())}
  if extra:
    raise ValueError(f"its manifest has unknown fields {sorted(extra)[:4]}")
