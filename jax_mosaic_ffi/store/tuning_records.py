"""Autotuning timings, one per config: entries of the store (memory, kernel packs, the disk cache: `CODEC`).

A timing belongs to one config of one call, on one kind of machine. Its key
(`TimingKey`) is the call's name, the config, the config's own kernels and
launch (module hashes, grid, block, scalars...: what `autotune` reads off the
config's jaxpr) and the call signature (shapes and dtypes, or the user's
``key``); its `Environment` is the device name and compute capability, the
CUDA driver, jax_mosaic_ffi and the front ends' toolchains (their releases, as
each front end names them: transforms/tuning_environment.py reads them). Adding a config to a list therefore
times that config alone, and an edited kernel only re-times the configs
that use it: the winner is picked among the stored timings of the current
list (`autotune.py`).

Each timing held says where it came from: measured here ("timed"), read from the disk cache, a pack or a tuning
file, or a peer's (a job's decision's table: store/tuning_share.py). Only those measured here go to the disk cache
and into a tuning file this process saves: a peer's is its own to keep.

The file a cluster ships them in (`save_tuning`, `load_tuning`) is transforms/tuning_files.py's.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import math


from jax_mosaic_ffi.base import disk_cache
from jax_mosaic_ffi.base import module_format
from jax_mosaic_ffi.base import value_key
from jax_mosaic_ffi.base.errors import ValueKeyError
from jax_mosaic_ffi.store import stack
from jax_mosaic_ffi.store.entries import Codec, Key

_RECORD_FORMAT = "tuning-record-1"
_PACK_FORMAT = "pack-tuning-1"
# Bounds on everything read (a file, a disk entry) before it is used.
MAX_RECORDS = 100_000        # in a file, and in memory (oldest dropped first)
MAX_TEXT = 4096              # a name, config, signature or error
MAX_KERNELS = 64             # launches in one config
MAX_US = 1e9                 # a timing of over 1000 s per call is not one
ENV_FIELDS = (("device", "device"), ("compute_capability", "compute capability"),
               ("driver", "CUDA driver"), ("jax_mosaic_ffi", "jax_mosaic_ffi"),
               ("toolchains", "toolchains"))


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
class Record:
  """A timing as the store keeps it: with its environment and key (a tuning file lists them)."""

  environment: Environment
  key: TimingKey
  timing: Timing


def package_version() -> str:
  """This package's release, as a timing's environment names it."""
  try:
    return importlib.metadata.version("jax_mosaic_ffi")
  except importlib.metadata.PackageNotFoundError:
    return "unknown"


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
                        *(getattr(env, field) for field, _ in ENV_FIELDS),
                        key.name, key.config, str(len(key.launches)), *key.launches, key.signature)


def pack_key(device: str, compute_capability: str, key: TimingKey) -> str:
  """A timing's key in a kernel pack: its call and config on a GPU model (name and compute capability). The driver
  and the releases are left out: the config's kernels are in the key (their hashes), and a pack serves its winners
  on whatever driver the machine that loads it has."""
  return disk_cache.key(_PACK_FORMAT, f"format{module_format.FORMAT_VERSION}", device, compute_capability,
                        key.name, key.config, str(len(key.launches)), *key.launches, key.signature)


def pack_payload(timing: Timing) -> bytes:
  return json.dumps({"format": _PACK_FORMAT, "us": timing.us, "error": timing.error}).encode()


def _address(env: Environment, key: TimingKey) -> Key:
  return Key(_record_id(env, key), pack_key(env.device, env.compute_capability, key))


def _codec(env: Environment, key: TimingKey) -> Codec:
  """`CODEC` for one config's timing: its entries read back as its `Record`."""
  def read(data: bytes, decode=_decode_entry) -> Record | None:
    timing = decode(data)
    return None if timing is None else Record(env, key, timing)
  return CODEC.bound(decode=read, pack_decode=lambda data: read(data, _decode_pack_entry))


def lookup(env: Environment, key: TimingKey) -> tuple[Timing, str] | None:
  """The stored timing of this config, and where it came from ("timed", "pack", "disk", "file", "peer"); None if
  none."""
  found = stack.find(_address(env, key), _codec(env, key))
  if found is None:
    return None
  return found.value.timing, "timed" if found.origin == "made" else found.origin


def store(env: Environment, key: TimingKey, timing: Timing) -> None:
  """Keeps a timing this process measured, in memory and in the disk cache."""
  stack.keep(_address(env, key), _codec(env, key), Record(env, key, timing), "timed", own=True)


def keep_peers(env: Environment, key: TimingKey, timing: Timing) -> None:
  """Keeps a timing a peer of the job measured (its decision's table), in memory only: it is the peer's."""
  stack.keep(_address(env, key), _codec(env, key), Record(env, key, timing), "peer", own=False)


def clear_memory() -> None:
  stack.clear_memory((CODEC.kind,))


class Malformed(ValueError):
  """A value read from a file or an entry that is not what we write."""


def checked_text(value, what: str) -> str:
  if not isinstance(value, str):
    raise Malformed(f"{what} is not a string")
  if len(value) > MAX_TEXT:
    raise Malformed(f"{what} is longer than {MAX_TEXT} characters")
  return value


def checked_timing(us, error, where: str) -> Timing:
  if us is not None:
    if isinstance(us, bool) or not isinstance(us, (int, float)) or not (math.isfinite(us) and 0 < us <= MAX_US):
      raise Malformed(f"{where}.us is not null or a number of microseconds in (0, {MAX_US:g}]")
    us = float(us)
  if error is not None:
    error = checked_text(error, f"{where}.error")
  if (us is None) == (error is None):
    raise Malformed(f"{where} needs exactly one of us and error")
  return Timing(us, error)


def _decode_entry(data: bytes, format: str = _RECORD_FORMAT) -> Timing | None:
  """A disk entry of ours; raises on one that is damaged (disk_cache then deletes it)."""
  if len(data) > MAX_TEXT * 2:
    raise Malformed("entry too large")
  entry = json.loads(data)
  if not isinstance(entry, dict) or entry.get("format") != format:
    raise Malformed("not a timing entry")
  return checked_timing(entry.get("us"), entry.get("error"), "entry")


def _decode_pack_entry(data: bytes) -> Timing | None:
  """A pack's timing (verified with its pack), or None for one that does not read as one (never used)."""
  try:
    return _decode_entry(data, _PACK_FORMAT)
  except (ValueError, RecursionError):
    return None


def of_environment(env: Environment) -> list[tuple[TimingKey, Timing]]:
  """The timings this process holds for ``env`` (measured, read from disk, a pack or a file; never a peer's), for a
  tuning file."""
  return [(found.value.key, found.value.timing) for found in stack.MEMORY.entries(CODEC.kind)
          if found.origin != "peer" and found.value.environment == env]


def remember_loaded(env: Environment, records) -> None:
  """Timings read from a tuning file, for ``env``: kept in memory as a file's."""
  for key, timing in records:
    stack.keep(_address(env, key), _codec(env, key), Record(env, key, timing), "file", own=False)


def _encode(record: Record) -> bytes:
  return json.dumps({"format": _RECORD_FORMAT, "us": record.timing.us, "error": record.timing.error}).encode()


# A timing's entries: on disk as this machine's, in packs keyed per GPU model (`pack_key`); measured, never made by
# the store (autotuning times the configs it misses, then keeps them); the strict pack mode's refusal is autotuning's
# (the configs a pack lacks, named at once); never shared alone (a job shares decisions).
CODEC = Codec("tuning", encode=_encode, decode=_decode_entry, pack_decode=_decode_pack_entry, required=False,
              shared=False, recorded=False, memory=MAX_RECORDS)
