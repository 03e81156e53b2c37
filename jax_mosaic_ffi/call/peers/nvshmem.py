"""Starting NVSHMEM for kernels that call it: who the PEs are, and the bootstrap.

One NVSHMEM job per ``jax.distributed`` job: every process is one PE (PE = process index), bound to its one
local GPU; without ``jax.distributed`` the process is a job of one PE. The runtime asks for NVSHMEM the first
time it loads a kernel that uses it (csrc/peers/nvshmem_runtime.cc calls `start` from XLA's thread, with
the GIL), so a ``jax.export`` artifact starts it too. The bootstrap is NVSHMEM's unique id: PE 0 makes one
(``nvshmemx_get_uniqueid``) and publishes it in the key-value store ``jax.distributed`` already runs; every PE
first publishes what it is about to start (NVSHMEM release, heap size, job size), waits for every peer's
(a peer that never comes is named after ``JAX_MOSAIC_FFI_PEER_TIMEOUT_S``), and refuses a job whose peers
disagree; then all call ``nvshmemx_init_attr(NVSHMEMX_INIT_WITH_UNIQUEID)``. No MPI, no launcher of ours.
``nvshmem_finalize`` runs at exit.

Keys: ``jax_mosaic_ffi/nvshmem/<attempt>/...``; the attempt counts starts this process began (a start that
failed is not retried with the same keys). Each attempt ends in one verdict (kv_store.py), as the
cross-process exchange's do: a PE that gives up waiting settles it ``abandoned``, so a PE arriving after the
timeout fails that attempt at once instead of waiting for a unique id nobody will publish, and the next start
of every PE meets at the same attempt.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import threading

import jax
from jax._src import distributed  # no public key-value API in jax 0.11/0.12

from jax_mosaic_ffi.base import flags
from jax_mosaic_ffi.base import nvshmem_package
from jax_mosaic_ffi.base.errors import NvshmemUnavailable
from jax_mosaic_ffi.base.native import core
from jax_mosaic_ffi.call.peers import kv_store

_KEY_PREFIX = "jax_mosaic_ffi/nvshmem"
HEAP_ENV = "NVSHMEM_SYMMETRIC_SIZE"  # NVSHMEM's own setting, read by it when it starts
# NVSHMEM's default heap, and the bounds we accept: a heap is reserved on the GPU when NVSHMEM starts.
DEFAULT_HEAP_BYTES = 1 << 30
MIN_HEAP_BYTES = 1 << 20
MAX_HEAP_BYTES = 1 << 40
DEFAULT_TIMEOUT_S = 300.0
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}

_lock = threading.Lock()
_attempts = 0
_installed = False


def heap_bytes() -> int:
  """The symmetric heap NVSHMEM will reserve per PE: ``NVSHMEM_SYMMETRIC_SIZE`` (bytes, or with a K/M/G/T
  suffix as NVSHMEM reads it), checked here so that a typo is our clear error, not NVSHMEM's abort."""
  text = os.environ.get(HEAP_ENV, "").strip()
  if not text:
    return DEFAULT_HEAP_BYTES
  match = re.fullmatch(r"(\d{1,15})\s*([KMGT]?)(?:i?B)?", text, re.IGNORECASE)
  if match is None:
    raise ValueError(f"{HEAP_ENV}={text!r} is not a size: write bytes, or a number with K, M, G or T (e.g. 2G)")
  value = int(match.group(1)) * _UNITS[match.group(2).upper()]
  if not MIN_HEAP_BYTES <= value <= MAX_HEAP_BYTES:
    raise ValueError(f"{HEAP_ENV}={text!r} ({value} bytes) is out of range: the symmetric heap must be between "
                     f"1M and 1T bytes per PE; symmetric buffers of every NVSHMEM call must fit in it")
  return value


def _timeout_s() -> float:
  text = os.environ.get(flags.PEER_TIMEOUT_S, "")
  try:
    value = float(text) if text else DEFAULT_TIMEOUT_S
  except ValueError:
    raise ValueError(f"{flags.PEER_TIMEOUT_S}={text!r} is not a number of seconds") from None
  if not 0 < value <= 86400:
    raise ValueError(f"{flags.PEER_TIMEOUT_S}={text!r} is out of range (0, 86400] seconds")
  return value


def job_layout(device: int) -> tuple[int, int]:
  """(this process's PE, the number of PEs): one PE per process of the jax.distributed job, one GPU each."""
  local = [d for d in jax.local_devices() if d.platform == "gpu"]
  if len(local) != 1:
    raise NvshmemUnavailable(
        f"NVSHMEM runs one PE per process, bound to one GPU, and this process has {len(local)} GPUs in jax. "
        "Start one process per GPU (jax.distributed.initialize(..., local_device_ids=[i]) or CUDA_VISIBLE_DEVICES)")
  if int(local[0].local_hardware_id) != device:
    raise NvshmemUnavailable(f"the NVSHMEM kernel runs on GPU {device}, but this process's jax GPU is "
                             f"GPU {local[0].local_hardware_id}")
  return jax.process_index(), jax.process_count()


def describe(package: nvshmem_package.NvshmemPackage, npes: int) -> str:
  """What every PE must agree on, as it publishes it."""
  return f"nvshmem={'.'.join(map(str, package.version))};heap={heap_bytes()};npes={npes}"


def _agree(client, base: str, pe: int, npes: int, mine: str, timeout_s: float, who: str) -> None:
  """Publishes this PE's description, waits for every peer's and follows the attempt's verdict (kv_store.py);
  then checks that every peer's agrees. Names a peer that never came, one that gave up first, or disagrees."""
  kv_store.set_once(client, f"{base}/joined/{pe}", mine, who)

  def gave_up_first(verdict):
    found = kv_store.abandoned_by(verdict, npes)
    quitter = f"PE {found[0]} (after waiting {found[1]:g} s)" if found else f"a peer (verdict {verdict[:80]!r})"
    return RuntimeError(f"{who}: {quitter} gave up on this NVSHMEM start before PE {pe} joined it; this attempt "
                        "fails on every PE. Running the program again starts NVSHMEM in step "
                        f"({flags.PEER_TIMEOUT_S} sets the timeout)")

  theirs = kv_store.gather(
      client, base, pe, npes, f"{base}/joined/", timeout_s, who, as_bytes=False,
      late=lambda peer: TimeoutError(
          f"{who}: PE {pe} waited {timeout_s:g} s for PE {peer} (process {peer} of the jax.distributed job) to "
          "start NVSHMEM; it never did. Did that process die, or does it not run this program? "
          f"({flags.PEER_TIMEOUT_S} sets the timeout)"),
      unreadable=lambda peer, err: RuntimeError(f"{who}: reading PE {peer}'s NVSHMEM start from the jax.distributed "
                                                f"key-value store failed: {err}"),
      abandoned=gave_up_first)
  for peer, description in sorted(theirs.items()):
    if description != mine:
      raise RuntimeError(f"{who}: PE {peer} starts NVSHMEM with {description[:200]!r} and PE {pe} with {mine!r}; "
                         "every process must have the same NVSHMEM release and NVSHMEM_SYMMETRIC_SIZE")


def bootstrap(client, pe: int, npes: int, mine: str, make_unique_id, timeout_s: float, who: str) -> bytes:
  """One attempt at the start's trade (the next attempt of this process): the peers agree, then PE 0's
  ``make_unique_id()`` reaches every PE. Returns the unique id."""
  global _attempts
  _attempts += 1
  base = f"{_KEY_PREFIX}/{_attempts}"
  _agree(client, base, pe, npes, mine, timeout_s, who)
  if pe == 0:
    try:
      unique_id = bytes(make_unique_id())
    except BaseException:
      with contextlib.suppress(Exception):  # the peers fail at once, not at the timeout
        kv_store.set_once(client, f"{base}/unique_id", b"", who)
      raise
    kv_store.set_once(client, f"{base}/unique_id", unique_id, who)
    return unique_id
  try:
    unique_id = client.blocking_key_value_get_bytes(f"{base}/unique_id", max(1, int(timeout_s * 1000)))
  except Exception as err:  # noqa: BLE001 - jax's error type is private
    raise TimeoutError(f"{who}: PE {pe} got no NVSHMEM unique id from PE 0 (process 0) within "
                       f"{timeout_s:g} s: {err}") from None
  if not unique_id:
    raise RuntimeError(f"{who}: PE 0 (process 0) could not make NVSHMEM's unique id; its error says why")
  return unique_id


def start(device: int, who: str) -> None:
  """Starts this process's PE on local GPU ``device`` (the runtime's starter). Raises with what to fix."""
  with _lock:
    if core.nvshmem_job()["started"]:
      return
    package = nvshmem_package.require(who)
    library = str(package.host_library)
    pe, npes = job_layout(device)
    mine = describe(package, npes)
    if npes == 1:
      unique_id = core.nvshmem_unique_id(library)
    else:
      client = distributed.global_state.client
      if client is None:
        raise NvshmemUnavailable(f"{who}: {npes} processes but no jax.distributed client to bootstrap NVSHMEM")
      unique_id = bootstrap(client, pe, npes, mine, lambda: core.nvshmem_unique_id(library), _timeout_s(), who)
    try:
      core.nvshmem_start(library, unique_id, pe, npes, device)
    except RuntimeError as e:
      raise NvshmemUnavailable(f"{who}: {e}") from None
    atexit.register(core.nvshmem_finalize)


def install() -> None:
  """Hands the runtime `start`. Idempotent; at import of the call layer, so that exported programs find it."""
  global _installed
  if not _installed:
    core.set_nvshmem_starter(start)
    _installed = True


def job() -> dict:
  """The NVSHMEM job of this process: started, pe, npes, device, symmetric bytes and buffers held, modules."""
  return dict(core.nvshmem_job())
