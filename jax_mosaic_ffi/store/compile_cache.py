"""The compile cache: every compiler's compiles (NVRTC, Triton, the CuTe DSL) and what a compile is decided from
(Triton's specialization of a call), kept and found through the store's one tier stack (store/stack.py: memory, the
kernel packs, the disk cache, the job's peers, then the compile), each under its compiler's key: everything that
changes the binary, hashed.

A compiler room defines its entries' `Codec` once, beside its compile (``kind="compile"``; a Triton specialization
is ``kind="specialization"``, ``required=False, shared=False``: the strict pack mode answers it anyway, and a job
does not share it), and calls ``stack.get_or_make(key, codec, make, about, witness=...)``: ``make`` returns the
module, or `entries.Unkept` for one whose staleness could not be checked later (what the compile read is not
known), which is then kept nowhere. Its compiles are counted here by compiler name (`count_compiles`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from jax_mosaic_ffi.base import source_location
from jax_mosaic_ffi.store import pack_record
from jax_mosaic_ffi.store import packs
from jax_mosaic_ffi.store import stack
from jax_mosaic_ffi.store import stats as store_stats


@dataclasses.dataclass
class CompileStats:
  compiles: dict[str, int] = dataclasses.field(default_factory=dict)  # by compiler, one per target arch
  memory_hits: int = 0      # compiles served by memory
  disk_hits: int = 0        # compiles served by the disk cache
  pack_hits: int = 0        # compiles served by a kernel pack
  audits: int = 0           # compiles served and proven against the compiler's IR (JAX_MOSAIC_FFI_KEY_AUDIT=1)


def stats() -> CompileStats:
  """The compiles' part of the store's counts (store/stats.py)."""
  counts = store_stats.counts()
  compiles = counts.get("compile", {})
  return CompileStats(dict(counts.get("compiles", {})), compiles.get("memory", 0), compiles.get("disk", 0),
                      compiles.get("pack", 0), compiles.get("audits", 0))


def clear_memory_cache() -> None:
  """Empties the compiles (and specializations) kept in memory."""
  stack.clear_memory(("compile", "specialization"))


def count_compiles(compiler: str, n: int) -> None:
  """``n`` compiles run by ``compiler`` (a front end's name for it: "nvrtc", "triton", "cute")."""
  store_stats.count("compiles", compiler, n)


@dataclasses.dataclass(frozen=True)
class Portable:
  """How an entry goes into a pack (and a job's store) and comes out on another machine, where that differs from
  the disk cache's encode / decode (an NVRTC entry names the headers it read by this machine's paths:
  cuda/nvrtc/portable.py): a codec's ``pack_encode`` / ``pack_decode``. ``decode`` raises ValueError saying why an
  entry does not apply here."""

  encode: Callable[[Any], bytes | None]
  decode: Callable[[bytes], Any]


def driver_compiled(about: Callable[[], Mapping[str, Any]], why: str, fix: str) -> None:
  """A kernel the driver compiles where it is loaded (PTX), which no pack can hold: recorded as refused (``pack
  check`` fails on it), and in the strict mode an error saying ``why`` and ``fix``; checked as each is made."""
  if pack_record.on():
    pack_record.unpackable(about, why)
  if packs.strict():
    raise packs.missing(packs.with_call_site(about, source_location.current()), why, doing="JIT-compiling it",
                        fix=fix)
