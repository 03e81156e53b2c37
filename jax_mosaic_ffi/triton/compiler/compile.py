"""Triton's compile for our runtime: `compile_triton` makes a `TritonKernel` (a `Kernel` plus `TritonInfo`).

Triton compiles a ``@triton.jit`` function to a cubin (and PTX) for an explicit
target, which needs no GPU. The result is an ordinary `Kernel` whose module
goes through the compile cache (memory and disk), keyed by Triton's own cache key of
each target's compile (`triton.compiler.get_cache_key`: Triton's code, the
function's source and dependencies, the signature, constexprs and hints, the
backend with its ptxas, the options as Triton's knobs and environment make
them, its cache-invalidating environment variables) and ours (targets,
launch options, module format), so a warm process, `jax.export` or XLA's
persistent compilation cache runs no Triton compile at all.

A call's kernel is compiled per distinct signature and value class when the
call is traced (the wing's `launch.py` reads the signature from its avals and scalars):
integers equal to 1 compiled in, 16-divisible integers and pointers hinted, as
Triton's own launcher decides (`specialize.py`). The wing's `kernel.py` holds the
public `triton_kernel`.

A compile is bounded twice: before any of Triton's stages runs, a tensor larger than
a CTA can hold on the target is refused (`bounds.py`, inside Triton's
frontend); and the whole compile, every target and every stage (the frontend,
the MLIR passes, ptxas), runs under ``JAX_MOSAIC_FFI_COMPILE_TIMEOUT_S`` in a
forked child killed at the deadline (toolchain/forked_compile.py; the stage it
was in: `stages.py`), as does the frontend's TTIR where a kernel is
keyed by it. Failures are worded in `errors.py`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import struct
import threading
from typing import Any, ClassVar, Mapping

from jax_mosaic_ffi.base import compile_timeout
from jax_mosaic_ffi.base import disk_cache
from jax_mosaic_ffi.base import module_format
from jax_mosaic_ffi.base import native_stderr
from jax_mosaic_ffi.base import ptx_info
from jax_mosaic_ffi.base.errors import CompileError, KeyAuditError
from jax_mosaic_ffi.base.module_format import Image, ImageKind, ParsedModule
from jax_mosaic_ffi.store import compile_cache
from jax_mosaic_ffi.store import key_audit
from jax_mosaic_ffi.store import pack_record
from jax_mosaic_ffi.store import stack
from jax_mosaic_ffi.store.entries import Codec
from jax_mosaic_ffi.toolchain import dump
from jax_mosaic_ffi.toolchain.compiled import Compiled, param_sizes
from jax_mosaic_ffi.toolchain.kernel import PDL_MIN_ARCH, Kernel, buffer_name, symbol_names
from jax_mosaic_ffi.triton.compiler import errors
from jax_mosaic_ffi.triton.compiler import stages as triton_stages
from jax_mosaic_ffi.triton.compiler.forked import BoundedCompile
from jax_mosaic_ffi.triton.compiler import tensordesc_abi
from jax_mosaic_ffi.triton.compiler.release import require_triton
from jax_mosaic_ffi.triton.compiler import keys as triton_keys
from jax_mosaic_ffi.triton.compiler import specialize as triton_specialize
from jax_mosaic_ffi.triton.compiler import bounds
from jax_mosaic_ffi.triton.compiler.languages import TRITON, Language
from jax_mosaic_ffi.triton.compiler.options import LAUNCH_OPTIONS, TritonOptions

_CACHE_FORMAT = "triton-5"  # 2: TritonInfo.dropped, .aligned; 3: .tensordesc_meta; 4: values exact; 5: read whole


# What a Triton alignment hint (tt.divisibility 16 on a pointer) promises.
ASSUMED_ALIGNMENT = 16

_compile_lock = threading.Lock()  # Triton's compiler is not known to be thread-safe


@dataclasses.dataclass(frozen=True)
class TritonInfo:
  """What Triton's metadata says about launching a compiled kernel."""

  num_warps: int
  num_ctas: int
  shared: int
  scratch: tuple[tuple[int, int], ...]  # (size per program, align) of each trailing scratch pointer
  signature: tuple[Any, ...]            # Triton types of the non-constexpr parameters (a tuple's: a tuple)
  dropped: tuple[int, ...]              # those (by index) specialized to constexprs: not passed at launch
  aligned: tuple[int, ...]              # parameters passed (by index) whose pointers it takes as 16-byte aligned
  meta: tuple[tuple[str, Any], ...]     # constexprs and launch options, for grid callables
  triton_version: str
  # Host tensor descriptors lowered to TMA: one per tensordesc parameter; empty: decomposed (or none).
  tensordesc_meta: tuple[tensordesc_abi.DescriptorMeta, ...] = ()


@dataclasses.dataclass(frozen=True, eq=False)
class TritonKernel(Kernel):
  """A `Kernel` compiled by Triton; `mosaic_kernel` reads its launch (block, shared memory, cluster) from
  ``info``, Triton's metadata of the compile. `triton_kernel` with ``signature=`` returns one, compiled at
  once for every target."""

  info: TritonInfo | None = None
  language: ClassVar[Language] = TRITON  # what it was written in (a Gluon kernel's subclass names its own)

  @property
  def meta(self) -> dict:
    return dict(self.info.meta)

  @property
  def aligned_params(self) -> tuple[int, ...]:
    """The parameters (by position) whose pointers it takes as 16-byte aligned (Triton's alignment hints)."""
    return self.info.aligned

  def batch_misalignment(self, strides, param_order, num_inputs) -> str | None:
    for k in self.aligned_params:
      buffer = param_order[k] if k < len(param_order) else -1
      if buffer >= 0 and strides[buffer] % ASSUMED_ALIGNMENT:
        return (f"each batch element of {buffer_name(buffer, num_inputs)} starts {strides[buffer]} bytes after the "
                f"last, not a multiple of {ASSUMED_ALIGNMENT}, but the kernel was compiled taking its parameter {k} "
                f"as {ASSUMED_ALIGNMENT}-byte aligned (Triton's launcher specializes pointers on alignment). Mark "
                f"that parameter do_not_specialize_on_alignment in @triton.jit, or give each element a multiple of "
                f"{ASSUMED_ALIGNMENT} bytes")
    return None


# ------------------------------------------------------------------ compile

def _key_value(value) -> str:
  return f"{type(value).__name__}:{value!r}"


def compile_triton(fn, signature, constexprs: Mapping[str, Any], options: TritonOptions, targets,
                   scalar_values: Mapping[int, Any], language: Language = TRITON) -> TritonKernel:
  """``fn`` compiled for parameters of Triton types ``signature`` (a tuple parameter's type: a tuple of its
  elements' types) and the scalar values known at trace time (by index among the leaves of the non-constexpr
  parameters, `specialize.flat_types`), through the compile cache; ``language``: what it is written in
  (languages.py)."""
  triton = require_triton()
  made = f"{language.maker} '{fn.__name__}'"
  options.check(fn.__name__).check_targets(fn.__name__, targets)  # every front end and config, before Triton
  missing = [p.name for p in fn.params if p.is_constexpr and p.name not in constexprs
             and p.default is inspect.Parameter.empty]
  if missing:
    # A parameter named like a launch option gets the option's value (kernel.py), so only maxnreg can be missing.
    how = (f"pass {missing[0]}= (the parameter takes the launch option's value)" if missing[0] in LAUNCH_OPTIONS
           else "pass constexprs={...} or a config that sets them")
    raise ValueError(f"{made}: no value for the constexpr parameter(s) {', '.join(missing)}; {how}")
  for ty in signature:
    nested = isinstance(ty, tuple)
    for leaf in triton_specialize.flat_types([ty]):
      if not isinstance(leaf, str) or leaf == "constexpr" or (tensordesc_abi.is_descriptor(leaf) and (
          nested or tensordesc_abi.parse_type(leaf) is None)):
        raise ValueError(f"{made}: parameter type {ty!r} is not supported; parameters are pointers (*fp32), "
                         "scalars (i32, fp32, ...), tuples of them, and host tensor descriptors as Triton writes "
                         "them (tensordesc<fp16[64, 64]>, a Gluon kernel's with its shared layout: no im2col, not "
                         "in a tuple)")
  # Each constexpr read whole (keys.py); one that cannot be is keyed by the TTIR Triton's frontend makes.
  keys = {k: triton_keys.constexpr_key(v) for k, v in constexprs.items()}
  constexpr_keys = json.dumps(sorted((k, found or "ir") for k, found in keys.items()))
  config = errors.config_text(signature, constexprs, options)
  bound = compile_timeout.seconds()  # a bad setting is named before anything compiles
  bounded = BoundedCompile(fn, targets, config, language, bound)
  about = lambda: {"front_end": language.name, "kernel": fn.__name__, "specialization": config,  # noqa: E731
                   "targets": [t.sm for t in targets], "toolchain": f"triton {triton.__version__}",
                   "settings": triton_keys.settings_environment()}
  with pack_record.noted(about):  # while recording for a pack, a target Triton refuses is noted per kernel
    specialization = _specialization(fn, signature, scalar_values, constexprs, targets, config, language)
    requests = _requests(fn, specialization, options, targets, config, language, bounded)
  entry_key = disk_cache.key(
      _CACHE_FORMAT, f"format{module_format.FORMAT_VERSION}", f"triton {triton.__version__}",
      triton_keys.settings_key(),
      language.name,
      fn.__name__,
      *(ty if isinstance(ty, str) else repr(ty) for ty in signature),
      constexpr_keys, specialization.description,
      options.key, *(t.sm for t in targets), *(r.key for r in requests))
  # The constexprs and launch options, for the launch's callables: this call's, never stored.
  meta = tuple({**constexprs, **options.meta()}.items())

  def decode(data: bytes) -> TritonKernel:
    kernel = _from_bytes(fn.__name__, data)
    return TritonKernel(kernel.name, kernel.compiled, dataclasses.replace(kernel.info, meta=meta))

  def run():
    with _compile_lock:
      # The bound covers the whole compile, every target and all of Triton's stages: from here, not from the wait.
      data = bounded.run_printing(lambda: _run_triton(triton, fn, signature, specialization, requests, meta, config,
                                                      language, options.debug), targets[0].sm)
      compile_cache.count_compiles("triton", len(targets))
    return decode(data)

  read = ", ".join(f"{k} ({'its IR' if keys[k] is None else type(v).__qualname__})"
                   for k, v in constexprs.items())
  witness = key_audit.Witness("TTIR", lambda: "\n".join(_witness(r, bounded) for r in requests),
                              what=f"{made} for {', '.join(t.sm for t in targets)} with {config}",
                              read=f"the kernel's code and what it reaches; the constexprs {read}" if read else "")
  found = stack.get_or_make(entry_key, CODEC.bound(decode=decode), run, about, witness=witness)
  if found.source != "memory":
    dump.maybe_dump(found.value)
  return found.value


@dataclasses.dataclass(frozen=True)
class _Request:
  """One target's Triton compile, with Triton's own cache key for it."""

  target: module_format.Arch
  gpu_target: Any
  source: Any
  options: dict
  parsed: Any  # the options as Triton's backend parsed them
  key: str


def _specialization(fn, signature, scalar_values, constexprs, targets, config,
                    language: Language) -> triton_specialize.Specialization:
  """What Triton's launcher would compile for these arguments (specialize.py)."""
  from triton.backends.compiler import GPUTarget  # noqa: PLC0415  (optional dependency: Triton)
  from triton.compiler import make_backend  # noqa: PLC0415  (optional dependency: Triton)
  try:
    return triton_specialize.specialize_cached(fn, signature, scalar_values, constexprs, targets[0].sm,
                                               lambda: make_backend(GPUTarget("cuda", targets[0].number, 32)))
  except KeyAuditError:
    raise
  except Exception as e:
    raise errors.failed(fn, targets[0], config, language, e) from None


def _requests(fn, specialization, options: TritonOptions, targets, config, language: Language,
              bounded: BoundedCompile) -> list[_Request]:
  """Each target's compile and Triton's cache key for it, which covers what
  changes Triton's output beyond our inputs: its knobs, ptxas, own code, and
  the specialization (signature, constexprs, attributes)."""
  from triton.backends.compiler import GPUTarget  # noqa: PLC0415  (optional dependency: Triton)
  from triton.compiler import get_cache_key, make_backend  # noqa: PLC0415  (optional dependency: Triton)
  from triton.compiler.compiler import get_cache_invalidating_env_vars  # noqa: PLC0415  (optional dependency: Triton)
  compile_options = options.compile_options()
  env_vars = get_cache_invalidating_env_vars()
  requests = []
  for target in targets:
    source = language.source(fn, dict(specialization.signature), dict(specialization.constexprs),
                             dict(specialization.attrs))
    if not isinstance(source, bounds.BoundedSource):
      raise TypeError(f"{language.name}'s source {type(source).__name__} does not bound its tensors (BoundedSource)")
    gpu_target = GPUTarget("cuda", target.number, 32)
    try:
      backend = make_backend(gpu_target)
      # As triton.compile parses them: the environment's knobs (TRITON_DEFAULT_FP_FUSION...) are in them.
      parsed = backend.parse_options(dict(compile_options, **source.parse_options()))
      if source.unkeyed():  # a constexpr or the function our keys cannot read whole: keyed by its IR
        with _compile_lock:
          text = bounded.ir_text(source, gpu_target, parsed)
        source.ir_key = hashlib.sha256(key_audit.normal(text).encode()).hexdigest()
      key = get_cache_key(source, backend, parsed, env_vars)
    except (KeyAuditError, CompileError):  # CompileTimeout: its frontend ran past the bound
      raise
    except Exception as e:
      raise errors.failed(fn, target, config, language, e) from None
    requests.append(_Request(target, gpu_target, source, compile_options, parsed, key))
  return requests


def _witness(request: _Request, bounded: BoundedCompile) -> str:
  """A request's TTIR, with its target: the key audit's witness (store/key_audit.py)."""
  with _compile_lock:
    return f"// {request.target.sm}\n{bounded.ir_text(request.source, request.gpu_target, request.parsed)}"


def _run_triton(triton, fn, signature, specialization, requests, meta, config, language: Language,
                debug=False) -> tuple[bytes, str]:
  """Each target's compile (in a bounded compile's child: each stage reported as it starts): the kernel as the
  cache stores it, and the intermediate forms Triton's ``debug`` option prints (printed by the caller, whose
  stdout is the user's)."""
  images, ptx, first, descriptors, forms = [], None, None, None, []
  flat = tuple(triton_specialize.flat_types(signature))  # tuple parameters' leaves, as the entry takes them
  waits = True
  for request in requests:
    target = request.target
    with native_stderr.captured() as printed:  # Triton's passes say why they failed on stderr only
      try:
        with triton_stages.reported(target.sm):
          compiled = triton.compile(request.source, target=request.gpu_target, options=request.options)
        failure = None
      except Exception as e:
        failure = e
    if isinstance(failure, bounds.OversizedTensor):  # found in Triton's frontend, before any stage ran
      raise errors.too_large(fn, target, config, language, failure) from None
    if failure is not None:
      raise errors.failed(fn, target, config, language, failure, printed.text) from None
    metadata = compiled.metadata
    if debug:  # Triton's debug option: the intermediate forms, as jax-triton's debug=True prints them
      for stage in language.stages:
        if stage in compiled.asm:
          forms.append(f"// ---- {fn.__name__} for {target.sm}: {stage} ----\n{compiled.asm[stage]}\n")
    # Triton builds for the arch-specific target (sm_90a) where there is one: its PTX says which.
    arch = module_format.Arch.parse(ptx_info.target_arch(compiled.asm["ptx"]) or target.sm)
    images.append(Image(ImageKind.CUBIN, arch, bytes(compiled.asm["cubin"])))
    # The descriptors' parameters and encoding are one for the whole module: every target must agree.
    try:
      found = tensordesc_abi.metas(getattr(metadata, "tensordesc_meta", None), flat, fn.__name__)
    except ValueError as e:
      raise errors.refused(fn, f"for {target.sm}: {e}") from None
    if descriptors is not None and found != descriptors:
      raise errors.refused(fn, f"Triton lowers its tensor descriptors differently for {target.sm} than "
                           f"for {requests[0].target.sm} ({found or 'no TMA'} against {descriptors or 'no TMA'}); "
                           "compile it for targets of one family (targets=[...])")
    descriptors = found
    # tl.extra.cuda.gdc_wait() in the kernel: it waits for the previous kernel before reading what that wrote,
    # so it may launch with PDL, as our own compiled kernels do (Kernel.pdl_safe). Without it, never. XLA
    # does the same for the Triton kernels it compiles itself (its Triton custom call launches with PDL when
    # the compile says the kernel uses it, under xla_gpu_enable_pdl, on by default on Hopper and newer).
    waits = waits and arch.number >= PDL_MIN_ARCH and "griddepcontrol.wait" in compiled.asm["ptx"]
    if ptx is None:
      ptx, first = (arch, compiled.asm["ptx"]), metadata
  images.append(Image(ImageKind.PTX, ptx[0], ptx[1].encode()))
  parsed = ParsedModule(first.name, tuple(images), module_format.FLAG_PDL_WAIT if waits else 0)
  sizes = param_sizes(parsed)
  if getattr(first, "launch_cooperative_grid", False):
    raise errors.refused(fn, "the kernel asks for a cooperative grid launch, which jax_mosaic_ffi does not "
                         "make")
  # The parameters passed: the non-constexpr ones (descriptors expanded as Triton's launcher expands them) less
  # those specialized to constexprs, then Triton's scratch.
  n_scratch = (len(sizes) - (tensordesc_abi.expanded_param_count(flat, bool(descriptors))
                             - len(specialization.dropped)) if sizes is not None else 2)
  if n_scratch > 2:
    raise errors.refused(fn, f"the compiled kernel takes {n_scratch} parameters after its own, more than "
                         "Triton's global and profile scratch pointers (instrumentation, such as "
                         "TRITON_INSTRUMENTATION_MODE, adds parameters of its own); compile it without")
  scratch = [(int(getattr(first, "global_scratch_size", 0)), int(getattr(first, "global_scratch_align", 1))),
             (int(getattr(first, "profile_scratch_size", 0)), int(getattr(first, "profile_scratch_align", 1)))]
  info = TritonInfo(num_warps=int(first.num_warps), num_ctas=int(first.num_ctas), shared=int(first.shared),
                    scratch=tuple(scratch[:max(n_scratch, 0)]), signature=tuple(signature),
                    dropped=specialization.dropped,
                    # By position among the parameters passed: descriptors before it expanded, dropped ones gone.
                    aligned=tuple(tensordesc_abi.expanded_param_count(flat[:k], bool(descriptors))
                                  - sum(d < k for d in specialization.dropped) for k in specialization.aligned),
                    meta=meta,
                    triton_version=triton.__version__, tensordesc_meta=descriptors)
  return _to_bytes(TritonKernel(fn.__name__, Compiled.of(parsed, sizes), info)), "".join(forms)


def _to_bytes(kernel: TritonKernel) -> bytes:
  info = dataclasses.asdict(dataclasses.replace(kernel.info, meta=()))  # asdict would deep-copy a function in meta
  info["meta"] = [[k, _key_value(v)] for k, v in kernel.info.meta]  # for the record; meta is the caller's on load
  header = json.dumps(info).encode()
  return struct.pack("<I", len(header)) + header + kernel.compiled.to_bytes()


def _tuples(value):
  """A signature read back from JSON: its lists (tuple parameters) as tuples again."""
  return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _from_bytes(name: str, data: bytes) -> TritonKernel:
  (length,) = struct.unpack_from("<I", data)
  info = json.loads(data[4:4 + length])
  compiled = Compiled.from_bytes(data[4 + length:])
  return TritonKernel(name, compiled, TritonInfo(
      num_warps=int(info["num_warps"]), num_ctas=int(info["num_ctas"]), shared=int(info["shared"]),
      scratch=tuple((int(s), int(a)) for s, a in info["scratch"]), signature=_tuples(info["signature"]),
      dropped=tuple(int(k) for k in info["dropped"]), aligned=tuple(int(k) for k in info["aligned"]),
      meta=(), triton_version=str(info["triton_version"]),
      tensordesc_meta=tuple(tensordesc_abi.DescriptorMeta(
          int(d["swizzle"]), int(d["elem_size"]), int(d["elem_type"]), tuple(int(b) for b in d["block_size"]))
          for d in info.get("tensordesc_meta", ()))))


# Triton's entries (decoded under the call's name, with its constexprs and launch options); in a pack or a job's
# store, holding the kernel the call names.
CODEC = Codec("compile", encode=_to_bytes, decode=lambda data: _from_bytes("", data),
              fits=lambda kernel, about: symbol_names(kernel.symbol, about["kernel"]))
