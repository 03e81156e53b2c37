"""Registering the C++ handlers with XLA's CUDA plugin.

Importing the package registers the state type and a small bootstrap
target; that is cheap and touches no GPU. The kernel targets are registered
the first time a program with a ``mosaic_kernel`` is lowered for a CUDA
device, or when `register()` is called. A process that only runs a
deserialized ``jax.export`` artifact lowers no ``mosaic_kernel``: for it, the
first program jax lowers at all registers them (a jax.monitoring listener of
jax's "jaxpr to MLIR module" event, which comes after a lowering and before
its compile), once, where jax has CUDA devices. Registering also tells the
runtime where the native libraries that the front ends' images need are
(runtime_libraries.py: e.g. NVIDIA's CuTe DSL runtime library), so a
deserialized call finds its library at its instantiate, which comes later.
Where finding one fails (a damaged optional install), only the kernels that
need it are affected: the targets are registered all the same, and the
failure is kept for those kernels (raised at their lowering, by the runtime
at their instantiate) and in `status()`.

Why a bootstrap: XLA calls a record handler (which lets a kernel join a CUDA
graph as a kernel node) only for bundles registered through the plugin's own
``XLA_FFI_Api``; ``jax.ffi.register_ffi_target`` drops it. So we run one tiny
program whose handler keeps that API and registers a probe target through it.

Why a probe: the record extension's ABI has changed inside jaxlib's patch
releases under an unchanged FFI API version (0.12.1), so neither jaxlib's
version nor the API's proves how to call it. A second tiny program, of the
probe's calls only, is put in a command buffer; the probe's record stage reads
the extension's own (major, minor) and, where the C++ core declares that
layout (``csrc/ffi/record_layouts.h``, an exact list), proves the call by
requesting stream capture through it. Only then are the kernel targets
registered with record handlers. An unknown version fails the probe program
without a call into it, and the targets are registered without record
handlers: XLA captures our stream launches into its graphs instead, correct
and slower per launch, with one `StreamCaptureWarning`. So are they where the
running jaxlib is outside the supported range (jax_mosaic_ffi.base.versions),
the bootstrap refuses the running FFI API version, the bootstrap fails, or
the probe never reached a record stage (command buffers off in this process).
"""

from __future__ import annotations

import os
import threading
import warnings

import jax
import jax.monitoring
import jaxlib
import numpy as np
from jax._src.lib import xla_client

from jax_mosaic_ffi.base import contract
from jax_mosaic_ffi.base import errors
from jax_mosaic_ffi.base import flags
from jax_mosaic_ffi.base import versions
from jax_mosaic_ffi.base.native import core
from jax_mosaic_ffi.call import runtime_libraries

STATE_TYPE_NAME = "jax_mosaic_ffi.CallSite"
RECORD_ENV = flags.RECORD  # set to 0 to use stream capture only

_lock = threading.Lock()
_state = {"done": False, "record": False, "record_extension": None, "record_layout": None,
          "message": "not registered yet"}
# Set where jax has no CUDA device: nothing will ever need registering (jax's backends do not change).
_no_cuda = False
# Why registering failed, once it has: raised again by every later attempt, which is not made. A retry could not
# succeed: jax's backends are fixed for the process, and what was registered before the failure stays registered.
_failure: str | None = None
# Set in the bootstrap's own thread, whose lowering must not register (it is the registration).
_bootstrapping = threading.local()
# Calls in the probe program: more than XLA's smallest command buffer (5 by default), so it gets one.
PROBE_CALLS = 16
# jax's event after a program is lowered to MLIR, before XLA compiles it (jax._src.dispatch, 0.11 and 0.12).
LOWERED_EVENT = "/jax/core/compile/jaxpr_to_mlir_module_duration"


def _record_unsupported_reason() -> str | None:
  """Why the running jaxlib gets no record handlers before any probe, or None when the probe decides.

  Outside the supported range (only with the version check skipped) nothing else of the runtime was checked
  either, and stream capture is the safe choice; inside it, the record extension's own version decides
  (`_probe_record_layout`), never jaxlib's.
  """
  return versions.problem(jax.__version__, jaxlib.__version__, core.BUILT_AGAINST["jaxlib"])


if sorted(core.target_names()) != sorted(contract.ALL_TARGETS):
  raise ImportError(
      f"jax_mosaic_ffi's C++ core serves targets {core.target_names()} but the Python side "
      f"expects {contract.ALL_TARGETS}; the installed extension is stale, reinstall the package")

_RECORD_UNSUPPORTED = _record_unsupported_reason()
jax.ffi.register_ffi_type(STATE_TYPE_NAME, core.state_type(), platform="CUDA")
jax.ffi.register_ffi_target(core.BOOTSTRAP_TARGET, {"execute": core.bootstrap_handler()},
                            platform="CUDA", api_version=1)


def _cuda_devices():
  try:
    return jax.devices("cuda")
  except RuntimeError:
    return []


def _register_without_record(reason: str) -> None:
  graph_targets = set(core.command_buffer_targets())
  for name in contract.ALL_TARGETS:
    traits = (xla_client.CustomCallTargetTraits.COMMAND_BUFFER_COMPATIBLE if name in graph_targets
              else xla_client.CustomCallTargetTraits.DEFAULT)
    jax.ffi.register_ffi_target(name, core.handlers(name), platform="CUDA", api_version=1, traits=traits)
  _state.update(done=True, record=False, message=f"registered without record handlers: {reason}")


def _run_on(device, program) -> None:
  """Runs `program` on `device`, in a thread of its own: the caller may be inside a trace, where the program would
  be staged instead of run."""
  errors_seen = []

  def run():
    _bootstrapping.active = True
    try:
      with jax.default_device(device):
        program()
    except Exception as e:  # reported below, as a fallback reason
      errors_seen.append(e)

  thread = threading.Thread(target=run, name="jax_mosaic_ffi-bootstrap")
  thread.start()
  thread.join()
  if errors_seen:
    raise errors_seen.pop()  # out of the list the thread's frame holds: no cycle through it


def _run_bootstrap(device) -> None:
  call = jax.ffi.ffi_call(core.BOOTSTRAP_TARGET, jax.ShapeDtypeStruct((1,), np.int32))
  _run_on(device, lambda: jax.jit(call)().block_until_ready())


def _run_probe(device) -> None:
  call = jax.ffi.ffi_call(core.RECORD_PROBE_TARGET, jax.ShapeDtypeStruct((1,), np.int32))

  def chain(x):
    for _ in range(PROBE_CALLS):
      x = call(x)
    return x

  _run_on(device, lambda: jax.jit(chain)(np.zeros(1, np.int32)).block_until_ready())


def decide_record_layout(version: tuple[int, int]) -> tuple[str | None, str | None]:
  """The layout the record stage calls for the running record extension's ``(major, minor)``, as the C++ core
  declares it, or None and why (with one `StreamCaptureWarning`): only an exact declared version gets record
  handlers, never one above or below it."""
  layout = core.record_layout_for(*version)
  if layout is not None:
    return layout, None
  reason = (f"jaxlib {jaxlib.__version__}'s command-buffer record extension is {version[0]}.{version[1]}, a version "
            f"whose layout this jax_mosaic_ffi does not declare (it calls only the layouts checked against each "
            f"jaxlib's headers: docs/compatibility.md)")
  warnings.warn(errors.StreamCaptureWarning(
      f"{reason}. Kernels still run and join CUDA graphs, by stream capture: each launch inside a command buffer "
      "becomes a captured child graph instead of a kernel node, without PDL edges to its neighbours (about 1-2 us "
      "more per launch: docs/benchmarks.md). Upgrade jax_mosaic_ffi, or install a jaxlib it supports, to get kernel "
      "nodes back"),
      stacklevel=2)
  return None, reason


def _probe_record_layout(device) -> str | None:
  """Registers the targets with record handlers where the probe proves the record layout (None), else says why."""
  try:
    _run_bootstrap(device)
  except Exception as e:
    return f"the bootstrap program failed: {e}"
  if not core.record_registration()["probe_registered"]:
    return core.record_registration()["message"] or "the bootstrap handler did not run"
  probe_error = None
  try:
    _run_probe(device)
  except Exception as e:  # an unknown layout fails the probe program on purpose; the registration says what it saw
    probe_error = e
  version = core.record_registration()["record_version"]
  if version is None and probe_error is not None:
    return f"the record probe program failed: {probe_error}"
  if version is None:
    return ("the probe program reached no record stage: command buffers are off for custom calls in this "
            "process (XLA_FLAGS), so record handlers would never be called")
  _state["record_extension"] = f"{version[0]}.{version[1]}"
  layout, reason = decide_record_layout(version)
  if layout is None:
    return reason
  if not core.register_record_targets():
    return core.record_registration()["message"]
  _state["record_layout"] = layout
  return None


def register() -> bool:
  """Registers the kernel targets with the CUDA plugin, once per process.

  Rarely needed: the first program jax lowers registers them, also in a process that only deserializes
  and runs a `jax.export` artifact. Calling it does that at once::

    >>> registered = jmf.register()   # False where there is no CUDA backend: nothing needs registering

  Returns:
    True when a CUDA backend exists (and the targets are registered), False when there is none.
    ``jmf.registration.status()`` says whether CUDA-graph record handlers were registered, and why not.

  Raises:
    RuntimeError: registering failed; it fails again, at once and with the same message, at every later call
      and lowering of a kernel in this process.
  """
  global _failure
  if _failure is not None:
    raise RuntimeError(_failure)
  try:
    return _register()
  except Exception as e:
    with _lock:
      if _failure is None:
        _failure = (f"jax_mosaic_ffi could not register its kernel targets with XLA's CUDA plugin: "
                    f"{type(e).__name__}: {e}. No mosaic_kernel can run in this process, and registering is not "
                    "tried again in it: fix the cause, then start a new process")
        _state["message"] = f"not registered: {_failure}"
    raise RuntimeError(_failure) from e


def _register() -> bool:
  global _no_cuda
  # First, and also where jax has no CUDA device: every path that registers (a mosaic_kernel's lowering, the first
  # lowering of any program, jmf.register()) tells the runtime where the libraries are.
  runtime_libraries.publish()
  with _lock:
    if _state["done"]:
      return True
    devices = _cuda_devices()
    if not devices:
      _state["message"] = "not registered: JAX has no CUDA device here"
      _no_cuda = True
      return False
    if _RECORD_UNSUPPORTED is not None:
      _register_without_record(_RECORD_UNSUPPORTED)
      return True
    if os.environ.get(RECORD_ENV, "1") in ("0", "false", "off"):
      _register_without_record(f"{RECORD_ENV}=0")
      return True
    reason = _probe_record_layout(devices[0])
    if reason is None:
      _state.update(done=True, record=True, message=core.record_registration()["message"])
    else:
      _register_without_record(reason)
    return True


def ensure_registered() -> None:
  """Registers the targets before a kernel's lowering, unless done, needless (no CUDA device) or failed before
  (then its error again)."""
  if not _state["done"] and not _no_cuda:
    register()


def _on_lowered(event: str, duration: float, **_) -> None:
  """jax lowered a program and is about to compile it: the first time, make sure a deserialized artifact's
  custom calls find their targets (a no-op once registered, or where there is no CUDA device)."""
  if (event == LOWERED_EVENT and not _state["done"] and not _no_cuda and _failure is None
      and not getattr(_bootstrapping, "active", False)):
    try:
      register()
    except RuntimeError:  # the failure is kept in the status; jax's lowering of a program that may not be ours
      pass                # must not fail here (a kernel's own lowering raises it, ensure_registered)


jax.monitoring.register_event_duration_secs_listener(_on_lowered)


def status() -> dict:
  """How the targets were registered: ``{"done", "record", "record_extension", "record_layout", "message",
  "runtime_libraries"}``.

  ``"record"`` says whether kernels join CUDA graphs as kernel nodes (record handlers), ``"record_extension"`` the
  running record extension's version as the probe read it (``"0.5"`` on jaxlib 0.12.1; None before or without a
  probe), ``"record_layout"`` the declared layout the record stage calls (``"record-0.5"``), or None.

  ``"runtime_libraries"`` holds, by file name, each native library the front ends' images need (e.g.
  ``"libcute_dsl_runtime.so"``, NVIDIA's CuTe DSL runtime library): None, unless finding it failed, and then why
  (only the kernels that need it cannot run)::

    >>> sorted(jmf.registration.status())
    ['done', 'message', 'record', 'record_extension', 'record_layout', 'runtime_libraries']
  """
  return {**_state, "runtime_libraries": runtime_libraries.problems()}
