"""Every ``JAX_MOSAIC_FFI_*`` environment switch, declared once.

Each is read where it takes effect (most when a kernel is compiled or a program lowered, so a test or a
user may change them between calls); this module is the list, and how an on/off switch is read (`switch`). Three
are read by the C++ runtime only. `disk_cache` declares its own (it is loaded without the package by a test), and
this list names them.
"""

from __future__ import annotations

import os

from jax_mosaic_ffi.base import disk_cache

# The on-disk compile cache: its folder (``off`` disables it) and its size bound in bytes.
CACHE_DIR = disk_cache.DIR_ENV
CACHE_MAX_BYTES = disk_cache.MAX_BYTES_ENV
# A compile's time bound, in seconds (0: no bound): NVRTC's worker process, Triton's and Gluon's ptxas
# (base/compile_timeout.py reads it).
COMPILE_TIMEOUT_S = "JAX_MOSAIC_FFI_COMPILE_TIMEOUT_S"
# How many compiles run side by side (jmf.compile_ahead's pool, NVRTC's worker processes); default: this process's
# CPUs (base/compile_jobs.py reads it).
COMPILE_JOBS = "JAX_MOSAIC_FFI_COMPILE_JOBS"
# A folder to write each new kernel's PTX, cubin and SASS into.
DUMP_DIR = "JAX_MOSAIC_FFI_DUMP_DIR"
# 1: run the jax.numpy fallbacks instead of the kernels on CUDA, as programs are lowered.
REFERENCE = "JAX_MOSAIC_FFI_REFERENCE"
# first | always (with :raise, e.g. first:raise): compare each kernel call with its fallback inside the program
# (the shadow mode, call/comparison/shadow.py), on a specialization's first execution or on every one; off by default.
VERIFY = "JAX_MOSAIC_FFI_VERIFY"
# 1: fill outputs with 0xFF bytes before each launch, so elements a kernel forgets read as NaN or -1.
POISON_OUTPUTS = "JAX_MOSAIC_FFI_POISON_OUTPUTS"
# 0: no command-buffer record stage (XLA captures the stream launch instead).
RECORD = "JAX_MOSAIC_FFI_RECORD"
# 1: an out-of-range jax only warns at import.
SKIP_VERSION_CHECK = "JAX_MOSAIC_FFI_SKIP_VERSION_CHECK"
# 1: print each autotuning table.
AUTOTUNE_LOG = "JAX_MOSAIC_FFI_AUTOTUNE_LOG"
# 1: time autotuning configs on the CPU too (testing the machinery without a GPU).
AUTOTUNE_ON_CPU = "JAX_MOSAIC_FFI_AUTOTUNE_ON_CPU"
# 1: every compile-cache hit also makes the compiler's input (Triton's TTIR, the CuTe DSL's MLIR; NVRTC: its PTX)
# and raises KeyAuditError where the stored kernel came from another (store/key_audit.py).
KEY_AUDIT = "JAX_MOSAIC_FFI_KEY_AUDIT"
# Kernel packs (store/packs.py): the pack files to serve compiles and autotuning winners from, ahead of the disk
# cache (separated by ':'); 1: a kernel missing from them is an error where it would compile (NotInPacks).
PACKS = "JAX_MOSAIC_FFI_PACKS"
PACKS_STRICT = "JAX_MOSAIC_FFI_PACKS_STRICT"
# A folder to record every compile-cache entry and autotuning decision of this process into, for a pack
# (store/pack_record.py; python -m jax_mosaic_ffi.pack record sets it for the program it runs).
PACK_RECORD = "JAX_MOSAIC_FFI_PACK_RECORD"
# The GPU archs kernels without targets= compile for, in place of the visible GPUs' (sm_90,sm_100): how a machine
# without those GPUs builds what a machine with them would (toolchain/kernel.py).
TARGETS = "JAX_MOSAIC_FFI_TARGETS"
# 0: the processes of a jax.distributed job do not share compiles and autotuning decisions through its key-value
# store (store/job_share.py; on by default where the job has several processes); how long a process waits for
# the peer that claimed one before making it itself (default: the compile bound plus 30 s).
JOB_SHARE = "JAX_MOSAIC_FFI_JOB_SHARE"
JOB_SHARE_WAIT_S = "JAX_MOSAIC_FFI_JOB_SHARE_WAIT_S"
# Seconds between the beats of a claimant's heartbeat; a waiter stops waiting for a claimant silent for ten of them.
JOB_SHARE_HEARTBEAT_S = "JAX_MOSAIC_FFI_JOB_SHARE_HEARTBEAT_S"
# Read by the C++ runtime: seconds to wait for peers in other processes; synchronous launches (debugging).
PEER_TIMEOUT_S = "JAX_MOSAIC_FFI_PEER_TIMEOUT_S"
SYNC_LAUNCHES = "JAX_MOSAIC_FFI_SYNC_LAUNCHES"
# Read by the C++ runtime at each CuTe DSL call's instantiate: which host code (CuTe DSL objects, native x86-64
# code) may run. "any" (the default): every one; "lowered": only kernels this process lowered, so that a
# jax.export artifact or a serialized executable from elsewhere cannot run code in this process.
HOST_CODE = "JAX_MOSAIC_FFI_HOST_CODE"

ALL = (CACHE_DIR, CACHE_MAX_BYTES, COMPILE_TIMEOUT_S, COMPILE_JOBS, DUMP_DIR, REFERENCE, VERIFY, POISON_OUTPUTS,
       RECORD, SKIP_VERSION_CHECK, AUTOTUNE_LOG, AUTOTUNE_ON_CPU, KEY_AUDIT, PACKS, PACKS_STRICT, PACK_RECORD, TARGETS,
       JOB_SHARE, JOB_SHARE_WAIT_S, JOB_SHARE_HEARTBEAT_S, PEER_TIMEOUT_S, SYNC_LAUNCHES, HOST_CODE)

_ON = ("1", "true", "on", "yes")
_OFF = ("0", "false", "off", "no")


def switch(name: str, default: bool, on: str, off: str) -> bool:
  """Whether the on/off setting ``name`` is on (``default`` where unset or empty); any other value is a ValueError
  saying what 1 does (``on``) and what 0 does (``off``)."""
  value = os.environ.get(name, "").strip().lower()
  if not value:
    return default
  if value in _ON:
    return True
  if value in _OFF:
    return False
  raise ValueError(f"{name}={value!r} is neither on nor off: set it to 1 ({on}) or 0 ({off})")
