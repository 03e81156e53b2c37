"""Collective kernels whose peers live in other processes (``jax.distributed``).

The runtime (csrc/cross_process.cc) gives each device of such a clique one
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
"""

from __future__ import annotations

import collections
import socket
import threading
import time

import jax

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
  from jax._src import distributed  # no public key-value API in jax 0.11/0.12
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


def exchange(key: str, rank: int, device_ids, mine: bytes, timeout_s: float, who: str) -> list[bytes]:
  """Publishes ``mine`` as ``rank`` of the clique and returns every rank's value, rank-major.

  Raises TimeoutError naming the peers that did not publish within
  ``timeout_s`` (a process that died or never ran the kernel), and
  RuntimeError for a peer on another host.
  """
  client = _client()
  with _lock:
    generation = _generations[(key, rank)]
    _generations[(key, rank)] += 1
  base = f"{_KEY_PREFIX}/{key}/{generation}"
  host = host_identity()
  client.key_value_set_bytes(f"{base}/{rank}", _pack(host, bytes(mine)))
  if generation >= 2:  # every peer read that one before it published generation - 1
    try:
      client.key_value_delete(f"{_KEY_PREFIX}/{key}/{generation - 2}/{rank}")
    except Exception:  # noqa: BLE001 - tidying only
      pass
  deadline = time.monotonic() + timeout_s
  values: list[bytes] = []
  for r in range(len(device_ids)):
    if r == rank:
      values.append(bytes(mine))
      continue
    remaining_ms = max(1, int((deadline - time.monotonic()) * 1000))
    try:
      value = client.blocking_key_value_get_bytes(f"{base}/{r}", remaining_ms)
    except Exception as err:  # noqa: BLE001 - jax's error type is private
      if "DEADLINE_EXCEEDED" not in str(err) and "timed out" not in str(err):
        raise RuntimeError(f"{who}: reading peer {_peer_name(r, device_ids)}'s workspace from the "
                           f"jax.distributed key-value store failed: {err}") from None
      raise TimeoutError(
          f"{who}: rank {rank} waited {timeout_s:g} s for peer {_peer_name(r, device_ids)} to set up its "
          "collective workspace; it never did. Did that process die, or does it not run this kernel? "
          "(JAX_MOSAIC_FFI_PEER_TIMEOUT_S sets the timeout)") from None
    peer_host, payload = _unpack(value)
    if peer_host != host:
      raise RuntimeError(
          f"{who}: peer {_peer_name(r, device_ids)} runs on host {peer_host.split('/')[0]!r} and rank {rank} "
          f"on {host.split('/')[0]!r}. Collective kernels reach peers in other processes through CUDA IPC, "
          "which needs every peer on one host (one NVLink or PCIe domain); cliques across hosts are not "
          "supported (docs/collectives.md has the multi-node plan)")
    values.append(payload)
  return values


def install() -> None:
  """Tells the runtime which local GPU is which global device and hands it `exchange`. Idempotent."""
  global _installed
  if _installed:
    return
  from jax_mosaic_ffi import _core
  pairs = []
  for d in jax.local_devices():
    if d.platform == "gpu":
      pairs.append((int(d.local_hardware_id), int(d.id)))
  _core.set_process_devices(pairs)
  _core.set_peer_exchange(exchange)
  _installed = True


def stats() -> dict:
  """Live cross-process workspaces and peer mappings in this process (tests check for leaks)."""
  from jax_mosaic_ffi import _core
  return dict(_core.cross_process_stats())

