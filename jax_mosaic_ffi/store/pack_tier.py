"""The kernel packs in use as a tier (store/packs.py holds them): read-only, ahead of the disk cache.

A pack serves an entry by its key, as a compile here would make it; a compile keyed for this machine's own GPU
whose key is not there is also looked up under the targets the packs were recorded for that would serve that GPU
(store/targets.py: its family's target, then older archs whose cubins or, outside the strict mode, PTX it loads),
so a B300 takes the sm_100f entry of a pack with no setting. Under ``JAX_MOSAIC_FFI_PACKS_STRICT=1`` a miss of a
kind the strict mode requires is refused here, before the disk cache, a peer or a compile is asked.
"""

from __future__ import annotations

from jax_mosaic_ffi.base import pack_file
from jax_mosaic_ffi.base import source_location
from jax_mosaic_ffi.store import packs
from jax_mosaic_ffi.store import targets
from jax_mosaic_ffi.store.entries import Found, Key, packed
from jax_mosaic_ffi.store.tiers import Tier


class PackTier(Tier):
  name = "pack"
  read_only = True
  witnessed = True  # an entry keyed as this machine's: the key audit proves it by the witness kept here for its key

  def holds(self, codec):
    return codec.kind in pack_file.KINDS

  def get(self, ask):
    entry = self._entry(ask.key, ask.codec.kind)
    if entry is None:
      return None
    try:
      value = ask.codec.unpacked(entry.payload, ask.about)
    except Exception:  # noqa: BLE001 - an entry that does not apply here (an NVRTC header that differs)
      return None
    return None if value is None else Found(value, "pack", "pack", False, entry.key)

  def refusal(self, ask):
    codec = ask.codec
    if not codec.required or not packs.strict():
      return None
    return packs.missing(packs.with_call_site(ask.about, source_location.current()), self._why(ask))

  def _entry(self, key, kind: str) -> pack_file.Entry | None:
    entry = packs.lookup(packed(key), kind)
    if entry is None and isinstance(key, Key) and key.retarget is not None:
      for other in targets.serving(key.targets):
        entry = packs.lookup(key.retarget(other), kind)
        # Its image must load on this GPU; PTX only outside the strict mode (which forbids JIT-compiling here).
        if entry is not None and packs.loads_on(entry, key.targets[0].number, jit=not packs.strict()):
          return entry
      return None
    return entry

  def _why(self, ask) -> str:
    """Why the packs' entry for the key does not apply here, or "" where they hold none."""
    entry = self._entry(ask.key, ask.codec.kind)
    if entry is None:
      return ""
    try:
      return "" if ask.codec.unpacked(entry.payload, ask.about) is not None else "its entry does not apply here"
    except Exception as e:  # noqa: BLE001 - what the codec says of it
      return f"its entry does not apply here: {e}"
