"""CuTe DSL kernels compiled once ever: `cute.compile` per specialization, through the compile cache.

A specialization is a launcher and a `Plan` (cute/compiler/plan.py) for one target. It is compiled around our host
function (cute/compiler/wrapper.py) for an explicit ``--gpu-arch`` (which needs no GPU), and the object
``dump_to_object`` makes (host launch function plus cubin) becomes one image of a module of our format
(kind 3, with the DSL release and the kinds of the host function's arguments). The module goes through the
compile cache, memory then disk, keyed by: the DSL release, the target, the compile options, the plan, and
the launcher as `keys.py` reads it without tracing (or, where it cannot, the IR a trace of it
produces, as the DSL's own cache keys it; or the caller's ``compile_key``). A warm process therefore neither
traces nor compiles, and imports no DSL; `jax.export` carries the module.

Every trace and compile runs under ``JAX_MOSAIC_FFI_COMPILE_TIMEOUT_S``, in a child forked for it and killed at the
deadline (toolchain/forked_compile.py): `CompileTimeout` names the stage (the trace of an IR key or of the key
audit's witness; a target's compile: the launcher's trace, the DSL's MLIR passes and ptxas, which one call runs).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import struct
import threading

from jax_mosaic_ffi.cute.compiler import package
from jax_mosaic_ffi.base import compile_timeout
from jax_mosaic_ffi.base import disk_cache
from jax_mosaic_ffi.base import module_format
from jax_mosaic_ffi.base.errors import CompileError, CompileTimeout
from jax_mosaic_ffi.base.module_format import Arch, Image, ImageKind, ParsedModule
from jax_mosaic_ffi.base.native import core
from jax_mosaic_ffi.cute.compiler import dsl
from jax_mosaic_ffi.cute.compiler import error_lines as cute_error_lines
from jax_mosaic_ffi.cute.compiler import keys as cute_keys
from jax_mosaic_ffi.cute.compiler.plan import Plan
from jax_mosaic_ffi.store import compile_cache
from jax_mosaic_ffi.store import key_audit
from jax_mosaic_ffi.store import stack
from jax_mosaic_ffi.store.entries import Codec, Key
from jax_mosaic_ffi.toolchain import dump
from jax_mosaic_ffi.toolchain import forked_compile
from jax_mosaic_ffi.toolchain.compiled import Compiled
from jax_mosaic_ffi.toolchain.kernel import Kernel, buffer_name

# The object's function prefix (its symbol in our module): objects load apart, so one name serves all. The
# runtime's parser refuses a CuTe DSL module of another symbol, or an object without this prefix's entry points.
PREFIX = core.CUTE_PREFIX
_CACHE_FORMAT = "cute-3"  # 2: values keyed by their content (base/value_key.py); 3: code and objects whole, settings
# The DSL traces into process-wide state. Reentrant: a bounded trace forks under it (so no other thread is inside
# the DSL at the fork), and the child, whose one thread is the one that held it, takes it again.
_lock = threading.RLock()


@dataclasses.dataclass(frozen=True, eq=False)
class CuteKernel(Kernel):
  """A `Kernel` whose module holds CuTe DSL objects (``cute.compile``'s output, one per target), made when a
  `CuteFunction`'s call is traced; ``host_args`` are its host function's arguments after the stream, as
  the contract's (kind, buffer, dimension) triples."""

  host_args: tuple[int, ...] = ()
  alignment: int = 256  # the largest address alignment its tensors assume (TensorSpec.ptr_assumed_align)

  def defines_its_name(self) -> bool:
    return True  # every CuTe DSL module's entry is the host function under one prefix; its name is the call's

  def batch_misalignment(self, strides, param_order, num_inputs) -> str | None:
    # It was compiled taking each buffer as aligned as its TensorSpec says (at most as XLA aligns them).
    misaligned = [b for b, s in enumerate(strides) if s % self.alignment]
    if not misaligned:
      return None
    b = misaligned[0]
    return (f"each batch element of {buffer_name(b, num_inputs)} starts {strides[b]} bytes after the last, not a "
            f"multiple of the {self.alignment} bytes the CuTe DSL kernel assumes its buffers are aligned to "
            "(TensorSpec.ptr_assumed_align). Lower it in the spec, or call the kernel in a lax.map")


def _options(target: Arch, options: str | None) -> str:
  return f"--gpu-arch {target.sm}" + (f" {options}" if options else "")


def _trace(launcher, plan: Plan, target: Arch, options: str | None):
  """The DSL's IR of the launcher for this plan: a trace, as cute.compile and cutlass_call key it."""
  cutlass, cute, cuda = dsl.modules()
  with dsl.importing("from cutlass import compiler"):
    from cutlass import compiler as cutlass_compiler  # noqa: PLC0415  (optional dependency: CuTe DSL)
    from jax_mosaic_ffi.cute.compiler import wrapper  # noqa: PLC0415  (imports the DSL)
  with _lock, dsl.runtime_arch(target.sm):
    artifact = cute.compile_to(cutlass_compiler.ArtifactType.PreCompiledMlir, wrapper.host_entry, cuda.CUstream(0),
                               *wrapper.placeholders(plan), launcher=launcher, plan=plan,
                               options=_options(target, options))
  return artifact, cutlass_compiler


def _bounded(work, stage: str, name: str, targets: tuple[Arch, ...], where: str) -> bytes:
  """``work()`` under ``JAX_MOSAIC_FFI_COMPILE_TIMEOUT_S``, in a forked child (toolchain/forked_compile.py) that
  starts in ``stage`` ("... for sm_90a")."""
  bound = compile_timeout.seconds()
  what = f"'{name}' for {', '.join(t.sm for t in targets)}" + (f" (called at {where})" if where else "")

  # What every child needs is made here first, so each inherits it: the DSL imported (seconds), and its runtime
  # arch decided (else each child asks the driver, which a child forked from a CUDA process cannot use).
  dsl.modules()
  with dsl.importing("the DSL's tensor types"):
    from jax_mosaic_ffi.cute.compiler import wrapper  # noqa: F401, PLC0415  (imports the DSL)
  with _lock, dsl.runtime_arch(targets[0].sm):  # the DSL's state is whole at the fork
    try:
      return forked_compile.run(work, bound, stage)
    except forked_compile.Stopped as e:
      raise CompileTimeout(name, f"the compile ran past {compile_timeout.describe(bound)} seconds in "
                           f"{e.stage}, and its process was killed", "", "", compiler="CuTe DSL",
                           what=what, advice="a compile's time grows with the code the trace unrolls "
                           "(cutlass.range_constexpr, Python loops) and the tile sizes: unroll less, or raise "
                           f"{compile_timeout.ENV} (0: no bound)") from None
    except forked_compile.Died as e:
      raise CompileError(name, f"the compile's process ended ({e.how}) in {e.stage}, without a "
                         "result; this process is unharmed", "", "", compiler="CuTe DSL", what=what,
                         advice="a crash of the CuTe DSL's compiler (or of code the launcher's trace ran): report it "
                         "to the DSL with the launcher and this call") from None


def _trace_key(launcher, plan: Plan, target: Arch, options: str | None, name: str = "launcher",
               where: str = "") -> str:
  """The DSL's own identity of the launcher: the digest of its IR."""
  def digest() -> bytes:
    artifact, cutlass_compiler = _trace(launcher, plan, target, options)
    return hashlib.sha256(bytes(cutlass_compiler.serialize_compilation_artifact(artifact))).hexdigest().encode()
  return _bounded(digest, f"the launcher's trace for its IR key for {target.sm}", name, (target,), where).decode()


def _trace_text(launcher, plan: Plan, targets: tuple[Arch, ...], options: str | None, name: str, where: str) -> str:
  """The IR of each target's trace, as text: the key audit's witness (store/key_audit.py)."""
  def text() -> bytes:
    return "\n".join(f"// {t.sm}\n{_trace(launcher, plan, t, options)[0]}" for t in targets).encode()
  return _bounded(text, "the launcher's trace for the key audit", name, targets, where).decode()


def launcher_identity(launcher, plan: Plan, target: Arch, options: str | None, compile_key=None,
                      exact_plan: bool = True, name: str = "", where: str = "") -> str:
  """The launcher's part of the key: ``compile_key`` (keyed exactly: `cute_kernel` refuses one that cannot be), else
  its code and data (`keys.py`), else, or where the plan's constexprs could not all be keyed exactly
  (``exact_plan``), also the IR of a trace, which holds every value's effect."""
  parts = []
  if compile_key is not None:
    parts.append("key:" + cute_keys.exact_key(compile_key).hex())
  elif (found := cute_keys.fingerprint(launcher)) is not None:
    parts.append("code:" + found)
  if not parts or not exact_plan:
    parts.append("ir:" + _trace_key(launcher, plan, target, options, name or "launcher", where))
  return " ".join(parts)


def _compile_one(launcher, plan: Plan, target: Arch, options: str | None, name: str, where: str) -> Image:
  cutlass, cute, cuda = dsl.modules()
  with dsl.importing("the DSL's tensor types"):
    from jax_mosaic_ffi.cute.compiler import wrapper  # noqa: PLC0415  (imports the DSL)
  with _lock, dsl.runtime_arch(target.sm):
    try:
      compiled = cute.compile(wrapper.host_entry, cuda.CUstream(0), *wrapper.placeholders(plan), launcher=launcher,
                              plan=plan, options=_options(target, options))
      data = compiled.dump_to_object(PREFIX)
    except Exception as e:  # the DSL's errors are many types; each says what it found and where
      log = f"{type(e).__name__}: {str(e).rstrip()}"
      raise CompileError(name, log, "", "", compiler="CuTe DSL", what=f"'{name}' for {target.sm} (called at {where})",
                         excerpts=cute_error_lines.excerpts(e, log)) from None
  return Image(ImageKind.CUTE, target, bytes(data), package.compiler_release() or "", plan.host_arg_kinds())


def _compile_stage(target: Arch) -> str:
  return f"the compile (the launcher's trace, the DSL's MLIR passes, ptxas: one call) for {target.sm}"


def _to_bytes(kernel: CuteKernel) -> bytes:
  header = json.dumps({"host_args": list(kernel.host_args), "alignment": kernel.alignment}).encode()
  return struct.pack("<I", len(header)) + header + kernel.compiled.to_bytes()


def _from_bytes(name: str, data: bytes) -> CuteKernel:
  (length,) = struct.unpack_from("<I", data)
  header = json.loads(data[4:4 + length])
  host_args, alignment = header["host_args"], header["alignment"]
  if not (isinstance(host_args, list) and all(type(v) is int for v in host_args) and type(alignment) is int):
    raise ValueError("bad host_args")
  compiled = Compiled.from_bytes(data[4 + length:])
  if not compiled.parsed.host_code:
    raise ValueError("not a CuTe DSL module")
  return CuteKernel(name, compiled, tuple(host_args), alignment)


# The CuTe DSL's entries (decoded under the call's kernel name).
CODEC = Codec("compile", encode=_to_bytes, decode=lambda data: _from_bytes("", data))


def compile_plan(launcher, plan: Plan, *, name: str, targets: tuple[Arch, ...], options: str | None,
                 compile_key=None, where: str = "") -> CuteKernel:
  """The kernel of this specialization: from memory, from disk, or compiled (once per target). Its pieces (an IR
  key's trace, the compile, the audit's witness) share one deadline (base/compile_timeout.py)."""
  with compile_timeout.whole_compile(compile_timeout.seconds()):
    return _compile_plan(launcher, plan, name, targets, options, compile_key, where)


def _compile_plan(launcher, plan: Plan, name: str, targets: tuple[Arch, ...], options: str | None, compile_key,
                  where: str) -> CuteKernel:
  release = package.compiler_release()
  dsl.check_release(release)
  described, exact_plan = plan.describe()

  def key_for(archs: tuple[Arch, ...], identity: str | None = None) -> str:
    identity = identity or launcher_identity(launcher, plan, archs[0], options, compile_key, exact_plan, name, where)
    return disk_cache.key(_CACHE_FORMAT, f"format{module_format.FORMAT_VERSION}", f"nvidia-cutlass-dsl {release}",
                          cute_keys.settings_key(), identity, described, options or "", *(t.sm for t in archs))

  identity = launcher_identity(launcher, plan, targets[0], options, compile_key, exact_plan, name, where)
  entry_key = key_for(targets, identity)
  # A pack recorded for this GPU's family (sm_100f for an sm_103) serves it by default (store/targets.py).
  key = entry_key if len(targets) != 1 else Key(entry_key, entry_key, targets, key_for)

  def decode(data: bytes) -> CuteKernel:
    return _from_bytes(name, data)

  def compile_all() -> bytes:
    images = []
    for t in targets:
      forked_compile.stage(_compile_stage(t))
      images.append(_compile_one(launcher, plan, t, options, name, where))
    try:
      compiled = Compiled.of(ParsedModule(PREFIX, tuple(images)), None)
    except module_format.ModuleFormatError:
      if dsl.is_jit(launcher):
        raise
      raise CompileError(name, f"the launcher {launcher!r} is not a @cute.jit function and launched no kernel", "",
                         "", compiler="CuTe DSL", what=f"'{name}' (called at {where})",
                         advice="decorate the launcher with @cute.jit (or launch kernels from a @cute.jit function "
                         "it calls)") from None
    return _to_bytes(CuteKernel(name, compiled, plan.host_args(), max(t.align for t in plan.tensors)))

  def compile():
    kernel = decode(_bounded(compile_all, _compile_stage(targets[0]), name, targets, where))
    compile_cache.count_compiles("cute", len(targets))
    return kernel

  constexprs = ", ".join(k for k, _ in plan.constexprs)
  witness = key_audit.Witness(
      "CuTe DSL MLIR", lambda: _trace_text(launcher, plan, targets, options, name, where),
      what=f"cute_kernel '{name}' for {', '.join(t.sm for t in targets)} (called at {where})",
      read=(f"compile_key={compile_key!r}" if compile_key is not None else
            f"the launcher's code and everything it reaches ({identity.split(':')[0]})")
      + (f"; the constexprs {constexprs}" if constexprs else ""))
  def about():
    tensors = ", ".join(f"{t.dtype}{[d if isinstance(d, int) else str(d) for d in t.shape]}" for t in plan.tensors)
    values = ", ".join(f"{k}={v!r}"[:200] for k, v in plan.constexprs)
    return {"front_end": "CuTe DSL", "kernel": name, "specialization": f"tensors {tensors}"
            + (f"; constexprs {values}" if values else "") + (f"; options {options}" if options else ""),
            "targets": [t.sm for t in targets],
            "toolchain": f"nvidia-cutlass-dsl {release}", "call_sites": [where] if where else [],
            "settings": cute_keys.settings_environment()}

  found = stack.get_or_make(key, CODEC.bound(decode=decode), compile, about, witness=witness)
  kernel = found.value
  if kernel.name != name:  # the same code under another name (a cache hit of a twin launcher)
    kernel = dataclasses.replace(kernel, name=name)
  if found.source != "memory":
    dump.maybe_dump(kernel)
  return kernel
