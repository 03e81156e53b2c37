"""Launching a Triton kernel under ``@triton.autotune`` / ``@triton.heuristics``, as Triton would, at trace time.

    @triton.autotune(configs=[triton.Config({"BLOCK": 256}, num_warps=4),
                              triton.Config({"BLOCK": 1024}, num_warps=8)], key=["n"])
    @triton.heuristics({"EVEN": lambda args: args["n"] % args["BLOCK"] == 0})
    @triton.jit
    def scale(x_ptr, out_ptr, n, BLOCK: tl.constexpr, EVEN: tl.constexpr): ...

    call = jmf.mosaic_kernel(jmf.triton_kernel(scale), lambda x: x,
                             grid=lambda meta, x: jmf.cdiv(x.size, meta["BLOCK"]),
                             scalars=lambda meta, x: (np.int32(x.size),))

When a call is traced, its Triton arguments are built first, as Triton gets
them: each runtime parameter, by name, is a scalar's value (a Python number)
or an array's stand-in (`ArrayArg`: shape, dtype, strides, no data). The
``scalars`` are those arguments, so they are evaluated before any decorator,
with the meta of ``triton_kernel``'s own constexprs and options. Then the
decorators apply outermost first, as Triton's ``run`` chain does:

- ``@triton.heuristics``: each value ``f(args)`` in order, ``args`` being the
  arguments plus the meta so far (a heuristic below ``@triton.autotune`` sees
  each config's values, and overrides them, as in Triton).
- ``@triton.autotune``: ``prune_configs_by`` with Triton's conventions
  (``early_config_prune(configs, named_args, **kwargs)``, ``perf_model(
  **named_args, **kwargs, **config.all_kwargs())``, ``top_k``: an int, or a
  fraction of the configs left, at least one), then one candidate per config
  left, the layers below it applied to each. Several candidates are timed by
  our autotuner (transforms/autotune.py: on the GPU, winner kept in memory and
  on disk); one needs no timing.

Triton's ``key`` re-tunes when the named arguments' values or any tensor's
dtype change; our tuning is scoped by every input's shape and dtype (which fix
every scalar computed from them) and the values of the scalars ``key`` names,
so it is at least as fine. ``reset_to_zero`` names outputs the runtime zeroes
before every launch (``zero_outputs``): Triton zeroes them only around its
timing, but here an output is a fresh buffer on every call. ``restore_value``
needs nothing: a timed launch runs on random inputs of the call's shapes,
and an in-place (aliased) buffer is copied by XLA before the kernel unless the
caller donates it, so timing never writes the caller's arrays. It must name
an aliased buffer. The grid callable gets the final meta (constexprs, the
config's and the heuristics' values, launch options).
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from typing import Callable

import jax
import numpy as np

from jax_mosaic_ffi.base import source_location
from jax_mosaic_ffi.base.errors import LaunchError, who
from jax_mosaic_ffi.call import launch_values
from jax_mosaic_ffi.call import operands
from jax_mosaic_ffi.call.launch_options import LaunchOptions
from jax_mosaic_ffi.call.operands import Kind
from jax_mosaic_ffi.transforms import autotune as autotune_lib
from jax_mosaic_ffi.transforms import untimed
from jax_mosaic_ffi.triton import decorators as triton_decorators
from jax_mosaic_ffi.triton import launch as triton_launch
from jax_mosaic_ffi.triton import tensor_descriptor
from jax_mosaic_ffi.triton.compiler import keys as triton_keys
from jax_mosaic_ffi.triton.decorator_args import ArrayArg
from jax_mosaic_ffi.triton.decorators import Autotune, Heuristics
from jax_mosaic_ffi.triton.kernel import TritonFunction, runtime_params
from jax_mosaic_ffi.triton.launch_options import TritonLaunchOptions

_TUNED_PER_CALL = 32  # config spaces kept per call (one per distinct set of candidates): a bound, not a tuning


@dataclasses.dataclass(frozen=True)
class _Arguments:
  """One traced call's Triton arguments: by parameter name, and where each parameter's buffer sits."""

  named: dict                 # runtime parameter -> ArrayArg or Python number
  entries: dict               # runtime parameter (one buffer or scalar) -> its Operand


def launcher(function: TritonFunction, out_shape, launch: LaunchOptions, options: TritonLaunchOptions):
  """The function of arrays that launches a decorated Triton kernel (module doc); sharding is the caller's."""
  return _Decorated(function, out_shape, launch, options).call


class _Decorated:
  """A decorated kernel's launch, in the steps of one traced call: its Triton `arguments`, the outputs it
  zeroes (`zeroed`), the `candidates` the decorators leave, then one `plain` launch, or an autotuned choice
  among them (`tuned`)."""

  def __init__(self, function: TritonFunction, out_shape, launch: LaunchOptions, options: TritonLaunchOptions):
    self.layers, self.out_shape, self.launch, self.options = function.decorators, out_shape, launch, options
    self.function = function
    self.base = function.with_meta({})  # undecorated; its meta is what the scalars see
    self.param_order = triton_launch.typed_order(options.param_order, f"{source_location.api()} '{function.name}'")
    tuners = [layer for layer in self.layers if isinstance(layer, Autotune)]
    self.tuner = tuners[0] if tuners else None
    self._tuned: collections.OrderedDict = collections.OrderedDict()
    self._lock = threading.Lock()

  def call(self, *arrays):
    where = who(self.function, source_location.current())
    in_avals = tuple(jax.typeof(a) for a in arrays)
    args = self.arguments(in_avals, where)
    zero_outputs = self.zeroed(args, where)
    metas = self.candidates(args, where)
    if len(metas) == 1:  # heuristics only, or one config left: nothing to time
      return self.plain(metas[0], zero_outputs, where)(*arrays)
    return self.tuned(metas, zero_outputs, args, where)(*arrays)

  def arguments(self, in_avals, where) -> _Arguments:
    """The call's Triton arguments, as the decorators see them: each runtime parameter's value (a scalar's) or
    stand-in (an array's), by name."""
    out_avals, _ = launch_values.out_avals(
        launch_values.evaluate(self.out_shape, "out_shape", in_avals, where, follows_shapes=True), where)
    try:
      values = launch_values.evaluate(self.options.scalars, "scalars", in_avals, where, meta=self.base.meta)
    except LaunchError as e:
      if not isinstance(e.__cause__, KeyError):
        raise
      raise LaunchError(f"{where}: a decorated kernel's scalars are its arguments, computed before its configs and "
                        f"heuristics (as Triton's are), so they cannot read meta[{e.__cause__}]; compute them from "
                        "the input avals") from e
    values = tuple(values) if isinstance(values, (tuple, list)) else (values,)
    launch_values.scalars(values, where)
    order = (self.param_order if self.param_order is not None
             else operands.default_order(len(in_avals), len(out_avals), len(values)))
    params = runtime_params(self.base.fn)
    if len(order) != len(params):
      raise LaunchError(
          f"{where}: the Triton function takes {len(params)} non-constexpr parameters ({', '.join(params)}) but "
          f"the call passes {len(order)} ({', '.join(map(str, order))}): inputs, outputs, then scalars, or "
          "param_order")
    named, entries = {}, {}

    def argument(param, entry):
      if isinstance(entry, tuple):  # a Triton tuple parameter: a tuple of arguments
        return tuple(argument(f"{param}[{i}]", e) for i, e in enumerate(entry))
      # A descriptor parameter: the decorators see the array it describes.
      ref = entry.ref if isinstance(entry, tensor_descriptor.TensorDescriptor) else entry
      entries[param] = ref
      avals = {Kind.IN: in_avals, Kind.OUT: out_avals}.get(ref.kind)
      if avals is not None and ref.index < len(avals):
        return ArrayArg(param, avals[ref.index])
      if ref.kind is Kind.SCALAR and ref.index < len(values):
        return np.asarray(values[ref.index]).item()
      raise LaunchError(f"{where}: param_order entry {str(ref)!r} names nothing; use in0.., out0.., scalar0..")

    for param, entry in zip(params, order):
      named[param] = argument(param, entry)
    return _Arguments(named, entries)

  def zeroed(self, args: _Arguments, where) -> tuple | bool:
    """``zero_outputs`` plus the outputs ``reset_to_zero`` names; ``restore_value`` checked."""
    aliases = dict(self.launch.input_output_aliases or {})
    zero_outputs, tuner = self.launch.zero_outputs, self.tuner
    if tuner is None:
      return zero_outputs
    for name in tuner.restore_value + tuner.reset_to_zero:
      if name not in args.entries:
        raise LaunchError(f"{where}: @triton.autotune names {name!r}, a tuple of buffers here; name parameters that "
                          "are one buffer each")
    for name in tuner.restore_value:
      ref = args.entries[name]
      in_place = ((ref.kind is Kind.IN and ref.index in aliases) or
                  (ref.kind is Kind.OUT and ref.index in aliases.values()))
      if not in_place:
        raise LaunchError(f"{where}: @triton.autotune(restore_value=...) names {name!r}, which is {ref} "
                          "here, not updated in place: make it an input aliased to an output (input_output_aliases) "
                          "if the kernel writes it, else drop it from restore_value")
    zero = []
    for name in tuner.reset_to_zero:
      ref = args.entries[name]
      if ref.kind is Kind.OUT and ref.index not in aliases.values():
        zero.append(ref.index)
        continue
      aliased = (ref.kind is Kind.IN and ref.index in aliases) or ref.kind is Kind.OUT
      what = "updated in place (aliased): its values are the caller's" if aliased else "not an output"
      raise LaunchError(f"{where}: @triton.autotune(reset_to_zero=...) names {name!r}, which is {ref} here, "
                        f"{what}; the runtime zeroes outputs the kernel accumulates into before every launch: "
                        "make it an output of its own (not aliased), or drop it from reset_to_zero")
    if zero_outputs is True or not zero:
      return zero_outputs
    if callable(zero_outputs):  # a callable of the meta: evaluated per launch, with reset_to_zero's added
      return _ZeroedPerMeta(zero_outputs, tuple(zero), where)
    return _union(zero_outputs, zero)

  def candidates(self, args: _Arguments, where) -> list[dict]:
    """The final meta of each launch to consider: the decorators applied outermost first."""
    metas = [(self.base.meta, set(self.base.constexprs))]  # (meta, the keys Triton would have in its kwargs)
    for layer in self.layers:
      if isinstance(layer, Heuristics):
        metas = [_heuristics(layer, args.named, meta, passed, where) for meta, passed in metas]
        continue
      ((meta, passed),) = metas  # one autotune, refused twice by triton_decorators
      kwargs = {k: meta[k] for k in passed}
      metas = [({**meta, **config_meta}, passed | config_meta.keys())
               for config_meta in _prune(layer, args.named, kwargs, self.base.fn, where)]
    return [meta for meta, _ in metas]

  def plain(self, meta: dict, zero_outputs, where_scalars):
    """One candidate's call: the undecorated function with this meta; the scalars as the decorators saw them."""
    options = self.options
    if callable(options.scalars):
      given = options.scalars
      options = dataclasses.replace(options, scalars=lambda meta_, *avals: launch_values.evaluate(
          given, "scalars", avals, where_scalars, meta=self.base.meta))
    launch = dataclasses.replace(self.launch, zero_outputs=zero_outputs, sharding=None)
    return triton_launch.launcher(self.base.with_meta(meta), self.out_shape, launch, options)

  def tuned(self, metas: list[dict], zero_outputs, args: _Arguments, where):
    """The autotuned call over these candidates: one per distinct set of them, the latest kept."""
    # A space holding a value that cannot be read whole is its own (each config's compile is keyed by its IR).
    space = (triton_keys.constexpr_key(tuple(tuple(sorted(m.items())) for m in metas)) or f"unkeyed {id(metas)}"
             ) + repr(zero_outputs)
    with self._lock:
      tuned_call = self._tuned.get(space)
      if tuned_call is None:
        key_names = [n for n in self.tuner.key if n in args.named and not _holds_array(args.named[n])]

        def key(*avals):
          named = self.arguments(avals, where).named
          return (tuple((tuple(a.shape), str(a.dtype)) for a in avals), tuple((n, named[n]) for n in key_names))

        factory = lambda meta: self.plain(meta, zero_outputs, where)  # noqa: E731
        name = f"{source_location.api()} {self.base.name} @triton.autotune"
        if self.launch.fallback is None:
          tuned_call = autotune_lib.Autotuned(factory, metas, key=key, name=name)
        else:  # as configs= with a fallback: where nothing can be timed the fallback runs, nothing built or said
          tuned_call = untimed.WithFallback(factory, metas, fallback=self.launch.fallback, key=key, name=name)
        self._tuned[space] = tuned_call
        while len(self._tuned) > _TUNED_PER_CALL:
          self._tuned.popitem(last=False)
      self._tuned.move_to_end(space)
    return tuned_call


def _holds_array(value) -> bool:
  """An array argument, or a tuple holding one: the avals scope the tuning already (`key`)."""
  return isinstance(value, ArrayArg) or (isinstance(value, tuple) and any(_holds_array(v) for v in value))


@dataclasses.dataclass(frozen=True)
class _ZeroedPerMeta:
  """``zero_outputs`` given as a callable of the meta, with the outputs ``reset_to_zero`` names added: evaluated
  per launch (triton/launch.py), with each config's meta. Its repr is the same on every trace of one call, so
  it keys the config space as a tuple would."""

  given: Callable
  more: tuple[int, ...]
  where: str

  def __call__(self, meta, *avals):
    given = launch_values.evaluate(self.given, "zero_outputs", avals, self.where, meta=meta)
    return _union(launch_values.zero_outputs_option(given, self.where), self.more)


def _union(zero_outputs, more) -> tuple | bool:
  if zero_outputs is True:
    return True
  return tuple(sorted(set(zero_outputs or ()) | set(more)))


def _plain_value(value):
  return value.item() if isinstance(value, np.generic) else value


def _heuristics(layer: Heuristics, named: dict, meta: dict, passed: set, where: str):
  meta, passed = dict(meta), set(passed)
  for key, heuristic in layer.values:
    try:
      value = heuristic({**named, **meta})
    except Exception as e:
      raise LaunchError(f"{where}: @triton.heuristics value for {key!r} raised {type(e).__name__}: {e}") from e
    meta[key] = _plain_value(value)
    passed.add(key)
  return meta, passed


def _prune(layer: Autotune, named: dict, kwargs: dict, fn, where: str) -> list[dict]:
  """The configs left by ``prune_configs_by`` (Triton's conventions: module doc), as meta dicts."""
  configs = list(layer.configs)
  if layer.early_config_prune is not None:
    try:
      configs = layer.early_config_prune(configs, dict(named), **kwargs)
    except Exception as e:
      raise LaunchError(f"{where}: prune_configs_by['early_config_prune'] raised {type(e).__name__}: {e}") from e
    configs = list(configs or ())
    if not configs:
      raise LaunchError(f"{where}: prune_configs_by['early_config_prune'] left no config; it must return at least "
                        "one triton.Config")
  params = {p.name: p for p in fn.params}
  try:  # what early_config_prune returns is checked as the decorator's own configs were
    metas = [triton_decorators.check_config(config, fn.__name__, params) for config in configs]
  except (AttributeError, ValueError) as e:
    raise LaunchError(f"{where}: prune_configs_by['early_config_prune'] returned a config that cannot launch: "
                      f"{e}") from e
  if layer.perf_model is not None:
    top_k = layer.top_k
    if isinstance(top_k, float):
      top_k = max(1, int(len(configs) * top_k))
    if len(configs) > top_k:
      estimates = []
      for config in configs:
        try:
          estimates.append(layer.perf_model(**named, **kwargs, **config.all_kwargs()))
        except Exception as e:
          raise LaunchError(f"{where}: prune_configs_by['perf_model'] raised {type(e).__name__}: {e}") from e
      order = sorted(range(len(configs)), key=lambda k: estimates[k])[:top_k]
      metas = [metas[k] for k in order]
  return metas
