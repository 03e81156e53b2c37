"""The errors a user sees, in one place, and how a message names a kernel call.

Every layer raises them, so they live at the bottom: a module needing `LaunchError` does not import the
launch machinery for it.
"""

from __future__ import annotations

import re


class LaunchError(ValueError):
  """A `mosaic_kernel` call that cannot launch as written.

  A dtype or width that does not match the kernel's parameter, an option out of range, a value the runtime
  refuses: the message names the call site, the kernel and what to change (:doc:`errors </guides/errors>`
  shows each). Fixed values are checked when the call is made, callables of the avals when it is traced::

    >>> kernel = jmf.cuda_kernel('extern "C" __global__ void fill(float* y, int n) {}', "fill")
    >>> try:
    ...   jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct((8,), jnp.float32), grid=1, block=8, scalars=(8,))
    ... except jmf.LaunchError as e:
    ...   print(e)
    mosaic_kernel 'fill' at ...: scalars[0] is a Python int, ...; pass np.int32(...) or np.int64(...)
  """


class CompileError(RuntimeError):
  """A compiler (NVRTC, Triton or the CuTe DSL) refused a kernel's source.

  The message names the kernel and the line that called the compile, and carries the compiler's log, the
  source lines the log names (as lines of your file, where the source is a literal in it or was read from a
  file beside it) and, for habits of nvcc code that NVRTC does not share, one line of advice::

    >>> try:
    ...   jmf.cuda_kernel('extern "C" __global__ void broken(float* y) { y[0] = undefined; }', "broken")
    ... except jmf.CompileError as e:
    ...   print(str(e).splitlines()[0])
    NVRTC could not compile kernel 'broken' (called at ...):

  Attributes:
    kernel: the kernel's name.
    log: the compiler's whole log.
    compiler: the compiler that refused it: ``"NVRTC"``, ``"Triton"`` or ``"CuTe DSL"``.

  The compilers construct it: ``advice`` is what the caller knows about the log; ``message``, when the
  caller knows the mistake exactly (a misspelt kernel name), replaces the log in the message; ``what``
  says what was compiled (default: "kernel '<kernel>'"), e.g. with the config it was compiled with and the
  line that called the compile; ``excerpts``, the lines of "source lines named above" where the compiler
  worked them out (the user's file and line of each position the log names), else those of ``filename(N)``.
  """

  def __init__(self, kernel: str, log: str, source: str, filename: str, advice: str | None = None,
               message: str | None = None, compiler: str = "NVRTC", what: str | None = None,
               excerpts: list[str] | None = None):
    self.kernel = kernel
    self.log = log
    self.compiler = compiler
    if message is not None:
      super().__init__(message)
      return
    if excerpts is None:
      lines = source.splitlines()
      excerpts = []
      for line_no in sorted({int(n) for n in re.findall(rf"{re.escape(filename)}\((\d+)\)", log)})[:5]:
        if 1 <= line_no <= len(lines):
          excerpts.append(f"  {line_no:5d} | {lines[line_no - 1]}")
    message = f"{compiler} could not compile {what or f"kernel '{kernel}'"}:\n{log.rstrip()}"
    if excerpts:
      message += "\n\nsource lines named above:\n" + "\n".join(excerpts)
    if advice:
      message += f"\n\nadvice: {advice}"
    super().__init__(message)


class CompileTimeout(CompileError):
  """A compile that ran past ``JAX_MOSAIC_FFI_COMPILE_TIMEOUT_S`` seconds (default 300) and was stopped.

  NVRTC's worker process is killed, and so is the child process a Triton, Gluon or CuTe DSL compile runs in, with
  the ptxas it started, whatever stage it was in. The message names the kernel, its constexprs and target, the
  stage (Triton's frontend, ``ttgir``, ``cubin`` (ptxas), ...) and what to change: smaller blocks, less unrolling,
  or a higher bound (``0``: none). A `CompileError`, so autotuning skips the config as any that fails to
  compile::

    try:
      kernel = jmf.triton_kernel(fn, constexprs={"BLOCK": 65536}, num_warps=1, signature=...)
    except jmf.CompileTimeout as e:
      print(e.kernel, e.compiler)   # "fn Triton"
  """


class AutotuneError(RuntimeError):
  """No config of an autotuned call could be compiled and run.

  Raised by `autotune` (and ``mosaic_kernel(..., configs=...)``) when every config failed to compile, lower
  or launch; the message lists each config with its error (:doc:`autotuning </guides/autotuning>`). A
  config that fails while others work is only skipped and reported.
  """


class NvshmemUnavailable(ImportError):
  """NVSHMEM is not installed (or not a supported release), or could not be started.

  Raised when a kernel that calls NVSHMEM is compiled without it (``pip install 'jax_mosaic_ffi[nvshmem]'``
  installs a supported release), or when NVSHMEM fails to start at the first launch
  (:doc:`collectives and NVSHMEM </guides/collectives>`).
  """


class ReferenceMismatch(AssertionError):
  """A kernel (or a function of kernels, or a derivative rule) does not match its reference.

  Raised by `check` with ``raise_on_mismatch=True``, by `testing.assert_matches_reference`, and by the shadow
  mode with ``on_mismatch="raise"`` (`verify`, ``JAX_MOSAIC_FFI_VERIFY=first:raise``; XLA then fails the execution
  with this message). An ``AssertionError``, as numpy's and pytest's failed checks are. The message is the
  report's table; ``report`` is the `CheckReport` itself::

    >>> try:
    ...   jmf.check(lambda x: x + 1, jnp.ones(4), reference=lambda x: x + 2, shapes=None, raise_on_mismatch=True)
    ... except jmf.ReferenceMismatch as e:
    ...   print(e.report.failures[0].describe())
    outputs, out (float32[4]) for inputs (float32[4]): 4 of 4 elements differ beyond rtol=1e-05, atol=1e-05; worst ...

  Attributes:
    report: the `CheckReport`; ``report.failures`` are the comparisons that failed.
  """

  def __init__(self, report):
    self.report = report
    super().__init__(f"{report.summary()}\n\n{report}")


class ReferenceMismatchWarning(UserWarning):
  """The shadow mode's warning (`verify`, ``JAX_MOSAIC_FFI_VERIFY``): a kernel call differs from its fallback.

  Given once per kernel specialization, at the line that calls the kernel (the comparison reports from a host
  callback, where no line of yours is on the stack); ``warnings.simplefilter("error", jmf.ReferenceMismatchWarning)``
  makes it an error. Its ``report`` is the `CheckReport` of that call.
  """

  def __init__(self, report):
    self.report = report
    super().__init__(f"{report.summary()}\n\n{report}")


class StreamCaptureWarning(UserWarning):
  """Kernels join XLA's CUDA graphs by stream capture, not as kernel nodes: the running jaxlib's command-buffer record
  extension has a version whose layout this build does not declare, so its record stage is never called.

  Given once per process, at registration (`jax_mosaic_ffi.registration.status` says the same, with the version).
  Results are unchanged; a launch inside a command buffer costs a little more. Upgrade jax_mosaic_ffi, or install a
  jaxlib that it supports::

    >>> import warnings
    >>> warnings.simplefilter("error", jmf.StreamCaptureWarning)  # a CI job that must get kernel nodes
  """


class UncheckedKernelWarning(UserWarning):
  """The shadow mode (`verify`, ``JAX_MOSAIC_FFI_VERIFY``) is on, but a kernel call has no fallback to compare it
  with, so it runs unchecked: given once per call site, at the line that calls the kernel.

  ``warnings.simplefilter("ignore", jmf.UncheckedKernelWarning)`` silences it for calls left without a fallback
  on purpose; ``mosaic_kernel(..., fallback=fn)`` (a jax.numpy function of the same inputs) checks them::

    >>> issubclass(jmf.UncheckedKernelWarning, UserWarning)
    True
  """


class PackError(ValueError):
  """A kernel pack that cannot be used: not a regular file of yours (or root's), in a folder others can write, not a
  pack, of another pack format version, or damaged (truncated or altered: its digest or an entry's sha256 does not
  match).

  Raised by `load_pack` and, for a pack named in ``JAX_MOSAIC_FFI_PACKS``, by the first compile that looks in the
  packs; the message names the pack, why, and what to do. Nothing of a refused pack is used (:doc:`deploying
  </guides/deploying>`)::

    >>> try:
    ...   jmf.load_pack("no/such/model.jmfpack")
    ... except jmf.PackError as e:
    ...   print(e)
    pack no/such/model.jmfpack cannot be read: its folder ... cannot be opened (No such file or directory)
  """


class NotInPacks(RuntimeError):
  """Under ``JAX_MOSAIC_FFI_PACKS_STRICT=1``, a kernel the packs do not hold: it would compile (or an autotuned call
  would time its configs) in the middle of serving.

  Raised where the compile would start, when the call is traced for lowering. The message names the kernel, its
  call site, its specialization (types and shapes, constexprs, options), its targets and the command that adds it
  to a pack (:doc:`deploying </guides/deploying>`)::

    >>> issubclass(jmf.NotInPacks, RuntimeError)
    True

  Attributes:
    kernel: the kernel's (or the autotuned call's) name.
  """

  def __init__(self, kernel: str, message: str):
    self.kernel = kernel
    super().__init__(message)


class ValueKeyError(TypeError):
  """A value that a compile key cannot hold exactly (an arbitrary object, a traced value): raised by
  `base.value_key`, which never keys a value by its lossy text. Front ends turn it into their own message (a
  CuTe DSL launcher is then keyed by a trace of it; a ``compile_key=`` must be keyable)."""


class KeyAuditError(RuntimeError):
  """Raised under ``JAX_MOSAIC_FFI_KEY_AUDIT=1`` when a compile-cache hit was compiled from other IR than the call
  produces: the compile key missed something that changes the kernel, and the cache would have served a stale one.

  The message names the kernel, the cache that hit (memory or disk), the first line where the two IRs differ and
  the values the key read through objects. It is a bug of jax_mosaic_ffi's keys: report it with the message;
  meanwhile remove the cache folder (``JAX_MOSAIC_FFI_CACHE_DIR``) after each edit, or pass ``compile_key=``.
  A test suite turns the audit on for its run:

    >>> import os
    >>> os.environ["JAX_MOSAIC_FFI_KEY_AUDIT"] = "1"
    >>> kernel = jmf.cuda_kernel('extern "C" __global__ void fill(float* y, int n) {}', "fill")  # audited hits
    >>> del os.environ["JAX_MOSAIC_FFI_KEY_AUDIT"]
  """


# How each public function takes a fallback (the call, then what fn is), as messages tell its users to give one: a
# function built on the launch (an adapter's, such as triton_call) says its own way (`spell_fallback`), so that no
# message tells its user to add an argument to a call they never wrote.
_FALLBACK_SPELLED = {"mosaic_kernel": ("mosaic_kernel(..., fallback=fn)",
                                       "fn is a jax.numpy function of the same inputs returning the same outputs")}


def spell_fallback(api: str, call: str, fn: str) -> None:
  """Says how ``api`` (a public function whose call sites name it: source_location.called_as) takes a fallback:
  ``call`` ("triton_call(..., fallback=fn)") and what ``fn`` is, for the messages about its calls."""
  _FALLBACK_SPELLED[api] = (call, fn)


def how_to_give_fallback(call_site, short: bool = False) -> str:
  """How the user gives the call at ``call_site`` a fallback, in the public function they called there: the call,
  and (unless ``short``) what its function is."""
  call, fn = _FALLBACK_SPELLED.get(getattr(call_site, "api", "mosaic_kernel"), _FALLBACK_SPELLED["mosaic_kernel"])
  return call if short else f"{call}, where {fn}"


def who(kernel, call_site: str) -> str:
  """A kernel call, as messages name it: "mosaic_kernel 'add' at model.py:42 (forward)"; the public function a call
  site names (``triton_call``: source_location.CallSite) in place of mosaic_kernel."""
  return f"{getattr(call_site, 'api', 'mosaic_kernel')} '{kernel.name}' at {call_site}"
