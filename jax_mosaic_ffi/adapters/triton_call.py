"""`triton_call`: jax-triton's call of a Triton kernel, run by jax_mosaic_ffi's Triton path.

jax-triton 0.4's signature and behaviour (`jax_mosaic_ffi.jax_triton` holds its whole public namespace), made
of what `mosaic_kernel(triton_kernel(fn), ...)` already does: a call is bound as jax-triton binds it, then
becomes one `mosaic_kernel` call::

    kernel parameters, in order         ->  mosaic_kernel
    an array, Ref, scalar, tuple, TensorDescriptor  ->  an operand (call_operands.py)
    a parameter left without argument   ->  the next output of out_type, "outO"
    a constexpr (or a keyword that is not a parameter) -> a metaparameter: constexprs=, and the grid's meta

Aliased outputs share their input's buffer (no parameter of their own); a `Ref` becomes an aliased input and
output whose result is written back into it, which is what jax-triton's discharge of a Ref does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import tree_util

from jax_mosaic_ffi.base import contract
from jax_mosaic_ffi.base import source_location
from jax_mosaic_ffi.base.errors import LaunchError, spell_fallback
from jax_mosaic_ffi.call import launch_values
from jax_mosaic_ffi.call import operands
from jax_mosaic_ffi.call.launch_options import LaunchOptions
from jax_mosaic_ffi.adapters import triton_call_operands as call_operands
from jax_mosaic_ffi.adapters import triton_call_options as call_options
from jax_mosaic_ffi.triton import decorators as triton_decorators
from jax_mosaic_ffi.triton import front_end
from jax_mosaic_ffi.adapters.triton_call_operands import TensorDescriptor
from jax_mosaic_ffi.triton.kernel import TritonFunction, function_type, make_function
from jax_mosaic_ffi.triton.launch_options import TritonLaunchOptions
from jax_mosaic_ffi.triton.compiler.options import LAUNCH_OPTIONS

# What a message about a triton_call tells its user to give for a CPU path: its own argument, not mosaic_kernel's.
spell_fallback("triton_call", "triton_call(..., fallback=fn) (an argument jax-triton's triton_call does not have)",
               "fn is a jax.numpy function of the kernel's operands in parameter order (outputs left out) returning "
               "what the call returns")

# The custom call a `triton_call` lowers to (jax-triton's is "triton_kernel_call_ffi").
CUSTOM_CALL_TARGET_NAME = contract.target_name(collective=False, nvshmem=False, programs=False)


def triton_call(*args, kernel, out_type: Any = None, grid, name: str = "", num_warps: int | None = None,
                num_stages: int | None = None, num_ctas: int | None = None, compute_capability: int | None = None,
                backend_options: Mapping[str, Any] | None = None,
                input_output_aliases: Mapping[int, int] | None = None, zeroed_outputs=(), debug: bool = False,
                serialized_metadata: bytes = b"", cost_estimate: Mapping[str, Any] | None = None,
                has_side_effect: bool = False, fallback: Callable | None = None, **kwargs) -> Any:
  """Calls a Triton kernel on JAX arrays: jax-triton 0.4's ``triton_call``, run by jax_mosaic_ffi.

  ::

      @triton.jit
      def add_kernel(x_ptr, y_ptr, n, out_ptr, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + tl.load(y_ptr + offsets, mask=mask),
                 mask=mask)

      def add(x, y):
        return jmf.triton_call(x, y, x.size, kernel=add_kernel, out_type=jax.typeof(x),
                               grid=lambda meta: triton.cdiv(x.size, meta["BLOCK"]), BLOCK=1024)

      z = jax.jit(add)(x, y)
      zs = jax.vmap(add)(xs, ys)                      # jax-triton refuses vmap; here it runs per element

  The arguments bind to the kernel's parameters by position and by name, as Python binds them: an array or
  ``Ref`` (``jax.new_ref``: updated in place) is a buffer, a tuple of arguments a Triton tuple parameter,
  an int, float or bool a scalar (a Python int is i32, u32, i64 or u64 by its value, a float fp32, or fp64
  when fp32 cannot hold it; numpy scalars keep their type), a `TensorDescriptor` (``jax_triton``'s) a host
  tensor descriptor. The parameters left without an argument get the outputs, in order: one per leaf of
  ``out_type`` (a ``jax.ShapeDtypeStruct``, anything with ``shape`` and ``dtype``, or a pytree of them; the
  result has its structure), less those aliased to an input. Keyword arguments that name constexpr
  parameters, or no parameter, are metaparameters: the constexprs, and the ``meta`` that ``grid`` (an int,
  a tuple of up to 3, or a function of ``meta``) and ``zeroed_outputs`` receive. Constexprs not given take
  their defaults. Integers equal to 1 and multiples of 16 are specialized as Triton's launcher does.

  Args:
    kernel: a ``@triton.jit`` (or ``@gluon.jit``) function, bare or under ``@triton.autotune`` /
      ``@triton.heuristics`` (stacked in either order). Autotuning runs on the GPU before the call is lowered
      and keeps the winner on disk (:doc:`autotuning </guides/autotuning>`); only the winner reaches XLA. Configs
      whose values disagree with metaparameters given here are dropped first, as jax-triton does.
    out_type: the outputs (``out_shape``, jax-triton's older name, is taken too, with a DeprecationWarning).
    grid: launch grid, or a function of ``meta`` returning one.
    name: the call's name in profiles (``jax.named_scope``).
    num_warps, num_stages, num_ctas: Triton's launch options (defaults 4, 3, 1); ``num_ctas`` > 1 launches
      clusters, on sm_90 and newer.
    compute_capability: the target as jax-triton writes it (``90``); by default the visible GPU's, or sm_90
      without a GPU, so a call lowers on a machine without one.
    backend_options: Triton's compile options, by the names of its NVIDIA backend (``enable_fp_fusion``,
      ``maxnreg``, ``extern_libs``, ...), hashable; ``launch_pdl`` is ``mosaic_kernel``'s ``uses_pdl``. Names
      that would change the launch (``launch_cooperative_grid``, ``arch``, ...) are refused by name.
    input_output_aliases: ``{operand index: output index}``: that output is the operand's buffer, updated in
      place (no parameter of its own). Operands are counted as jax-triton counts them: every leaf of the
      non-constexpr arguments, scalars included, in parameter order; outputs are leaves of ``out_type``. It
      combines with ``Ref`` arguments as long as it names none of them.
    zeroed_outputs: output indices (or a function of ``meta`` returning them) zeroed before every launch; an
      aliased output's input is zeroed instead (the kernel sees zeros there, as in jax-triton).
    debug: Triton's ``debug`` option (device assertions), and each compile prints Triton's IRs.
    serialized_metadata: jax-triton's opaque bytes for its own runtime; only ``b""`` is taken.
    cost_estimate: ``{"flops": ..., "bytes_accessed": ...}``, carried as ``cost_estimate_json`` for profilers.
    has_side_effect: keep the call even when its results are unused.
    fallback: (not in jax-triton) a jax.numpy function of the kernel's operands, in parameter order (Refs as
      their values, outputs excluded), returning what the call returns; run instead of the kernel off CUDA.
    **kwargs: operands by parameter name, and metaparameters.

  Beyond jax-triton: ``jax.vmap`` runs the kernel once per batch element; gradients come from
  `jmf.differentiable`, with other kernels as the derivative::

      add_d = jmf.differentiable(add, bwd=lambda g: (g, g))       # the cotangent's kernels, or jax.numpy
      gx, gy = jax.grad(lambda x, y: add_d(x, y).sum(), argnums=(0, 1))(x, y)

  The kernel is compiled by Triton at trace time (per specialization, kept in memory and on disk), and the
  artifact holds its cubin: a warm process, `jax.export` or XLA's compilation cache compile nothing.
  """
  site = source_location.current()
  fn, layers = triton_decorators.unwrap(kernel)
  where = f"triton_call '{name or fn.__name__}' at {site}"
  if serialized_metadata:
    raise ValueError(f"{where}: serialized_metadata is jax-triton's opaque payload for its runtime, which has no "
                     "place in this call; leave it out")
  options = call_options.merged(backend_options, num_warps, num_stages, num_ctas, debug)
  out_flat, out_tree = _outputs(out_type, kwargs, where)
  call_args = _bind(fn, args, kwargs, where)
  buffer_aliases = _aliases(input_output_aliases, call_args, len(out_flat), where)
  function, grid_meta, uses_pdl = _function(fn, layers, call_args, options, compute_capability, where)
  out_avals = _with_refs(out_flat, call_args.operands, buffer_aliases, where)

  def with_grid_meta(meta):
    return {**grid_meta, **meta}

  n_out = len(out_flat)
  zero_outputs = _zeroed(zeroed_outputs, function, with_grid_meta, buffer_aliases, call_args.operands, n_out, where)
  # The options as mosaic_kernel (api.py, a layer above) makes them: the Triton front end's launcher checks them
  # once and resolves them into the CheckedLaunch the call layer takes.
  launch = LaunchOptions(
      input_output_aliases=buffer_aliases or None, zero_outputs=zero_outputs, has_side_effect=has_side_effect,
      cost_estimate=cost_estimate,
      fallback=None if fallback is None else _fallback(fallback, fn, call_args.bound, call_args.operands, n_out,
                                                       where))
  own = TritonLaunchOptions(grid=(lambda meta: grid(with_grid_meta(meta))) if callable(grid) else grid,
                            scalars=tuple(call_args.operands.scalars), uses_pdl=uses_pdl,
                            param_order=tuple(call_args.order))
  # The launch's own messages (its checks, the lowering's) name triton_call at the user's line.
  with source_location.called_as("triton_call"):
    call = front_end.launcher(function, tuple(out_avals), launch, own)
    with jax.named_scope(name) if name else contextlib.nullcontext():
      results = call(*call_args.operands.inputs)
  for (_, ref), value in zip(call_args.operands.refs, results[n_out:]):
    ref[...] = value
  return tree_util.tree_unflatten(out_tree, list(results[:n_out]))


def _outputs(out_type, kwargs: dict, where: str):
  """``out_type`` (or jax-triton's older ``out_shape``, taken out of ``kwargs``) as flat structs and their tree."""
  if "out_shape" in kwargs:
    if out_type is not None:
      raise TypeError("Cannot specify both out_type= and the deprecated out_shape=")
    warnings.warn("out_shape= is deprecated in favor of out_type=", DeprecationWarning, stacklevel=3)
    out_type = kwargs.pop("out_shape")
  elif out_type is None:
    raise TypeError("Either out_type= or the deprecated out_shape= must be provided")
  return tree_util.tree_flatten(launch_values.shape_dtype_tree(out_type, "out_type", where))


@dataclasses.dataclass
class _CallArgs:
  """A call's arguments bound to the kernel's parameters: the operands, each runtime parameter's `param_order`
  entry (None where an output goes: `outputs_left`), and the metaparameters."""

  bound: dict                   # parameter name -> the argument given
  operands: call_operands.Operands
  order: list                   # per runtime parameter: its operand (a tuple for a tuple), or an output
  outputs_left: list[int]       # positions in order that get the outputs
  metaparams: dict              # constexprs (given or defaults) and the keywords that name no parameter
  params: dict                  # parameter name -> Triton's parameter


def _bind(fn, args, kwargs, where: str) -> _CallArgs:
  """Keywords naming a kernel parameter are bound to it, as Python binds them; the rest are metaparameters."""
  params = {p.name: p for p in fn.params}
  metaparams = {p.name: p.default for p in fn.params if p.is_constexpr and p.has_default}
  operand_kwargs = {}
  for key, value in kwargs.items():
    if key in params:
      operand_kwargs[key] = value
    else:
      metaparams[key] = value
  bound = fn.signature.bind_partial(*args, **operand_kwargs).arguments
  found = call_operands.Operands()
  order, outputs_left = [], []
  for param in fn.params:
    if param.is_constexpr:
      if param.name in bound:
        metaparams[param.name] = bound[param.name]
      continue
    if param.name in bound:
      order.append(found.add(bound[param.name], param.name, where))
    else:
      order.append(None)
      outputs_left.append(len(order) - 1)
  return _CallArgs(bound, found, order, outputs_left, metaparams, params)


def _aliases(input_output_aliases, call_args: _CallArgs, n_out: int, where: str) -> dict[int, int]:
  """jax-triton's operand aliases as buffer aliases (input -> output); the unaliased outputs go to the parameters
  left without an argument, in order."""
  if input_output_aliases is not None and not isinstance(input_output_aliases, Mapping):
    raise LaunchError(f"{where}: input_output_aliases must be a dict {{operand index: output index}}, got "
                      f"{input_output_aliases!r}")
  aliases = {launch_values.integer(i, "an input_output_aliases key (an operand index)", where):
             launch_values.integer(o, "an input_output_aliases value (an output index)", where)
             for i, o in (input_output_aliases or {}).items()}
  if len(set(aliases.values())) != len(aliases):
    raise ValueError("input_output_aliases must be a bijection")
  slots = call_args.operands.slots
  buffer_aliases = {}
  for operand, output in aliases.items():
    if not 0 <= operand < len(slots):
      raise ValueError(f"{where}: input_output_aliases key {operand} is not an operand index (the call has "
                       f"{len(slots)} operands, counted over the leaves of its non-constexpr arguments)")
    kind, k = slots[operand]
    if kind == "ref":
      raise ValueError(f"{where}: input_output_aliases names operand {operand}, a Ref: input_output_aliases cannot "
                       "be combined with Ref arguments for the same operand (a Ref is updated in place already)")
    if kind == "scalar":
      raise ValueError(f"{where}: input_output_aliases names operand {operand}, a scalar; it aliases arrays (and "
                       "TensorDescriptors: their arrays)")
    if not 0 <= output < n_out:
      raise ValueError(f"{where}: input_output_aliases value {output} is not an output index (out_type has "
                       f"{n_out})")
    buffer_aliases[k] = output
  unaliased = [o for o in range(n_out) if o not in aliases.values()]
  if len(call_args.outputs_left) != len(unaliased):
    raise ValueError(f"out_type has {len(unaliased)} unaliased outputs, but {len(call_args.outputs_left)} kernel "
                     "parameters are missing an argument")
  for position, output in zip(call_args.outputs_left, unaliased):
    call_args.order[position] = operands.output(output)
  return buffer_aliases


def _function(fn, layers, call_args: _CallArgs, options: dict, compute_capability, where: str):
  """(the kernel as a `TritonFunction`, the metaparameters only grid and zeroed_outputs see, uses_pdl): the
  constexprs and options checked by `triton_kernel`, the decorators pruned to the configs that agree with them."""
  params = call_args.params
  given = {k: v for k, v in call_args.metaparams.items() if k in params}
  layers, constexprs = call_options.metaparams_apart(layers, given, where)
  grid_meta = {k: v for k, v in call_args.metaparams.items() if k not in params}
  launch_options = {k: options.pop(k) for k in LAUNCH_OPTIONS if k in options}
  uses_pdl = options.pop("launch_pdl", None)
  targets = call_options.target(compute_capability, where)
  # A constexpr parameter named like a launch option takes the option (as in Triton's launcher), not its default.
  constexprs = {k: v for k, v in constexprs.items() if k not in LAUNCH_OPTIONS}
  # triton_kernel's checks of the options and constexprs (TritonOptions), for a function of the kernel's language
  # (a @gluon.jit one too); the decorators, pruned above, go back on.
  function_class = function_type(fn)
  base = make_function(function_class, fn, constexprs=constexprs, targets=targets, options=options, **launch_options)
  return function_class(base.fn, base.constexprs, base.options, base.targets, layers), grid_meta, uses_pdl


def _with_refs(out_flat, found: call_operands.Operands, buffer_aliases: dict, where: str) -> list:
  """The outputs, then one per Ref: an aliased input and output each, written back after the call."""
  out_avals = list(out_flat)
  for k, _ in found.refs:
    buffer_aliases[k] = len(out_avals)
    out_avals.append(jax.ShapeDtypeStruct(found.inputs[k].shape, found.inputs[k].dtype))
  if not out_avals:
    raise ValueError(f"{where}: the call has no outputs and no Ref arguments, so nothing the kernel writes could be "
                     "seen; give out_type, or pass the buffers it writes as Refs")
  return out_avals


def _zeroed(zeroed_outputs, function: TritonFunction, with_grid_meta, buffer_aliases: dict,
            found: call_operands.Operands, n_out: int, where: str):
  """``zero_outputs`` for mosaic_kernel. An aliased output's input is replaced by zeros here (the runtime
  zeroes only buffers of their own). A function of ``meta`` on a decorated kernel is evaluated per launch (the
  meta of each config), and may then name unaliased outputs only."""
  aliased = {o: k for k, o in buffer_aliases.items()}

  def evaluated(meta):
    meta = with_grid_meta(meta)
    try:
      return zeroed_outputs(meta)
    except Exception as e:
      name = getattr(zeroed_outputs, "__qualname__", type(zeroed_outputs).__name__)
      raise LaunchError(f"{where}: zeroed_outputs, the callable {name}, raised {type(e).__name__}: {e} for meta "
                        f"{meta}; make it return the indices of the outputs to zero for every meta, or pass them as a "
                        "tuple (zeroed_outputs=(0,))") from e

  def indices(value):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, Sequence) or not all(
        isinstance(o, (int, np.integer)) and not isinstance(o, (bool, np.bool_)) and 0 <= o < n_out for o in value):
      raise ValueError(f"{where}: zeroed_outputs must be indices of outputs (0..{n_out - 1}), got {value!r}")
    return [int(o) for o in value]

  if callable(zeroed_outputs) and function.decorators:
    def per_launch(meta):
      chosen = indices(evaluated(meta))
      inplace = [o for o in chosen if o in aliased]
      if inplace:
        raise ValueError(f"{where}: zeroed_outputs names the aliased output(s) {inplace} for the config {meta}; a "
                         "function of meta on an autotuned kernel may name unaliased outputs only (give a tuple)")
      return tuple(chosen)
    return per_launch
  chosen = indices(evaluated(function.meta) if callable(zeroed_outputs) else zeroed_outputs)
  for o in chosen:
    if o in aliased:
      k = aliased[o]
      found.inputs[k] = jnp.zeros(found.inputs[k].shape, found.inputs[k].dtype)
  return tuple(o for o in chosen if o not in aliased)


def _fallback(fallback: Callable, fn, bound: Mapping[str, Any], found: call_operands.Operands, n_out: int,
              where: str) -> Callable:
  """mosaic_kernel's fallback (flat inputs -> flat outputs) from the user's (the operands in parameter order ->
  what the call returns)."""
  if found.refs:
    raise ValueError(f"{where}: a fallback cannot update Ref arguments; pass arrays (aliased with "
                     "input_output_aliases) instead, or leave fallback out")

  def flat(*inputs):
    leaf = iter(range(len(found.slots)))

    def rebuild(value):
      if isinstance(value, (tuple, list)):
        return tuple(rebuild(v) for v in value)
      if isinstance(value, TensorDescriptor) or call_operands.is_array(value):
        kind, k = found.slots[next(leaf)]
        return dataclasses.replace(value, base=inputs[k]) if kind == "desc" else inputs[k]
      next(leaf)
      return value

    args = [rebuild(bound[p.name]) for p in fn.params if not p.is_constexpr and p.name in bound]
    out = tree_util.tree_leaves(fallback(*args))
    if len(out) != n_out:
      raise ValueError(f"{where}: its fallback returned {len(out)} arrays; out_type has {n_out}")
    return tuple(out)

  return flat
