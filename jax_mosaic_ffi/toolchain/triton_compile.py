"""Triton kernels compiled for our runtime: `triton_kernel`.

Triton compiles a ``@triton.jit`` function to a cubin (and PTX) for an explicit
target, which needs no GPU. The result is an ordinary `Kernel` whose module
goes through the compile cache (memory and disk), keyed by Triton's own cache key of
each target's compile (`triton.compiler.get_cache_key`: Triton's code, the
function's source and dependencies, the signature, constexprs and hints, the
backend with its ptxas, the options as Triton's knobs and environment make
them, its cache-invalidating environment variables) and ours (targets,
launch options, module format), so a warm process, `jax.export` or XLA's
persistent compilation cache runs no Triton compile at all.

Without ``signature=``, the Triton types are read from each call's avals and
scalars (`transforms/triton_launch.py`, which also launches them), and the
kernel is compiled per distinct signature and value class when the call is
traced: integers equal to 1 compiled in, 16-divisible integers and pointers
hinted, as Triton's own launcher decides (`triton_specialize.py`).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import struct
import threading
from typing import Any, Mapping, Sequence

from jax_mosaic_ffi.base import disk_cache
from jax_mosaic_ffi.base import module_format
from jax_mosaic_ffi.base import ptx_info
from jax_mosaic_ffi.base.errors import CompileError, TritonUnavailable
from jax_mosaic_ffi.base.module_format import Image, ImageKind, ParsedModule
from jax_mosaic_ffi.toolchain import compile_cache
from jax_mosaic_ffi.toolchain import dump
from jax_mosaic_ffi.toolchain import triton_decorators
from jax_mosaic_ffi.toolchain import triton_descriptors
from jax_mosaic_ffi.toolchain import triton_specialize
from jax_mosaic_ffi.toolchain.compiled import Compiled, param_sizes
from jax_mosaic_ffi.toolchain.kernel import Kernel, parse_targets
from jax_mosaic_ffi.toolchain.nvrtc.program import PDL_MIN_ARCH

# The Triton releases this module is written and tested against: [min, max).
# Triton's compile API, its specialization code and its kernels' calling
# convention change between minor releases, so others are refused rather than
# half-working. 3.6 to 3.9 share what we use: ASTSource / compile / get_cache_key,
# the argument binder and JITFunction._pack_args, and the parameters an entry
# takes (the non-constexpr ones, then a global and a profile scratch pointer).
SUPPORTED_TRITON = ((3, 6), (3, 10))
SUPPORTED_TEXT = ("Triton >= 3.6, < 3.10 (tested: 3.6.0 to 3.9.0 compiling and lowering on CPU, "
                  "3.6.0 on an H200)")
LAUNCH_KEYS = triton_decorators.LAUNCH_OPTIONS  # num_warps, num_stages, num_ctas, maxnreg
_CACHE_FORMAT = "triton-3"  # 2: TritonInfo.dropped and .aligned; 3: .tensordesc_meta


_compile_lock = threading.Lock()  # Triton's compiler is not known to be thread-safe


def _version_tuple(version: str) -> tuple[int, ...]:
  parts = []
  for piece in version.split("+")[0].split(".")[:3]:
    digits = "".join(c for c in piece if c.isdigit()) or "0"
    parts.append(int(digits))
  return tuple(parts)


def require_triton():
  """The triton module, or TritonUnavailable saying what to install."""
  try:
    import triton  # noqa: PLC0415  (optional dependency: Triton)
  except ImportError as e:
    raise TritonUnavailable(
        f"jmf.triton_kernel needs Triton ({SUPPORTED_TEXT}): pip install 'jax_mosaic_ffi[triton]' ({e})") from None
  check_version(triton.__version__)
  return triton


def check_version(version: str) -> None:
  low, high = SUPPORTED_TRITON
  if not low <= _version_tuple(version)[:2] < high:
    raise TritonUnavailable(
        f"jmf.triton_kernel supports {SUPPORTED_TEXT}; Triton {version} is installed. Its compiler API and the "
        f"parameters its kernels take change between releases: pip install 'jax_mosaic_ffi[triton]' for a "
        f"supported one")


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
  tensordesc_meta: tuple[triton_descriptors.DescriptorMeta, ...] = ()


@dataclasses.dataclass(frozen=True, eq=False)
class TritonKernel(Kernel):
  """A `Kernel` compiled by Triton; `mosaic_kernel` reads its launch from `info`."""

  info: TritonInfo | None = None

  @property
  def meta(self) -> dict:
    return dict(self.info.meta)

  @property
  def aligned_params(self) -> tuple[int, ...]:
    return self.info.aligned

class TritonFunction:
  """A ``@triton.jit`` function with its constexprs and options, compiled per
  call signature (the Triton types of its parameters, from the call's avals).

  ``decorators``: the ``@triton.autotune`` / ``@triton.heuristics`` layers it
  came with, outermost first (toolchain/triton_decorators.py), which
  `mosaic_kernel` applies per call (transforms/triton_decorated.py).
  ``options``: Triton's other compile options (`check_options`), as sorted pairs."""

  def __init__(self, fn, constexprs: dict, num_warps: int, num_stages: int, num_ctas: int, targets,
               maxnreg: int | None = None, decorators: tuple = (), options: tuple = ()):
    self.fn, self.constexprs = fn, dict(constexprs)
    self.num_warps, self.num_stages, self.num_ctas, self.targets = num_warps, num_stages, num_ctas, targets
    self.maxnreg, self.decorators, self.options = maxnreg, tuple(decorators), tuple(options)
    self.name = fn.__name__

  def __repr__(self) -> str:
    return f"TritonFunction({self.name!r}, constexprs={self.constexprs}, num_warps={self.num_warps})"

  @property
  def meta(self) -> dict:
    meta = {**self.constexprs, "num_warps": self.num_warps, "num_stages": self.num_stages, "num_ctas": self.num_ctas}
    return meta if self.maxnreg is None else {**meta, "maxnreg": self.maxnreg}

  def with_meta(self, meta: Mapping[str, Any]) -> "TritonFunction":
    """The same function, undecorated, with constexprs and launch options from an autotuning config."""
    meta = dict(meta)
    launch = {k: meta.pop(k) for k in LAUNCH_KEYS if k in meta}
    constexprs = {**self.constexprs, **{k: v for k, v in meta.items() if k in _constexpr_names(self.fn)}}
    return TritonFunction(self.fn, constexprs, launch.get("num_warps", self.num_warps),
                          launch.get("num_stages", self.num_stages), launch.get("num_ctas", self.num_ctas),
                          self.targets, launch.get("maxnreg", self.maxnreg), options=self.options)

  def specialize(self, signature: Sequence[Any], scalar_values: Mapping[int, Any] | None = None) -> TritonKernel:
    """Compiled for parameters of these Triton types (a tuple parameter's: a tuple of types) and the scalar
    values known now, by index among the leaves (triton_specialize.flat_types)."""
    return _compile(self.fn, tuple(signature), self.constexprs, self.num_warps, self.num_stages, self.num_ctas,
                    self.targets, scalar_values or {}, maxnreg=self.maxnreg, options=self.options)


def _constexpr_names(fn) -> list[str]:
  return [p.name for p in fn.params if p.is_constexpr]


def runtime_params(fn) -> list[str]:
  return [p.name for p in fn.params if not p.is_constexpr]


def _check_fn(fn, triton):
  """The @triton.jit function and its @triton.autotune / @triton.heuristics layers (toolchain/triton_decorators.py)."""
  return triton_decorators.unwrap(fn)


# Triton compile options that `options=` may not set, each with why and what instead. The rest of the NVIDIA
# backend's options (enable_fp_fusion, debug, extern_libs, default_dot_input_precision, ...) go to Triton as given.
_OPTIONS_REFUSED = {
    **{key: f"pass {key}= itself" for key in LAUNCH_KEYS},
    "arch": "the target comes from targets= (triton_call: compute_capability=)",
    "backend_name": "the backend is CUDA's",
    "warp_size": "the warp size is the target's (32)",
    "launch_cooperative_grid": "jax_mosaic_ffi does not make cooperative grid launches",
    "launch_pdl": "programmatic dependent launch follows the kernel: one that calls tl.extra.cuda.gdc_wait() "
                  "launches with it (mosaic_kernel's uses_pdl= opts out)",
    "instrumentation_mode": "instrumentation adds kernel parameters the launch does not pass",
    "ir_override": "the kernel is compiled from its Python source",
}


def check_options(options: Mapping[str, Any] | None, name: str) -> tuple[tuple[str, Any], ...]:
  """Triton's other compile options, as sorted pairs: names of its NVIDIA backend's options (``CUDAOptions``)
  only, less those `_OPTIONS_REFUSED` names; values hashable, as Triton keys its cache by them."""
  if options is None:
    return ()
  if not isinstance(options, Mapping):
    raise TypeError(f"triton_kernel '{name}': options must be a mapping of Triton compile options, got {options!r}")
  from triton.backends.nvidia.compiler import CUDAOptions  # noqa: PLC0415  (optional dependency: Triton)
  known = sorted(f.name for f in dataclasses.fields(CUDAOptions) if f.name not in _OPTIONS_REFUSED)
  for key, value in options.items():
    if key in _OPTIONS_REFUSED:
      raise ValueError(f"triton_kernel '{name}': the Triton option {key!r} is not taken here: {_OPTIONS_REFUSED[key]}")
    if key not in known:
      raise ValueError(f"triton_kernel '{name}': {key!r} is not a compile option of Triton "
                       f"{require_triton().__version__}'s NVIDIA backend; it takes {', '.join(known)}")
    try:
      hash(value)
    except TypeError:
      raise TypeError(f"triton_kernel '{name}': the Triton option {key!r} must be hashable (a tuple, not a list or "
                      f"dict), got {value!r}") from None
  return tuple(sorted(options.items()))


def triton_kernel(fn, *, signature: Mapping[str, str] | Sequence[str] | None = None,
                  constexprs: Mapping[str, Any] | None = None, num_warps: int = 4, num_stages: int = 3,
                  num_ctas: int = 1, targets=None, maxnreg: int | None = None,
                  options: Mapping[str, Any] | None = None):
  """A Triton kernel for `mosaic_kernel`.

  Args:
    fn: a ``@triton.jit`` function, bare or under ``@triton.autotune`` and
      ``@triton.heuristics`` (transforms/triton_decorated.py says how they apply).
    signature: the Triton types of its non-constexpr parameters (``{"x_ptr":
      "*fp32", "n": "i32"}`` or ``["*fp32", "i32"]``). Given, the kernel is
      compiled now and a `Kernel` (a `TritonKernel`) comes back; left out, the
      types are read from each call's avals and scalars, and the kernel is
      compiled when the call is traced (a `TritonFunction`).
    constexprs: values of its ``tl.constexpr`` parameters.
    num_warps, num_stages, num_ctas: Triton's launch options.
    maxnreg: the most registers a thread may use (PTX ``.maxnreg``), or None.
    targets: archs to compile for (default: the visible GPUs', or sm_90).
    options: Triton's other compile options, by the names of its NVIDIA
      backend's (``{"enable_fp_fusion": False, "debug": True}``); those that
      would change the launch (``launch_cooperative_grid``, ``arch``, ...)
      are refused, saying what to use instead. With ``debug``, each compile
      prints Triton's intermediate forms (TTIR, TTGIR, LLVM IR, PTX).

  Raises:
    TritonUnavailable: Triton is missing or of an unsupported version.
  """
  triton = require_triton()
  fn, decorators = _check_fn(fn, triton)
  constexprs = dict(constexprs or {})
  unknown = [k for k in constexprs if k not in _constexpr_names(fn)]
  if unknown:
    raise ValueError(f"triton_kernel '{fn.__name__}': {unknown[0]!r} is not one of its tl.constexpr parameters "
                     f"({', '.join(_constexpr_names(fn)) or 'none'})")
  triton_decorators.check_constexprs(decorators, constexprs, fn.__name__)
  for what, value in (("num_warps", num_warps), ("num_stages", num_stages), ("num_ctas", num_ctas),
                      ("maxnreg", 1 if maxnreg is None else maxnreg)):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      raise ValueError(f"triton_kernel '{fn.__name__}': {what} must be a positive int, got {value!r}")
  function = TritonFunction(fn, constexprs, num_warps, num_stages, num_ctas, parse_targets(targets), maxnreg,
                            decorators, check_options(options, fn.__name__))
  if signature is None:
    return function
  if decorators:
    raise ValueError(f"triton_kernel '{fn.__name__}': signature= compiles one kernel now, but its "
                     "@triton.autotune/@triton.heuristics choose constexprs per call; leave signature= out")
  names = runtime_params(fn)
  if isinstance(signature, Mapping):
    missing = [n for n in names if n not in signature]
    extra = [n for n in signature if n not in names]
    if missing or extra:
      raise ValueError(f"triton_kernel '{fn.__name__}': signature must give a type for each non-constexpr "
                       f"parameter ({', '.join(names)}); missing {missing or 'none'}, unknown {extra or 'none'}")
    types = [signature[n] for n in names]
  else:
    types = list(signature)
    if len(types) != len(names):
      raise ValueError(f"triton_kernel '{fn.__name__}': signature has {len(types)} types for its "
                       f"{len(names)} non-constexpr parameters ({', '.join(names)})")
  return function.specialize(types)


# ------------------------------------------------------------------ compile

def _key_value(value) -> str:
  return f"{type(value).__name__}:{value!r}"


def _compile(fn, signature, constexprs, num_warps, num_stages, num_ctas, targets, scalar_values,
             maxnreg=None, options=()) -> TritonKernel:
  triton = require_triton()
  missing = [p.name for p in fn.params if p.is_constexpr and p.name not in constexprs
             and p.default is inspect.Parameter.empty]
  if missing:
    raise ValueError(f"triton_kernel '{fn.__name__}': no value for the constexpr parameter(s) "
                     f"{', '.join(missing)}; pass constexprs={{...}} or a config that sets them")
  for ty in signature:
    nested = isinstance(ty, tuple)
    for leaf in triton_specialize.flat_types([ty]) if nested else [ty]:
      if not isinstance(leaf, str) or leaf == "constexpr" or (triton_descriptors.is_descriptor(leaf) and (
          nested or triton_descriptors.parse_type(leaf) is None)):
        raise ValueError(f"triton_kernel '{fn.__name__}': parameter type {ty!r} is not supported; parameters are "
                         "pointers (*fp32), scalars (i32, fp32, ...), tuples of them, and host tensor descriptors "
                         "as Triton writes them (tensordesc<fp16[64, 64]>: no Gluon layout, no im2col, not in a "
                         "tuple)")
  specialization = _specialization(fn, signature, scalar_values, constexprs, targets)
  requests = _requests(fn, specialization, num_warps, num_stages, num_ctas, targets, maxnreg, options)
  entry_key = disk_cache.key(
      _CACHE_FORMAT, f"format{module_format.FORMAT_VERSION}", f"triton {triton.__version__}", fn.__name__,
      *(ty if isinstance(ty, str) else repr(ty) for ty in signature),
      json.dumps(sorted((k, _key_value(v)) for k, v in constexprs.items())), specialization.description,
      f"w{num_warps} s{num_stages} c{num_ctas}" + ("" if maxnreg is None else f" r{maxnreg}"),
      *([json.dumps([(k, _key_value(v)) for k, v in options])] if options else []),
      *(t.sm for t in targets), *(r.key for r in requests))
  meta = {**constexprs, "num_warps": num_warps, "num_stages": num_stages, "num_ctas": num_ctas}
  if maxnreg is not None:
    meta["maxnreg"] = maxnreg

  def decode(data: bytes) -> TritonKernel:
    kernel = _from_bytes(fn.__name__, data)  # meta is not stored: it is this call's
    return TritonKernel(kernel.name, kernel.compiled, dataclasses.replace(kernel.info, meta=tuple(meta.items())))

  def compile():
    with _compile_lock:
      kernel = _run_triton(triton, fn, signature, specialization, constexprs, requests, num_warps, num_stages,
                           num_ctas, debug=bool(dict(options).get("debug")))
      compile_cache.count_compiles("triton", len(targets))
    return TritonKernel(kernel.name, kernel.compiled, dataclasses.replace(kernel.info, meta=tuple(meta.items()))), True

  found = compile_cache.cached(entry_key, compile=compile, encode=_to_bytes, decode=decode)
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
  key: str


def _specialization(fn, signature, scalar_values, constexprs, targets) -> triton_specialize.Specialization:
  """What Triton's launcher would compile for these arguments (triton_specialize.py)."""
  from triton.backends.compiler import GPUTarget  # noqa: PLC0415  (optional dependency: Triton)
  from triton.compiler import make_backend  # noqa: PLC0415  (optional dependency: Triton)
  try:
    return triton_specialize.specialize_cached(fn, signature, scalar_values, constexprs, targets[0].sm,
                                               lambda: make_backend(GPUTarget("cuda", targets[0].number, 32)))
  except Exception as e:
    raise _triton_failed(fn, targets[0], e) from None


def _requests(fn, specialization, num_warps, num_stages, num_ctas, targets, maxnreg=None,
              extra=()) -> list[_Request]:
  """Each target's compile and Triton's cache key for it, which covers what
  changes Triton's output beyond our inputs: its knobs, ptxas, own code, and
  the specialization (signature, constexprs, attributes)."""
  from triton.backends.compiler import GPUTarget  # noqa: PLC0415  (optional dependency: Triton)
  from triton.compiler import ASTSource, get_cache_key, make_backend  # noqa: PLC0415  (optional dependency: Triton)
  from triton.compiler.compiler import get_cache_invalidating_env_vars  # noqa: PLC0415  (optional dependency: Triton)
  options = {**dict(extra), "num_warps": num_warps, "num_stages": num_stages, "num_ctas": num_ctas}
  if maxnreg is not None:
    options["maxnreg"] = maxnreg
  env_vars = get_cache_invalidating_env_vars()
  requests = []
  for target in targets:
    source = ASTSource(fn, dict(specialization.signature), dict(specialization.constexprs),
                       attrs=dict(specialization.attrs))
    gpu_target = GPUTarget("cuda", target.number, 32)
    try:
      backend = make_backend(gpu_target)
      # As triton.compile parses them: the environment's knobs (TRITON_DEFAULT_FP_FUSION...) are in them.
      parsed = backend.parse_options(dict(options, **source.parse_options()))
      key = get_cache_key(source, backend, parsed, env_vars)
    except Exception as e:
      raise _triton_failed(fn, target, e) from None
    requests.append(_Request(target, gpu_target, source, options, key))
  return requests


def _triton_failed(fn, target, e: Exception) -> CompileError:
  return CompileError(fn.__name__, f"Triton could not compile it for {target.sm}: {type(e).__name__}: {e}",
                               "", "")


def _run_triton(triton, fn, signature, specialization, constexprs, requests, num_warps, num_stages,
                num_ctas, debug=False) -> TritonKernel:
  images, ptx, first, descriptors = [], None, None, None
  flat = tuple(triton_specialize.flat_types(signature))  # tuple parameters' leaves, as the entry takes them
  waits = True
  for request in requests:
    target = request.target
    try:
      compiled = triton.compile(request.source, target=request.gpu_target, options=request.options)
    except Exception as e:
      raise _triton_failed(fn, target, e) from None
    metadata = compiled.metadata
    if debug:  # Triton's debug option: the intermediate forms, as jax-triton's debug=True prints them
      for stage in ("ttir", "ttgir", "llir", "ptx"):
        if stage in compiled.asm:
          print(f"// ---- {fn.__name__} for {target.sm}: {stage} ----\n{compiled.asm[stage]}")
    # Triton builds for the arch-specific target (sm_90a) where there is one: its PTX says which.
    arch = module_format.Arch.parse(ptx_info.target_arch(compiled.asm["ptx"]) or target.sm)
    images.append(Image(ImageKind.CUBIN, arch, bytes(compiled.asm["cubin"])))
    # The descriptors' parameters and encoding are one for the whole module: every target must agree.
    try:
      found = triton_descriptors.metas(getattr(metadata, "tensordesc_meta", None), flat, fn.__name__)
    except ValueError as e:
      raise CompileError(fn.__name__, f"for {target.sm}: {e}", "", "") from None
    if descriptors is not None and found != descriptors:
      raise CompileError(fn.__name__, f"Triton lowers its tensor descriptors differently for {target.sm} than "
                         f"for {requests[0].target.sm} ({found or 'no TMA'} against {descriptors or 'no TMA'}); "
                         "compile it for targets of one family (targets=[...])", "", "")
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
    raise CompileError(fn.__name__, "the kernel asks for a cooperative grid launch, which "
                                "jax_mosaic_ffi does not make", "", "")
  # The parameters passed: the non-constexpr ones (descriptors expanded as Triton's launcher expands them) less
  # those specialized to constexprs, then Triton's scratch.
  n_scratch = (len(sizes) - (triton_descriptors.expanded_param_count(flat, bool(descriptors))
                             - len(specialization.dropped)) if sizes is not None else 2)
  if n_scratch > 2:
    raise CompileError(fn.__name__, f"the compiled kernel takes {n_scratch} parameters after its own, more than "
                       "Triton's global and profile scratch pointers (instrumentation, such as "
                       "TRITON_INSTRUMENTATION_MODE, adds parameters of its own); compile it without", "", "")
  scratch = [(int(getattr(first, "global_scratch_size", 0)), int(getattr(first, "global_scratch_align", 1))),
             (int(getattr(first, "profile_scratch_size", 0)), int(getattr(first, "profile_scratch_align", 1)))]
  info = TritonInfo(num_warps=int(first.num_warps), num_ctas=int(first.num_ctas), shared=int(first.shared),
                    scratch=tuple(scratch[:max(n_scratch, 0)]), signature=tuple(signature),
                    dropped=specialization.dropped,
                    # By position among the parameters passed: descriptors before it expanded, dropped ones gone.
                    aligned=tuple(triton_descriptors.expanded_param_count(flat[:k], bool(descriptors))
                                  - sum(d < k for d in specialization.dropped) for k in specialization.aligned),
                    meta=tuple({**constexprs, "num_warps": num_warps, "num_stages": num_stages,
                                "num_ctas": num_ctas}.items()),
                    triton_version=triton.__version__, tensordesc_meta=descriptors)
  return TritonKernel(fn.__name__, Compiled.of(parsed, sizes), info)


def _to_bytes(kernel: TritonKernel) -> bytes:
  info = dataclasses.asdict(dataclasses.replace(kernel.info, meta=()))  # asdict would deep-copy a function in meta
  info["meta"] = [[k, _key_value(v)] for k, v in kernel.info.meta]  # for the record; meta is rebuilt on load
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
      tensordesc_meta=tuple(triton_descriptors.DescriptorMeta(
          int(d["swizzle"]), int(d["elem_size"]), int(d["elem_type"]), tuple(int(b) for b in d["block_size"]))
          for d in info.get("tensordesc_meta", ()))))
