"""Sharding under plain `jit`: a kernel declares which dimensions may be split, and runs per shard.

A hand-written kernel is opaque to XLA's partitioner, which would gather its
inputs onto every device and run it whole. `sharded(f, rule)` (or
`mosaic_kernel(..., sharding=rule)`) tells it more through JAX's own
mechanism, `jax.experimental.custom_partitioning` with a Shardy sharding
rule: dimensions that may be split keep the inputs' sharding, the others are
replicated, and ``f`` runs on each device's shard, traced again with the
shard's shapes (so launch parameters given as callables of the input avals
see per-shard avals).

The rules (sharding_rules.py): `Elementwise()`; `BatchDims(inputs=...,
outputs=...)`; and `ShardingRule("b n, b n -> b n", replicated=("n",))`,
Shardy's einsum-like notation. A rule, or a callable of the input avals
returning one, is resolved to `Factors` when the call is traced.

Why a primitive of our own: `custom_partitioning` has no vmap or JVP rule.
`mosaic_sharded` carries the per-shard function and the factors through the
program; vmap adds a (splittable) factor for the new dimension, and only its
lowering builds the `custom_partitioning` call, as JAX's own cuDNN wrappers
do. With one device, or inside shard_map, that call lowers ``f`` directly.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax._src import dispatch
from jax._src.interpreters import mlir
from jax.experimental.custom_partitioning import custom_partitioning
from jax.extend.core import Primitive
from jax.interpreters import ad, batching
from jax.sharding import NamedSharding, PartitionSpec

from jax_mosaic_ffi.base import source_location
from jax_mosaic_ffi.base.errors import LaunchError
from jax_mosaic_ffi.transforms.sharding_rules import RULES, Factors, resolve


def check_per_shard(options, where: str) -> None:
  """A sharded kernel is traced again per shard: what depends on the size must be a callable of the avals."""
  fixed = [name for name in ("out_shape", "grid", "scalars") if not callable(getattr(options, name))]
  if "out_shape" in fixed or {"grid", "scalars"} <= set(fixed):
    raise LaunchError(
        f"{where}: with sharding=, each shard runs the kernel on its own slice, so out_shape and whatever "
        f"depends on the size (grid, scalars) must be callables of the input avals, evaluated per shard "
        f"(out_shape=lambda x: x, grid=lambda x: jmf.cdiv(x.size, 256)); fixed here: {', '.join(fixed)}")


# -------------------------------------------------------------- the call

class PerShard:
  """The function run on each shard, returning a flat list, under the call
  site the user's call had. Equality is identity, so it can sit in a
  primitive's params."""

  def __init__(self, fn: Callable, site: str):
    self.fn, self.site = fn, site

  def __call__(self, *args) -> list:
    with source_location.pinned(self.site):
      return jax.tree.leaves(self.fn(*args))


def sharded(fn: Callable, rule, *, name: str | None = None) -> Callable:
  """``fn`` (arrays in, arrays out), run per shard under ``jit`` as ``rule`` allows.

  ``fn`` must compute each shard's outputs from that shard's inputs alone
  (what the rule declares), with any sizes it needs taken from its inputs'
  shapes: under sharding it is traced again with per-shard shapes. It is
  what ``mosaic_kernel(..., sharding=rule)`` does for a kernel call, for any
  function of arrays (:doc:`sharding under jit </guides/transformations>`)::

    >>> from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
    >>> mesh = jax.make_mesh((jax.device_count(),), ("x",), axis_types=(AxisType.Auto,))
    >>> x = jax.device_put(jnp.ones(1024), NamedSharding(mesh, P("x")))
    >>> add_one = jmf.sharded(lambda x: x + 1, jmf.Elementwise())
    >>> y = jax.jit(add_one)(x)            # each device adds one to its own shard
    >>> y.sharding.spec == P("x"), y[:2].tolist()
    (True, [2.0, 2.0])
  """
  if isinstance(rule, type):
    raise TypeError(f"sharding=jmf.{rule.__name__} is the class; make a rule: jmf.{rule.__name__}(...)")
  if not (isinstance(rule, RULES) or callable(rule)):
    raise TypeError(f"sharding must be jmf.Elementwise(), jmf.BatchDims(...), jmf.ShardingRule(...) or a "
                    f"callable of the input avals returning one, got {rule!r}")
  name = name or f"jmf.sharded({getattr(fn, '__qualname__', fn)!r})"

  @functools.wraps(fn)
  def call(*args):
    site = source_location.current()
    where = f"{name} at {site}"
    per_shard = PerShard(fn, site)
    in_avals = tuple(jax.typeof(a) for a in args)
    out = jax.eval_shape(per_shard.fn, *(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in in_avals))
    leaves, tree = jax.tree.flatten(out)
    out_avals = tuple(jax.core.ShapedArray(o.shape, o.dtype) for o in leaves)
    factors = resolve(rule, in_avals, out_avals, where)
    outs = mosaic_sharded_p.bind(*args, fn=per_shard, factors=factors, out_avals=out_avals, where=where)
    return jax.tree.unflatten(tree, outs)

  return call


mosaic_sharded_p = Primitive("mosaic_sharded")
mosaic_sharded_p.multiple_results = True
mosaic_sharded_p.def_abstract_eval(lambda *avals, out_avals, **_: out_avals)
mosaic_sharded_p.def_impl(functools.partial(dispatch.apply_primitive, mosaic_sharded_p))
# The partitioner callback needs the mesh, which lowering has only when asked for.
dispatch.prim_requires_devices_during_lowering.add(mosaic_sharded_p)


def _spec_entries(sharding, rank: int):
  spec = getattr(sharding, "spec", None)
  if spec is None:
    return None
  entries = tuple(None if e is PartitionSpec.UNCONSTRAINED else e for e in spec)
  return entries + (None,) * (rank - len(entries))


def _choose(factors: Factors, mesh, arg_shapes):
  """Shardings that keep each splittable factor's mesh axes (those of the
  first input that splits it) and replicate everything else."""
  axes: dict[str, Any] = {}
  used: set[str] = set()
  for mapping, arg in zip(factors.operands, arg_shapes):
    entries = _spec_entries(arg.sharding, len(mapping))
    for f, entry in zip(mapping, entries or ()):
      if entry is None or f in factors.replicated or f in axes:
        continue
      names = (entry,) if isinstance(entry, str) else tuple(entry)
      if used.isdisjoint(names):  # a mesh axis can split only one factor
        axes[f] = entry
        used.update(names)
  named = lambda m: NamedSharding(mesh, PartitionSpec(*(axes.get(f) for f in m)))  # noqa: E731
  return tuple(map(named, factors.operands)), tuple(map(named, factors.results))


def _tile(shape, sharding) -> tuple[int, ...]:
  """A shard's shape; XLA pads a dimension that does not divide evenly."""
  parts = [1 if e is None else math.prod(sharding.mesh.shape[a] for a in ((e,) if isinstance(e, str) else e))
           for e in _spec_entries(sharding, len(shape))]
  return tuple(-(-d // p) for d, p in zip(shape, parts))


def _partition(fn: PerShard, factors: Factors, out_avals, where: str, mesh, arg_shapes, result_shape):
  if mesh.empty:
    raise LaunchError(f"{where}: its inputs are sharded without a mesh; shard them with "
                      "jax.sharding.NamedSharding(mesh, PartitionSpec(...))")
  arg_shardings, result_shardings = _choose(factors, mesh, arg_shapes)
  tiles = [jax.ShapeDtypeStruct(_tile(a.shape, s), a.dtype) for s, a in zip(arg_shardings, arg_shapes)]
  want = [(_tile(a.shape, s), a.dtype) for s, a in zip(result_shardings, out_avals)]
  got = [(tuple(o.shape), o.dtype) for o in jax.eval_shape(fn, *tiles)]
  if got != want:
    raise LaunchError(
        f"{where}: on a shard of inputs ({', '.join(f'{t.dtype}{list(t.shape)}' for t in tiles)}) it returns "
        f"{[f'{d}{list(s)}' for s, d in got]}, not the shard of its outputs {[f'{d}{list(s)}' for s, d in want]}. "
        "Give out_shape (and grid, scalars) as callables of the input avals, so each shard gets its own")
  return mesh, lambda *args: tuple(fn(*args)), result_shardings, arg_shardings


def _infer(factors: Factors, mesh, arg_shapes, result_shape):
  """For the older GSPMD partitioner (jax_use_shardy_partitioner=False)."""
  return _choose(factors, mesh, arg_shapes)[1]


def _lowering(ctx, *operands, fn: PerShard, factors: Factors, out_avals, where: str):
  call = custom_partitioning(lambda *args: tuple(fn(*args)))
  call.def_partition(functools.partial(_partition, fn, factors, out_avals, where),
                     infer_sharding_from_operands=functools.partial(_infer, factors),
                     sharding_rule=factors.sdy_rule())
  return mlir.lower_fun(lambda *args: list(call(*args)), multiple_results=True)(ctx, *operands)


def _batching(args, dims, *, fn: PerShard, factors: Factors, out_avals, where: str):
  """vmap of a sharded call: the vmapped function, with the new dimension as one more splittable factor."""
  mapped = [d is not None for d in dims]
  size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
  moved = [jnp.moveaxis(a, d, 0) if d is not None else a for a, d in zip(args, dims)]
  batched_fn = PerShard(jax.vmap(fn, in_axes=tuple(0 if m else None for m in mapped), out_axes=0), fn.site)
  outs = mosaic_sharded_p.bind(
      *moved, fn=batched_fn, factors=factors.batched(mapped), where=where,
      out_avals=tuple(jax.core.ShapedArray((size,) + a.shape, a.dtype) for a in out_avals))
  return outs, [0] * len(outs)


def _jvp(primals, tangents, *, fn: PerShard, **_):
  # Differentiates the function itself (a kernel's comes from jmf.differentiable),
  # unpartitioned: put the sharding on the kernels inside jmf.differentiable.
  tangents = [ad.instantiate_zeros(t) for t in tangents]
  return jax.jvp(fn, list(primals), tangents)


mlir.register_lowering(mosaic_sharded_p, _lowering)
batching.primitive_batchers[mosaic_sharded_p] = _batching
ad.primitive_jvps[mosaic_sharded_p] = _jvp
