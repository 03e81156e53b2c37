"""What Triton's decorators on a kernel declare: ``@triton.autotune`` and ``@triton.heuristics``, read as data.

Triton kernels arrive decorated::

    @triton.autotune(configs=[triton.Config({"BLOCK": 128}, num_warps=4), ...], key=["n"])
    @triton.heuristics({"EVEN": lambda args: args["n"] % args["BLOCK"] == 0})
    @triton.jit
    def kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, EVEN: tl.constexpr): ...

`unwrap` walks such a stack down to the ``@triton.jit`` function and returns
its layers, outermost first, as `Autotune` and `Heuristics` records: what
`decorated.py` needs to launch the kernel as Triton would,
inside a compiled XLA program. What cannot have a meaning there is refused
here, by name, with what to use instead, when the kernel is made (not when it
is first traced): hooks (Python run on the GPU tensors around each launch),
a benchmarking function, IR overrides, and names that are not the kernel's
parameters.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from jax_mosaic_ffi.triton.compiler.options import LAUNCH_OPTIONS, TritonOptions


@dataclasses.dataclass(frozen=True, eq=False)
class Autotune:
  """``@triton.autotune``: the configs to time, and what Triton does around each timed launch."""

  configs: tuple            # triton.Config objects, as early_config_prune receives and returns them
  key: tuple[str, ...]
  reset_to_zero: tuple[str, ...]
  restore_value: tuple[str, ...]
  early_config_prune: Callable | None
  perf_model: Callable | None
  top_k: int | float


@dataclasses.dataclass(frozen=True, eq=False)
class Heuristics:
  """``@triton.heuristics``: meta-parameters computed from the call's arguments, in order."""

  values: tuple[tuple[str, Callable], ...]


def config_meta(config) -> dict[str, Any]:
  """A ``triton.Config`` as our meta: its kwargs and its launch options (maxnreg only where set)."""
  options = TritonOptions(config.num_warps, config.num_stages, config.num_ctas, config.maxnreg)
  return {**config.kwargs, **options.meta()}


def unwrap(fn, made: str = "jmf.triton_kernel",
           jit: str = "@triton.jit") -> tuple[Any, tuple[Autotune | Heuristics, ...]]:
  """The JIT function under ``fn`` (``@triton.jit``, or another language Triton compiles, such as ``@gluon.jit``)
  and its decorators, outermost first (refusals: module doc); ``made`` and ``jit``: the caller and the decorator
  it takes, as messages name them."""
  from triton.runtime.autotuner import Autotuner  # noqa: PLC0415  (optional dependency: Triton)
  from triton.runtime.autotuner import Heuristics as TritonHeuristics  # noqa: PLC0415  (optional dependency)
  from triton.runtime.jit import JITFunction  # noqa: PLC0415  (optional dependency: Triton)
  layers, outer = [], fn
  while not isinstance(fn, JITFunction):
    if isinstance(fn, (Autotuner, TritonHeuristics)):
      layers.append(fn)
    elif layers:
      raise TypeError(f"{made}: {type(outer).__name__} wraps a {type(fn).__name__}, not a {jit} function; the "
                      "decorators it reads are @triton.autotune and @triton.heuristics")
    else:
      raise TypeError(f"{made} needs a {jit} function, got {type(fn).__name__}")
    fn = fn.fn
  name = fn.__name__
  params = {p.name: p for p in fn.params}
  read = []
  for layer in layers:
    read.append(_autotune(layer, name, params) if isinstance(layer, Autotuner) else _heuristics(layer, name, params))
  _check_stack(read, name)
  return fn, tuple(read)


def check_constexprs(layers, constexprs, name: str) -> None:
  """``constexprs=`` may not set what a decorator sets (Triton: "Conflicting meta-parameters")."""
  for layer in layers:
    for config in layer.configs if isinstance(layer, Autotune) else ():
      for key in constexprs.keys() & config.kwargs.keys():
        raise ValueError(f"triton_kernel '{name}': constexprs= sets {key!r}, which a @triton.autotune config sets "
                         "too; drop it from constexprs=")
    for key, _ in layer.values if isinstance(layer, Heuristics) else ():
      if key in constexprs:
        raise ValueError(f"triton_kernel '{name}': constexprs= sets {key!r}, which @triton.heuristics computes; "
                         "drop it from constexprs=")


class NotSupported(ValueError, NotImplementedError):
  """A decorator feature that cannot have a meaning inside a compiled XLA program: a ValueError (a bad value
  for this runtime) that is also the NotImplementedError jax-triton raises for the same features."""


def _bad(name: str, what: str, instead: str) -> NotSupported:
  return NotSupported(f"triton_kernel '{name}': {what} is not supported: {instead}")


def _names(name: str, what: str, values, params: dict, *, runtime: bool) -> tuple[str, ...]:
  values = tuple(values or ())
  for value in values:
    if value not in params:
      raise ValueError(f"triton_kernel '{name}': @triton.autotune({what}=...) names {value!r}, which is not a "
                       f"parameter of the kernel ({', '.join(params)})")
    if runtime and params[value].is_constexpr:
      raise ValueError(f"triton_kernel '{name}': @triton.autotune({what}=...) names {value!r}, a tl.constexpr "
                       "parameter; it takes the pointers of buffers the kernel writes")
  return values


def check_config(config, name: str, params: dict) -> dict[str, Any]:
  """A ``triton.Config`` this runtime can launch, as our meta (refusals: module doc)."""
  if getattr(config, "pre_hook", None) is not None:
    raise _bad(name, "triton.Config(pre_hook=...)",
               "a hook runs Python on the GPU tensors before each launch, which a compiled XLA program cannot "
               "call. For outputs the kernel accumulates into use @triton.autotune(reset_to_zero=[...]) (the "
               "runtime zeroes them before every launch); a hook that sets a tensor descriptor's block shape "
               "becomes a block shape computed from the config's meta; anything else, compute with JAX before "
               "the call")
  if getattr(config, "ir_override", None) is not None:
    raise _bad(name, "triton.Config(ir_override=...)", "the kernel is compiled from its Python source; drop it")
  for key in config.kwargs:
    if key in LAUNCH_OPTIONS:
      raise _bad(name, f"a triton.Config whose kwargs set {key!r}", f"pass it as triton.Config(..., {key}=...)")
    if key not in params or not params[key].is_constexpr:
      raise ValueError(f"triton_kernel '{name}': a @triton.autotune config sets {key!r}, which is not one of the "
                       f"kernel's tl.constexpr parameters ({', '.join(p for p in params if params[p].is_constexpr)})")
  meta = config_meta(config)
  for key in LAUNCH_OPTIONS:
    value = meta.get(key)
    if key in meta and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
      raise ValueError(f"triton_kernel '{name}': a @triton.autotune config has {key}={value!r}; it must be a "
                       "positive int")
  return meta


def _autotune(tuner, name: str, params: dict) -> Autotune:
  if getattr(tuner, "user_defined_pre_hook", False):
    raise _bad(name, "@triton.autotune(pre_hook=...)",
               "a hook runs Python on the GPU tensors before each launch, which a compiled XLA program cannot "
               "call. Use reset_to_zero=[...] for outputs the kernel accumulates into (the runtime zeroes them "
               "before every launch), or prepare the inputs with JAX before the call")
  if getattr(tuner, "user_defined_post_hook", False):
    raise _bad(name, "@triton.autotune(post_hook=...)",
               "a hook runs Python on the GPU tensors after each launch, which a compiled XLA program cannot call. "
               "restore_value=[...] needs no hook here (timing never writes the caller's arrays); post-process the "
               "outputs with JAX after the call")
  legacy = (getattr(tuner, "num_warmups", None) is not None or getattr(tuner, "num_reps", None) is not None
            or getattr(tuner, "use_cuda_graph", False))
  # warmup=, rep= and use_cuda_graph= make Triton build its own do_bench; only a do_bench the user gave is refused.
  if getattr(tuner, "_do_bench", None) is not None and not legacy:
    raise _bad(name, "@triton.autotune(do_bench=...)",
               "jax_mosaic_ffi times each config's compiled XLA executable itself (warm-up, then the median of "
               "rounds of back-to-back calls on the default device); a benchmarking function times Python launches "
               "on another stream. Drop do_bench")
  configs = tuple(tuner.configs)
  for config in configs:
    check_config(config, name, params)
  prune = getattr(tuner, "early_config_prune", None)
  perf_model = getattr(tuner, "perf_model", None)
  top_k = getattr(tuner, "configs_top_k", 1.0)
  for what, value in (("early_config_prune", prune), ("perf_model", perf_model)):
    if value is not None and not callable(value):
      raise ValueError(f"triton_kernel '{name}': prune_configs_by['{what}'] must be a function, got {value!r}")
  if isinstance(top_k, bool) or not (isinstance(top_k, int) or (isinstance(top_k, float) and top_k <= 1.0)):
    raise ValueError(f"triton_kernel '{name}': prune_configs_by['top_k'] must be an int or a float <= 1.0, "
                     f"got {top_k!r}")
  return Autotune(
      configs=configs, key=_names(name, "key", tuner.keys, params, runtime=False),
      reset_to_zero=_names(name, "reset_to_zero", tuner.reset_to_zero, params, runtime=True),
      restore_value=_names(name, "restore_value", tuner.restore_value, params, runtime=True),
      early_config_prune=prune, perf_model=perf_model, top_k=top_k)


def _heuristics(heuristics, name: str, params: dict) -> Heuristics:
  values = dict(heuristics.values)
  for key, fn in values.items():
    if key not in LAUNCH_OPTIONS and (key not in params or not params[key].is_constexpr):
      raise ValueError(f"triton_kernel '{name}': @triton.heuristics computes {key!r}, which is not one of the "
                       f"kernel's tl.constexpr parameters nor a launch option ({', '.join(LAUNCH_OPTIONS)})")
    if not callable(fn):
      raise ValueError(f"triton_kernel '{name}': @triton.heuristics value for {key!r} must be a function of the "
                       f"arguments, got {fn!r}")
  return Heuristics(tuple(values.items()))


def _check_stack(layers, name: str) -> None:
  """What Triton itself would refuse at the first launch, refused now."""
  tuners = [layer for layer in layers if isinstance(layer, Autotune)]
  if len(tuners) > 1:
    raise _bad(name, "more than one @triton.autotune on a kernel", "merge their configs into one")
  if not tuners:
    return
  above = layers[:layers.index(tuners[0])]
  for layer in above:
    for key, _ in layer.values:
      if key in LAUNCH_OPTIONS or any(key in config.kwargs for config in tuners[0].configs):
        # Triton: "Conflicting meta-parameters" (or a keyword passed twice) at the first launch.
        raise ValueError(f"triton_kernel '{name}': @triton.heuristics above @triton.autotune computes {key!r}, "
                         "which the autotune configs set too; put the heuristic below @triton.autotune (it then "
                         "sees each config's values) or drop it")
