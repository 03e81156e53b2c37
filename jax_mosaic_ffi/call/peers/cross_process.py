"""Collective kernels whose peers live in other processes (``jax.distributed``).

The runtime (csrc/peers/cross_process.cc) gives each device of such a clique one
symmetric workspace (barrier flags, metadata, a slot per symmetric
parameter) from ``cuMemAlloc``, which CUDA IPC can share: XLA's own buffers
come from the virtual-memory API and cannot be. Once per workspace, the
peers trade what they need to map each other's workspace (the IPC handle,
the name of a small host-shared flag page) through the key-value store that
``jax.distributed`` already runs. This module is that trade, called by the
runtime from XLA's thread (it takes the GIL; jax releases it while it runs
executables, as it must for its own host callbacks).

Keys: ``jax_mosaic_ffi/<call site>/<clique>/<generation>/<rank>``. The
generation counts the workspaces this process made for that call site and
clique; processes of one SPMD program make them in the same order, so the
counts agree. Each value starts with the host's identity: peers on other
hosts are refused, since CUDA IPC needs one host.

A rank that times out abandons the exchange, and a late peer must not go on
with deposits from it (the workspaces they name are gone, or soon will be).
So every exchange ends in one verdict (kv_store.py): ``go`` from a rank that
read every deposit, or ``abandoned`` from one that gave up. Every rank follows
the verdict, so either all use the exchange or none does, and the next
attempt (the next generation) starts in step.
"""

from __future__ import annotations

import collections
import socket
import threading

import jax
from jax._src import distributed  # no public key-value API in jax 0.11/0.12

from jax_mosaic_ffi.base.native import core
from jax_mosaic_ffi.call.peers import kv_store

_KEY_PREFIX = "jax_mosaic_ffi"
_lock = threading.Lock()
_generations: collections.Counter = collections.Counter()
_installed = False


def host_identity() -> str:
  """This machine: its host name and boot id (two containers may share a name)."""
  try:
    with open("/proc/sys/kernel/random/boot_id") as f:
      boot = f.read().strip()
  except OSError:
    boot = "?"
  return f"{socket.gethostname()}/{boot}"


def _client():
  client = distributed.global_state.client
  if client is None:
    raise RuntimeError("jax.distributed is not initialized: a clique across processes needs its key-value store")
  return client


def _process_of(device_id: int) -> int | None:
  for d in jax.devices():
    if d.id == device_id:
      return d.process_index
  return None


def _peer_name(rank: int, device_ids) -> str:
  device = int(device_ids[rank])
  return f"rank {rank} (device {device}, process {_process_of(device)})"


def _pack(host: str, payload: bytes) -> bytes:
  encoded = host.encode()
  return len(encoded).to_bytes(2, "little") + encoded + payload


def _unpack(value: bytes) -> tuple[str, bytes]:
  n = int.from_bytes(value[:2], "little")
  return value[2:2 + n].decode(errors="replace"), value[2 + n:]


def _abandoned_by(verdict: str, device_ids) -> str:
  """Who gave up, from a peer's verdict ``abandoned/<rank>/<seconds>``."""
  found = kv_store.abandoned_by(verdict, len(device_ids))
  if found is None:
    return f"a peer (verdict {verdict[:80]!r})"
  return f"peer {_peer_name(found[0], device_ids)} (after waiting {found[1]:g} s)"


def exchange(key: str, rank: int, device_ids, mine: bytes, timeout_s: float, who: str) -> list[bytes]:
  """Publishes ``mine`` as ``rank`` of the clique and returns every rank's value, rank-major.

  Raises TimeoutError naming the peers that did not publish within
  ``timeout_s`` (a process that died or never ran the kernel), RuntimeError
  when a peer gave up on this exchange before this rank joined it, and
  RuntimeError for a peer on another host.
  """
  client = _client()
  with _lock:
    generation = _generations[(key, rank)]
    _generations[(key, rank)] += 1
  base = f"{_KEY_PREFIX}/{key}/{generation}"
  host = host_identity()
  kv_store.set_once(client, f"{base}/{rank}", _pack(host, bytes(mine)), who)
  if generation >= 2:  # every peer read it before it published generation - 1, or no peer uses it (abandoned)
    try:
      client.key_value_delete(f"{_KEY_PREFIX}/{key}/{generation - 2}/{rank}")
    except Exception:  # noqa: BLE001 - tidying only
      pass
  got = kv_store.gather(
      client, base, rank, len(device_ids), f"{base}/", timeout_s, who, as_bytes=True,
      late=lambda r: TimeoutError(
          f"{who}: rank {rank} waited {timeout_s:g} s for peer {_peer_name(r, device_ids)} to set up its "
          "collective workspace; it never did. Did that process die, or does it not run this kernel? "
          "(JAX_MOSAIC_FFI_PEER_TIMEOUT_S sets the timeout)"),
      unreadable=lambda r, err: RuntimeError(f"{who}: reading peer {_peer_name(r, device_ids)}'s workspace from the "
                                             f"jax.distributed key-value store failed: {err}"),
      abandoned=lambda verdict: RuntimeError(
          f"{who}: {_abandoned_by(verdict, device_ids)} gave up on this collective workspace exchange before "
          f"rank {rank} joined it; its deposits are not used, and this attempt fails on every rank. Running the "
          "call again starts a new exchange (JAX_MOSAIC_FFI_PEER_TIMEOUT_S sets the timeout)"))
  values = [_pack(host, bytes(mine)) if r == rank else got[r] for r in range(len(device_ids))]
  payloads = []
  for r, value in enumerate(values):
    peer_host, payload = _unpack(value)
    if peer_host != host:
      raise RuntimeError(
          f"{who}: peer {_peer_name(r, device_ids)} runs on host {peer_host.split('/')[0]!r} and rank {rank} "
          f"on {host.split('/')[0]!r}. Collective kernels reach peers in other processes through CUDA IPC, "
          "which needs every peer on one host (one NVLink or PCIe domain); cliques across hosts are not "
          "supported (docs/collectives.md has the multi-node plan)")
    payloads.append(payload)
  return payloads


def install() -> None:
  """Tells the runtime which local GPU is which global device and hands it `exchange`. Idempotent."""
  global _installed
  if _installed:
    return
  pairs = []
  for d in jax.local_devices():
    if d.platform == "gpu":
      pairs.append((int(d.local_hardware_id), int(d.id)))
  core.set_process_devices(pairs)
  core.set_peer_exchange(exchange)
  _installed = True


def stats() -> dict:
  """Live cross-process workspaces and peer mappings in this process (tests check for leaks)."""
  return dict(core.cross_process_stats())

