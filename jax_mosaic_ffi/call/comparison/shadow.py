"""The shadow mode: each kernel call compared with its fallback inside the user's own program.

On (``JAX_MOSAIC_FFI_VERIFY=first`` or ``always``, or inside ``jmf.verify(...)``, read when a program is lowered),
the CUDA lowering of a kernel call that has a fallback emits, after the kernel's custom call, the fallback on the
same operands, the comparison of each output (`numerics.summarize`: a few numbers), and a host callback
(``jax.debug.callback``) that hands those numbers to Python, where a mismatch warns or raises with a `CheckReport`.
The kernel's own results go on to the rest of the program untouched.

``always`` checks every execution. ``first`` checks each specialization (kernel, call site, launch, shapes) once:

* a program lowered after its specialization was checked gets no check at all: its lowering is the plain one;
* a program lowered before (the usual case: one jitted step, run many times) carries the check behind a gate, a
  ``lax.cond`` on a host callback (``io_callback``) that says yes once per specialization; later executions pay
  that callback and the conditional, not the fallback. (Not a collective kernel's: its fallback talks to its
  peers, so every device must run it, and its check runs in every execution of such a program.)

Off, nothing here runs: the lowering and the launch path are those of a program without it. The fallback runs under
``jax.default_matmul_precision("highest")`` (a float32 matmul fallback in TF32 would differ from any float32
kernel). Not checked: calls without a fallback (one warning per call site), programs lowered for several platforms or
for ``jax.export`` (a host callback cannot be exported), programs lowered for a platform this process has no device
of, and kernels that XLA's partitioner lowers per shard in a module of its own (``sharding=`` across devices), whose
host callbacks would be dropped.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import dataclasses
import functools
import hashlib
import os
import threading
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import sharding_impls
from jax._src.interpreters import mlir
from jax.experimental import io_callback

from jax_mosaic_ffi.base import flags
from jax_mosaic_ffi.base import source_location
from jax_mosaic_ffi.base.errors import (ReferenceMismatch, ReferenceMismatchWarning, UncheckedKernelWarning,
                                        how_to_give_fallback, who)
from jax_mosaic_ffi.call.comparison import check_report
from jax_mosaic_ffi.call.comparison import numerics

MODES = ("off", "first", "always")
ACTIONS = ("warn", "raise", "ignore")
# How many specializations a verification remembers as checked, and how many rows it keeps: bounded, as every cache.
_MAX_CHECKED = 1 << 16
_MAX_ROWS = 4096
# The module custom_partitioning lowers a partitioned function into (jax/_src/custom_partitioning.py): its host
# callbacks are dropped, so a check inside it could not report.
_PARTITIONED_MODULE = "tmp_xla_computation"


class Verification:
  """A shadow-mode setting and what it found: what `verify` returns (see there)."""

  def __init__(self, mode: str = "first", on_mismatch: str = "warn", *, label: str | None = None,
               quiet: bool = False, tolerance: Callable | None = None):
    if mode not in MODES:
      raise ValueError(f"jmf.verify: mode must be one of {', '.join(MODES)}, got {mode!r}")
    if on_mismatch not in ACTIONS:
      raise ValueError(f"jmf.verify: on_mismatch must be one of {', '.join(ACTIONS)}, got {on_mismatch!r}")
    # label: what the rows' "what" adds (jmf.check's program); quiet: no warning for calls without a fallback;
    # tolerance: dtype -> (rtol, atol), jmf.check's own (its tolerances=, rtol=, atol=), else the default table.
    self.mode, self.on_mismatch, self.label, self.quiet = mode, on_mismatch, label, quiet
    self.tolerance = tolerance or numerics.tolerance
    self._lock = threading.Lock()
    self._rows: collections.deque = collections.deque(maxlen=_MAX_ROWS)
    self._checked: collections.OrderedDict[str, bool] = collections.OrderedDict()
    self._warned: set[str] = set()
    # What the report's status needs beyond its rows: the kernel calls lowered as kernels, and those whose fallback
    # was lowered in their place (with why), by call; bounded as the rows are.
    self._ran: set[str] = set()
    self._stood_in: dict[str, str] = {}
    self._tokens: list[contextvars.Token] = []

  def __enter__(self) -> "Verification":
    self._tokens.append(_active.set(self))
    return self

  def __exit__(self, *exc) -> None:
    _active.reset(self._tokens.pop())

  def __repr__(self) -> str:
    return f"jmf.verify({self.mode!r}, on_mismatch={self.on_mismatch!r})"

  @property
  def report(self) -> check_report.CheckReport:
    """Every comparison this setting made so far (the latest few thousand), as a `CheckReport`: its status is
    ``"not checked"`` while no kernel call was compared (no kernel ran, or none reported yet), saying why."""
    with self._lock:
      rows = tuple(self._rows)
      ran, stood_in = set(self._ran), dict(self._stood_in)
    return check_report.CheckReport(rows, not_checked=None if any(r.skipped is None for r in rows) else
                                    unchecked_reason(ran, stood_in))

  @property
  def kernels_ran(self) -> bool:
    """Whether a kernel call was lowered as the kernel itself (not its fallback) under this setting."""
    with self._lock:
      return bool(self._ran)

  @property
  def stood_in(self) -> dict[str, str]:
    """The kernel calls whose fallback was lowered in their place under this setting: {call: why}."""
    with self._lock:
      return dict(self._stood_in)

  def note(self, where: str, stood_in: str | None = None) -> None:
    """At lowering: the call ``where`` is lowered as its kernel, or (``stood_in``: why) as its fallback."""
    with self._lock:
      if stood_in is None:
        if len(self._ran) < _MAX_ROWS:
          self._ran.add(where)
      elif len(self._stood_in) < _MAX_ROWS:
        self._stood_in.setdefault(where, stood_in)

  def wants(self, key: str) -> bool:
    """At lowering: does this specialization get a check?"""
    with self._lock:
      return self.mode == "always" or key not in self._checked

  def _mark(self, key: str) -> bool:
    """Marks a specialization checked (the oldest forgotten past the bound); whether it was not yet. Lock held."""
    first = key not in self._checked
    self._checked[key] = True
    self._checked.move_to_end(key)
    while len(self._checked) > _MAX_CHECKED:
      self._checked.popitem(last=False)
    return first

  def claim(self, key: str):
    """The gate, at run time: True for the first execution of a specialization, False after."""
    with self._lock:
      return np.bool_(self._mark(key))

  def receive(self, site: "_Site", *summaries) -> None:
    """The host callback: the comparison's numbers -> rows; a mismatch warns or raises."""
    what = "kernel vs fallback" + (f" ({self.label})" if self.label else "")
    rows = tuple(check_report.compared(what, site.case, f"out{k}", site.who, shape, dtype, rtol, atol,
                                       summaries[numerics.SUMMARY_SIZE * k:numerics.SUMMARY_SIZE * (k + 1)])
                 for k, (shape, dtype, rtol, atol) in enumerate(site.outputs))
    with self._lock:
      self._mark(site.key)
      self._rows.extend(rows)
      first_warning = site.key not in self._warned
      if any(r.failed for r in rows):
        self._warned.add(site.key)
    if not any(r.failed for r in rows):
      return
    report = check_report.CheckReport(rows)
    if self.on_mismatch == "raise":
      raise ReferenceMismatch(report)
    if self.on_mismatch == "warn" and first_warning:
      # From a host callback, where no frame of the user's is on the stack: at the kernel call's own line.
      source_location.warn_at(ReferenceMismatchWarning(report), ReferenceMismatchWarning, site.call_site)


def unchecked_reason(ran: set[str], stood_in: dict[str, str]) -> str:
  """Why a verification compared no kernel call: no kernel ran (each fallback stood in), or none reported."""
  if stood_in and not ran:
    calls = sorted(stood_in)
    shown = ", ".join(calls[:3]) + (f" and {len(calls) - 3} more" if len(calls) > 3 else "")
    return f"no kernel ran: {'; '.join(sorted(set(stood_in.values())))} ({shown})"
  if not ran:
    return "no kernel call was lowered under this setting (a program compiled before it keeps what it had)"
  return ("no kernel call was compared: calls without a fallback, programs lowered for jax.export or several "
          "platforms and kernels partitioned across devices are not checked, and a program reports when it runs")


_active: contextvars.ContextVar[Verification | None] = contextvars.ContextVar("jmf_verify", default=None)
_suspended: contextvars.ContextVar[bool] = contextvars.ContextVar("jmf_verify_suspended", default=False)
_from_environment: dict[str, Verification] = {}
_unchecked_sites: set[str] = set()


def verify(mode: str = "first", *, on_mismatch: str = "warn", tolerances=None, rtol: float | None = None,
           atol: float | None = None) -> Verification:
  """The shadow mode: inside the ``with`` block, each kernel call is compared with its fallback in the program itself.

  Programs lowered inside the block (a function jitted there, or first called there) run each kernel and, on the
  same operands, its ``fallback``, compare every output with the tolerances of `check` and hand the result to
  Python through a host callback: a mismatch warns (`ReferenceMismatchWarning`, once per kernel specialization, at
  the line that calls the kernel), raises (`ReferenceMismatch`; XLA fails the execution with its message) or is
  only kept in ``report``. The kernels' results go on to the program unchanged. ``JAX_MOSAIC_FFI_VERIFY=first``
  (``always``, ``first:raise``, ...) does the same for the whole process; ``jmf.verify("off")`` turns it off in a
  block::

    >>> kernel = jmf.cuda_kernel('extern "C" __global__ void twice(const float* x, float* y, int n) {'
    ...                          '  int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = 2 * x[i]; }',
    ...                          "twice")
    >>> twice = jmf.mosaic_kernel(kernel, lambda x: x, grid=lambda x: jmf.cdiv(x.size, 256), block=256,
    ...                           scalars=lambda x: (np.int32(x.size),), fallback=lambda x: 2 * x)
    >>> with jmf.verify("always") as seen:     # on a GPU: the kernel, then its fallback, compared in the program
    ...   y = jax.jit(twice)(jnp.ones(1000)).block_until_ready()
    >>> seen.report.failures, seen.report.status in ("passed", "not checked")   # "passed" on a GPU
    ([], True)

  Without a GPU the fallback runs in the kernel's place, and ``seen.report`` says so: its status is ``"not
  checked"`` and its summary ``"not checked: no kernel ran: the program ran on cpu, ..."``.

  Programs compiled before the block keep what they had (``jax.clear_caches()`` drops them). What it costs
  (:doc:`checking kernels </guides/checking>` has the measurements): ``"always"`` runs each fallback and a host
  callback (which waits for the GPU) in every execution; ``"first"`` runs them in the first execution of each
  specialization only, and later executions of a program lowered before that first check pay one host callback and
  a conditional per kernel call (programs lowered after it pay nothing).

  Args:
    mode: ``"first"``: each specialization (kernel, call site, launch, shapes) once; ``"always"``: every execution;
      ``"off"``.
    on_mismatch: ``"warn"``, ``"raise"`` or ``"ignore"`` (only kept in ``report``).
    tolerances, rtol, atol: as `check`'s: ``{dtype: (rtol, atol)}``, or one ``rtol`` / ``atol`` for every
      floating-point dtype, in place of the table's (``JAX_MOSAIC_FFI_VERIFY`` uses the table). An element passes
      when ``|got - want| <= atol + rtol * |want|``: a kernel that accumulates (a GEMM, a reduction) needs an
      ``atol`` of its sums' rounding, ``jmf.verify("first", atol=1e-3)`` for a float32 GEMM of K = 1024.

  Returns:
    A context manager whose ``report`` (a `CheckReport`) holds every comparison made under it, kept as the
    executions report them (also after the block, for programs lowered in it); its status is ``"not checked"``
    until a kernel call was compared.
  """
  return Verification(mode, on_mismatch, tolerance=numerics.lookup("jmf.verify", tolerances, rtol, atol))


@dataclasses.dataclass(frozen=True, eq=False)
class _Site:
  """What the host callback needs to know about the call it reports on."""

  key: str
  who: str
  call_site: str
  case: str
  outputs: tuple[tuple[tuple[int, ...], Any, float, float], ...]  # shape, dtype, rtol, atol


def setting(value: str | None) -> tuple[str, str] | None:
  """A value of JAX_MOSAIC_FFI_VERIFY -> ``(mode, on_mismatch)``, None when off; anything else is a ValueError
  listing what it takes."""
  value = (value or "").strip().lower()
  if value in ("", "0", "off"):
    return None
  mode, _, action = value.partition(":")
  if mode not in MODES[1:] or action not in ("", *ACTIONS):
    raise ValueError(f"{flags.VERIFY}={value!r} is not a setting of the shadow mode: use first or always, "
                     f"optionally with :{', :'.join(ACTIONS)} (first:raise; the default is warn), or off, 0 or "
                     f"unset for none; docs/guides/checking.md has what each does")
  return mode, action or "warn"


def environment() -> Verification | None:
  """JAX_MOSAIC_FFI_VERIFY, read when a program is lowered: one Verification per value, for the process."""
  value = os.environ.get(flags.VERIFY, "").strip().lower()
  parsed = setting(value)
  if parsed is None:
    return None
  if value not in _from_environment:
    _from_environment[value] = Verification(*parsed)
  return _from_environment[value]


def active() -> Verification | None:
  """The verification a lowering now applies: jmf.verify's block, else the environment's; None when off."""
  if _suspended.get():
    return None
  verification = _active.get() or environment()
  return None if verification is None or verification.mode == "off" else verification


@contextlib.contextmanager
def suspended():
  """No shadow checks for programs lowered inside (the autotuner's timed programs)."""
  token = _suspended.set(True)
  try:
    yield
  finally:
    _suspended.reset(token)


def _specialization(kernel, spec, avals_in) -> str:
  """A kernel specialization: its code, call site, launch and operand shapes."""
  text = repr((kernel.name, spec.call_site, sorted(spec.identity().items()), [str(a) for a in avals_in]))
  return hashlib.sha256(kernel.hash + text.encode()).hexdigest()


def stood_in(kernel, spec, why: str) -> None:
  """At lowering, where a kernel call's fallback is lowered in its place: the active verification notes it, so that
  its report says no kernel ran rather than that nothing differed."""
  verification = active()
  if verification is not None:
    verification.note(who(kernel, spec.call_site), why)


def _can_call_back(ctx) -> bool:
  """Whether a host callback lowered here reaches Python when the program runs."""
  module = ctx.module_context
  if len(module.platforms) != 1 or module.lowering_parameters.for_export:
    return False
  if ir_name(module) == _PARTITIONED_MODULE:
    return False
  try:
    module.get_backend()  # lowered for a platform this process has no device of: never runs here
  except (ValueError, RuntimeError):
    return False
  return True


def ir_name(module_context) -> str | None:
  attributes = module_context.module.operation.attributes
  return str(attributes["sym_name"]).strip('"') if "sym_name" in attributes else None


def _gate_supported(ctx) -> bool:
  """io_callback needs every mesh axis manual inside shard_map (jax's rule for callbacks with results)."""
  context = ctx.module_context.axis_context
  if isinstance(context, sharding_impls.SPMDAxisContext):
    return context.manual_axes == frozenset(context.mesh.axis_names)
  return True


def lower(ctx, operands, results, kernel, spec, verification: Verification) -> None:
  """Emits the check of one kernel call after its custom call: the fallback on ``operands``, each returned output
  of ``results`` compared with it, the comparison handed to ``verification`` by a host callback (behind a gate in
  ``first`` mode). Emits nothing where the check could not run or report (the module's docstring says where)."""
  where = who(kernel, spec.call_site)
  verification.note(where)
  if spec.fallback is None:
    if not verification.quiet and where not in _unchecked_sites:
      _unchecked_sites.add(where)
      source_location.warn_at(f"the shadow mode ({verification!r}) is on, but {where} has no fallback, so it "
                              f"runs unchecked; give {how_to_give_fallback(spec.call_site, short=True)} "
                              "to compare it with a jax.numpy reference", UncheckedKernelWarning, spec.call_site)
    return
  if not _can_call_back(ctx):
    return
  key = _specialization(kernel, spec, ctx.avals_in)
  if not verification.wants(key):
    return
  returned = len(results) - spec.num_scratch  # scratch buffers are not compared: the fallback's are zeros
  if spec.fallback.compared is not None:
    returned = min(returned, spec.fallback.compared)
  outputs = tuple((tuple(a.shape), a.dtype, *verification.tolerance(a.dtype)) for a in ctx.avals_out[:returned])
  site = _Site(key, where, spec.call_site, check_report.describe_avals(ctx.avals_in), outputs)
  # A collective kernel's fallback talks to its peers: every device must take the same branch, and the gate says
  # yes on one device only. Its check is not gated (it runs in every execution of a program lowered before it).
  gated = verification.mode == "first" and spec.collective is None and _gate_supported(ctx)
  check = functools.partial(_check, fallback=spec.fallback, num_inputs=len(operands), site=site,
                            verification=verification, gated=gated)
  sub = ctx.replace(avals_in=[*ctx.avals_in, *ctx.avals_out[:returned]], avals_out=[], tokens_out=None)
  with jax.default_matmul_precision("highest"):
    mlir.lower_fun(check, multiple_results=True)(sub, *operands, *results[:returned])


def _check(*args, fallback, num_inputs: int, site: _Site, verification: Verification, gated: bool) -> list:
  inputs, outputs = args[:num_inputs], args[num_inputs:]

  def compare():
    references = fallback.flat(*inputs)[:len(outputs)]
    numbers = []
    for got, want, (_, _, rtol, atol) in zip(outputs, references, site.outputs):
      numbers += numerics.summarize(got, want, rtol, atol)
    jax.debug.callback(functools.partial(verification.receive, site), *numbers)

  if gated:
    first = io_callback(functools.partial(verification.claim, site.key), jax.ShapeDtypeStruct((), jnp.bool_),
                        ordered=False)
    jax.lax.cond(first, compare, lambda: None)
  else:
    compare()
  return []


# A bad value is refused when the package is imported, not at the first kernel a program lowers.
setting(os.environ.get(flags.VERIFY))
