"""`mosaic_kernel` and its primitive: abstract eval, vmap, and the missing derivative.

`mosaic_kernel(...)` checks its arguments once (`launch_spec.LaunchOptions`);
each call builds the launch for its input avals, has the runtime's validator
check it, and binds one `mosaic_kernel` primitive. The CUDA lowering is in
`lowering.py`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.extend
import jax.numpy as jnp
from jax._src import dispatch
from jax._src import source_info_util
from jax.interpreters import ad, batching

from jax_mosaic_ffi import call_site as call_site_lib
from jax_mosaic_ffi import fallback as fallback_lib
from jax_mosaic_ffi import launch_spec
from jax_mosaic_ffi import sharding as sharding_lib
from jax_mosaic_ffi.collective import Collective
from jax_mosaic_ffi.kernel import Kernel
from jax_mosaic_ffi.launch_spec import LaunchError, LaunchOptions

source_info_util.register_exclusion(os.path.dirname(__file__))


def mosaic_kernel(kernel: Kernel, out_shape, *, grid, block=None, cluster=None, smem_bytes=0,
                  uses_pdl: bool | None = None, scalars=(),
                  input_output_aliases: Mapping[int, int] | None = None,
                  param_order: Sequence[str] | None = None,
                  collective: Collective | None = None,
                  batch_grid_axis: str | None = None, fallback: Callable | None = None,
                  sharding=None, scratch_bytes=0, zero_scratch: bool = False, zero_outputs=(),
                  configs=None, autotune_key=None, autotune_default=None) -> Callable[..., Any]:
  """Returns a function that launches ``kernel`` on its input arrays.

  The kernel's parameters are, in order: one pointer per input, one pointer
  per output, then each scalar by value (and, for a collective kernel, the
  collective metadata pointer last). ``param_order=("out0", "in0",
  "scalar0", ...)`` names another order; an input and the output it aliases
  are one buffer, so either name passes it once.

  Args:
    kernel: from `cuda_kernel`, `ptx_kernel` or `cubin_kernel`.
    out_shape: a `jax.ShapeDtypeStruct`, or a sequence of them.
    grid, block, cluster: launch dimensions, an int or up to 3 ints.
    smem_bytes: dynamic shared memory per block.
    uses_pdl: launch with programmatic dependent launch (PDL) allowed. By
      default, kernels that are safe for it (`Kernel.pdl_safe`: compiled or
      wrapped by jax_mosaic_ffi for sm_90+) use it; False opts out. True on
      a kernel that reads memory before ``griddepcontrol.wait`` is a race.
    scalars: numpy scalars (any int or float width, or bool), passed by value.
    input_output_aliases: ``{input_index: output_index}`` for in-place updates.
    param_order: an explicit parameter order, by names ``inN``, ``outN``, ``scalarN``.
    collective: a `Collective` for kernels that talk to their peers.
    batch_grid_axis: ``"x"``, ``"y"`` or ``"z"`` for a kernel written to take
      a vmap batch on that grid axis in one launch (README: vmap). By default
      a vmapped call launches the kernel once per batch element, unchanged.
    fallback: a jax.numpy function of the same inputs returning the same
      outputs, run instead of the kernel off CUDA (fallback.py).
    sharding: how the call may be partitioned under ``jit``:
      `Elementwise()`, `BatchDims(...)`, `ShardingRule(...)` (sharding.py).
    scratch_bytes: a scratch buffer of this many bytes for the kernel (split-K
      partials, grid-wide counters): an extra output XLA allocates and the
      call does not return, passed after the outputs or where ``param_order``
      names ``"scratch"``. Its contents are undefined unless ``zero_scratch``.
    zero_scratch: zero the scratch buffer before every launch.

  ``param_order`` may hold `TensorMap` declarations: the kernel then gets a
  TMA descriptor (``CUtensorMap``, 128 bytes, by value) of that input or
  output there, built by the runtime (tensor_map.py).

  ``out_shape``, ``grid``, ``block``, ``smem_bytes`` and ``scalars`` may also
  be callables of the input avals (``grid=lambda x, y: jmf.cdiv(x.size, 256)``),
  evaluated when the call is traced, so one wrapper serves every shape.

  ``zero_outputs`` (output indices, or True for all) are zeroed by the
  runtime before every launch, for kernels that accumulate into them
  (atomics, split-K); an aliased output cannot be zeroed.

  A Triton kernel (`triton_kernel`) takes its block, shared memory and
  cluster from Triton's metadata; its callables get ``(meta, *avals)``.

  ``configs=[{...}, ...]`` autotunes the call (autotuning.py): each config's
  values reach the callables as ``meta`` (and a Triton kernel's
  constexprs, num_warps and num_stages); ``autotune_key`` and
  ``autotune_default`` are `jmf.autotune`'s ``key`` and ``default``.
  """
  options = dict(grid=grid, block=block, cluster=cluster, smem_bytes=smem_bytes, uses_pdl=uses_pdl,
                 scalars=scalars, input_output_aliases=input_output_aliases, param_order=param_order,
                 collective=collective, batch_grid_axis=batch_grid_axis, fallback=fallback, sharding=sharding,
                 scratch_bytes=scratch_bytes, zero_scratch=zero_scratch, zero_outputs=zero_outputs)
  if configs is not None:
    from jax_mosaic_ffi import autotuning
    return autotuning.tuned_mosaic_kernel(kernel, out_shape, configs, key=autotune_key, default=autotune_default,
                                        **options)
  launcher = getattr(kernel, "_jmf_launcher", None)
  if launcher is not None:  # Triton kernels: launch options from the compiled metadata
    return launcher(out_shape, **options)
  if block is None and isinstance(kernel, Kernel):
    raise LaunchError(f"{launch_spec.who(kernel, _call_site())}: block (threads per block) is required")
  return _mosaic_kernel(kernel, out_shape, **options)


def _mosaic_kernel(kernel: Kernel, out_shape, *, grid, block, cluster=None, smem_bytes=0,
                   uses_pdl: bool | None = None, scalars=(), input_output_aliases=None, param_order=None,
                   collective=None, batch_grid_axis=None, fallback=None, sharding=None, scratch_bytes=0,
                   zero_scratch: bool = False, zero_outputs=()) -> Callable[..., Any]:
  """`mosaic_kernel` for a compiled `Kernel`, with every launch option given."""
  where = launch_spec.who(kernel, _call_site()) if isinstance(kernel, Kernel) else ""
  options = LaunchOptions.create(
      kernel, out_shape, grid=grid, block=block, cluster=cluster, smem_bytes=smem_bytes, uses_pdl=uses_pdl,
      scalars=scalars, input_output_aliases=input_output_aliases, param_order=param_order,
      collective=collective, batch_grid_axis=batch_grid_axis, scratch_bytes=scratch_bytes,
      zero_scratch=zero_scratch, zero_outputs=zero_outputs, where=where)
  fallback = fallback_lib.create(fallback, where)
  if sharding is not None:
    sharding_lib.check_per_shard(options, where)

  def call(*args):
    in_avals = tuple(jax.typeof(a) for a in args)
    spec, out_avals, single = options.spec(in_avals, _call_site())
    if launch_spec.empty_outputs(out_avals):
      # Nothing to write, so nothing to launch.
      aliased = {o: i for i, o in spec.aliases}
      outs = [args[aliased[o]] if o in aliased else jnp.zeros(a.shape, a.dtype) for o, a in enumerate(out_avals)]
      return outs[0] if single else tuple(outs)
    options.check(spec, in_avals, out_avals)
    returned = len(out_avals) - spec.num_scratch
    if fallback is not None:
      fallback_lib.check(fallback, in_avals, out_avals[:returned], single, launch_spec.who(kernel, spec.call_site))
      spec = dataclasses.replace(spec, fallback=fallback_lib.with_scratch(fallback, out_avals[returned:]))
    outs = mosaic_kernel_p.bind(*args, kernel=kernel, out_avals=out_avals, spec=spec)[:returned]
    return outs[0] if single else tuple(outs)

  return call if sharding is None else sharding_lib.sharded(call, sharding, name=f"mosaic_kernel '{kernel.name}'")


mosaic_kernel_p = jax.extend.core.Primitive("mosaic_kernel")
mosaic_kernel_p.multiple_results = True
# Outside jit, a call compiles the primitive alone (jax.grad runs the forward eagerly).
mosaic_kernel_p.def_impl(functools.partial(dispatch.apply_primitive, mosaic_kernel_p))


@mosaic_kernel_p.def_abstract_eval
def _abstract_eval(*avals, kernel, out_avals, spec):
  return out_avals


def _call_site() -> str:
  """Where the user called the kernel: "model.py:42 (forward)"."""
  return call_site_lib.current()


def _batching_rule(args, dims, *, kernel, out_avals, spec):
  """vmap as one call: every buffer gets a leading batch axis, and the kernel
  runs once per element (or once, on a longer grid axis, with batch_grid_axis).

  Inputs no element changes stay shared (stride 0). A call that is batched
  already (nested vmap) has its batch axes merged into one: buffers batched
  at only one level are broadcast, so each element sits one stride after the
  last. Aliased inputs are batched too, since each element updates its own.
  """
  where = launch_spec.who(kernel, spec.call_site)
  if spec.collective is not None:
    raise LaunchError(
        f"{where}: a collective kernel cannot be vmapped: its peers are devices, not batch elements. "
        "Call it inside shard_map over a mesh axis instead")
  if spec.tensor_maps:
    raise LaunchError(
        f"{where}: a kernel with TensorMap parameters cannot be vmapped yet: its descriptors describe one "
        "element's arrays. Call it in a lax.map, or give the kernel the batch as a leading array axis")
  size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
  inner = spec.batch_size
  inner_batched = [s > 0 for s in spec.batch_strides[:len(args)]] if inner > 1 else [False] * len(args)
  aliased = {i for i, _ in spec.aliases}
  total = size * inner
  new_args = []
  for i, (a, d, was_batched) in enumerate(zip(args, dims, inner_batched)):
    if d is None and not was_batched and i not in aliased:
      new_args.append(a)
      continue
    a = jnp.moveaxis(a, d, 0) if d is not None else jnp.broadcast_to(a, (size, *a.shape))
    if inner > 1:
      if not was_batched:
        a = jnp.broadcast_to(a[:, None], (size, inner, *a.shape[1:]))
      a = a.reshape((total, *a.shape[2:]))
    new_args.append(a)
  per_element_out = [a.shape[1:] if inner > 1 else a.shape for a in out_avals]
  new_out_avals = tuple(jax.core.ShapedArray((total, *shape), a.dtype) for shape, a in zip(per_element_out, out_avals))
  strides = [0 if (d is None and not b and i not in aliased) else _element_bytes(a, total)
             for i, (a, d, b) in enumerate(zip(new_args, dims, inner_batched))]
  strides += [_element_bytes(a, total) for a in new_out_avals]
  if total == 0:
    outs = [jnp.zeros(a.shape, a.dtype) for a in new_out_avals]
  else:
    fallback = spec.fallback and spec.fallback.vmapped(tuple(0 if s else None for s in strides[:len(args)]))
    batched = dataclasses.replace(spec, batch_size=total, batch_strides=tuple(strides), fallback=fallback)
    launch_spec.check_launch(kernel, batched, [jax.typeof(a) for a in new_args], new_out_avals)
    outs = mosaic_kernel_p.bind(*new_args, kernel=kernel, out_avals=new_out_avals, spec=batched)
  outs = [o.reshape((size, inner, *shape)) if inner > 1 else o for o, shape in zip(outs, per_element_out)]
  return outs, [0] * len(outs)


def _element_bytes(aval, batch: int) -> int:
  return math.prod(aval.shape) * aval.dtype.itemsize // max(batch, 1)


batching.primitive_batchers[mosaic_kernel_p] = _batching_rule


def _no_derivative(primals, tangents, *, kernel, spec, **_):
  raise TypeError(
      f"{launch_spec.who(kernel, spec.call_site)} has no derivative: JAX cannot see inside a hand-written "
      "kernel. Attach one with jmf.differentiable(forward, bwd=..., residuals=(...)), whose backward (and "
      "jvp) can be other mosaic_kernel calls; the README's Transformations section shows how.")


ad.primitive_jvps[mosaic_kernel_p] = _no_derivative

__all__ = ["LaunchError", "mosaic_kernel", "mosaic_kernel_p"]
