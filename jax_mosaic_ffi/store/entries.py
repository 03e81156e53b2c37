"""What the store keeps and hands back: a `Codec` per kind of entry, an entry's `Key`, and the `Found` entry, which
says the tier that answered and where the entry came from.

A codec is defined once, beside what makes its kind (a compiler room's compile, Triton's specialization,
autotuning's timings and decisions); what one call adds to it (the values a decoded entry is checked against) is
bound to it for that call (`Codec.bound`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, NamedTuple

from jax_mosaic_ffi.base.module_format import Arch


@dataclasses.dataclass(frozen=True)
class Codec:
  """How one kind of entry is written, read back and checked.

  Attributes:
    kind: the kind ("compile", "specialization", "tuning" (a timing), "decision"): a pack entry's kind, the stats' key.
    encode: ``value -> bytes`` for the disk cache, or None for a value that can be kept in memory only.
    decode: ``bytes -> value``; None or ValueError refuses an entry (a disk entry refused is deleted).
    pack_encode / pack_decode: its form in a pack and in a job's store, where it differs from ``encode`` /
      ``decode`` (an NVRTC entry names the headers it read by this machine's paths: cuda/nvrtc/portable.py).
    fresh: ``value -> bool``, asked on each memory hit of a value that can go stale while held (headers on disk).
    fits: ``(value, about) -> bool``: whether an entry another process made (a pack's, a peer's) is the one this
      call names (the module defines the kernel ``about()["kernel"]`` names); one that does not is refused.
    required: the strict pack mode requires it of the packs (a compile, a timing); else it is answered anyway.
    shared: the processes of a job share it (a compile, a decision).
    alike: every process of a job must hold the same one (a decision): the first published replaces one's own.
    persistent: kept in the disk cache.
    recorded: written for a pack while recording (``JAX_MOSAIC_FFI_PACK_RECORD``) each time it is used.
    memory: how many entries of this kind memory keeps (the oldest used dropped first).
  """

  kind: str
  encode: Callable[[Any], bytes | None]
  decode: Callable[[bytes], Any]
  pack_encode: Callable[[Any], bytes | None] | None = None
  pack_decode: Callable[[bytes], Any] | None = None
  fresh: Callable[[Any], bool] | None = None
  fits: Callable[[Any, Mapping[str, Any]], bool] | None = None
  required: bool = True
  shared: bool = True
  alike: bool = False
  persistent: bool = True
  recorded: bool = True
  memory: int = 512

  def bound(self, **call) -> "Codec":
    """This codec with what one call adds (``decode=`` checking against the call's values): a copy, made without
    `dataclasses.replace`'s checks, as it is made on every lookup of such a kind."""
    copy = object.__new__(Codec)
    copy.__dict__.update(self.__dict__, **call)
    return copy

  def packed(self, value) -> bytes | None:
    """The value as a pack (or a job's store) carries it."""
    return (self.encode if self.pack_encode is None else self.pack_encode)(value)

  def unpacked(self, data: bytes, about: Callable[[], Mapping[str, Any]] | None):
    """A pack's (or a peer's) entry read back and checked as the one ``about`` names, or None where it does not
    apply here; raises ValueError saying why it does not apply."""
    value = (self.decode if self.pack_decode is None else self.pack_decode)(data)
    if value is not None and self.fits is not None and about is not None and not self.fits(value, about()):
      raise ValueError("it is another kernel's entry")
    return value


class Key(NamedTuple):
  """An entry's key where a plain string is not all of it.

  Attributes:
    own: its key in this process's tiers (memory, disk, a job's store).
    packed: its key in a pack (a timing's is the same for every machine of its GPU model).
    targets: the archs a compile was made for, where they are this machine's own by default; with ``retarget``,
      a pack may serve it from the entry made for another target whose images load here (store/targets.py).
    retarget: ``targets -> key``: the same compile's key for other targets.
  """

  own: str
  packed: str
  targets: tuple[Arch, ...] = ()
  retarget: Callable[[tuple[Arch, ...]], str] | None = None


def own(key: str | Key) -> str:
  return key if isinstance(key, str) else key.own


def packed(key: str | Key) -> str:
  return key if isinstance(key, str) else key.packed


@dataclasses.dataclass(frozen=True)
class Found:
  """An entry and where it came from.

  Attributes:
    value: the entry.
    source: the tier that answered now ("memory", "pack", "disk", "peer"), or "made" (``make`` ran here).
    origin: where it came from first, kept with it in memory: "made", "disk", "pack", "peer", or what a caller
      that keeps an entry says of it ("timed", "file").
    own: whether this process (or an earlier one on this machine, through its disk cache) made it: only such an
      entry is written to the disk cache; a pack's, a peer's or a file's never is.
    key: the key the tier found it under, where that is not the lookup's (a pack's entry for another target that
      serves this GPU: store/targets.py), else "".
  """

  value: Any
  source: str
  origin: str
  own: bool
  key: str = ""


@dataclasses.dataclass(frozen=True)
class Unkept:
  """What ``make`` returns for a value that must be kept nowhere (what it read is not known, so a cached one could
  not be checked for staleness); ``why`` for a pack recording's note."""

  value: Any
  why: str = "what the compile read is not known, so it is cached nowhere"


class Ask(NamedTuple):
  """One lookup, as the tiers and the observers see it: its key and codec; ``about``, what the front end says of
  the entry (kernel, front_end, specialization, targets, toolchain), asked only where something names it;
  ``witness``, what the key audit proves a hit against (store/key_audit.py); when it started
  (``time.perf_counter``)."""

  key: str | Key
  codec: Codec
  about: Callable[[], Any] | None
  witness: Any
  started: float


class Observer:
  """Watches what the store served or made, never a branch of it: the counts, the key audit, pack recording, the
  cold-start log. ``vetoes``: it may refuse a tier (`admits`) or an entry (`proves`) for a lookup."""

  vetoes = False

  def watches(self, ask: Ask) -> bool:
    """Whether it watches this lookup (asked once per lookup; a cheap setting's read)."""
    return True

  def admits(self, ask: Ask, tier) -> bool:
    return True

  def proves(self, ask: Ask, found: Found, tier) -> bool:
    return True

  def making(self, ask: Ask):
    """A context around ``make``."""
    return _NOTHING

  def served(self, ask: Ask, found: Found) -> None:
    pass

  def made(self, ask: Ask, found: Found, unkept: str | None) -> None:
    """``found`` was made here; ``unkept``: why it is kept nowhere, or None."""

  def clear(self) -> None:
    """The memory tier was emptied."""


class _Nothing:
  def __enter__(self):
    return None

  def __exit__(self, *exc):
    return False


_NOTHING = _Nothing()
