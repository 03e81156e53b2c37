"""Sharding under plain `jit`: a kernel declares which dimensions may be split, and runs per shard.

A hand-written kernel is opaque to XLA's partitioner, which would gather its
inputs onto every device and run it whole. `sharded(f, rule)` (or
`mosaic_kernel(..., sharding=rule)`) tells it more through JAX's own
mechanism, `jax.experimental.custom_partitioning` with a Shardy sharding
rule: dimensions that may be split keep the inputs' sharding, the others are
replicated, and ``f`` runs on each device's shard, traced again with the
shard's shapes (so launch parameters given as callables of the input avals
see per-shard avals).

The rules: `Elementwise()`; `BatchDims(inputs=..., outputs=...)`; and
`ShardingRule("b n, b n -> b n", replicated=("n",))`, Shardy's einsum-like
notation. A rule, or a callable of the input avals returning one, is resolved
to `Factors` when the call is traced.

Why a primitive of our own: `custom_partitioning` has no vmap or JVP rule.
`mosaic_sharded` carries the per-shard function and the factors through the
program; vmap adds a (splittable) factor for the new dimension, and only its
lowering builds the `custom_partitioning` call, as JAX's own cuDNN wrappers
do. With one device, or inside shard_map, that call lowers ``f`` directly.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
from jax._src import dispatch
from jax._src.interpreters import mlir
from jax.experimental.custom_partitioning import ArrayMapping, SdyShardingRule, custom_partitioning
from jax.extend.core import Primitive
from jax.interpreters import ad, batching
from jax.sharding import NamedSharding, PartitionSpec

from jax_mosaic_ffi.base import source_location
from jax_mosaic_ffi.base.errors import LaunchError


# ------------------------------------------------------------------ rules

@dataclasses.dataclass(frozen=True)
class Elementwise:
  """Every input and output has one shape (rank-0 inputs are broadcast); any dimension may be split.

  A rule for ``mosaic_kernel(..., sharding=...)`` or `sharded`::

    >>> double = jmf.sharded(lambda x: 2 * x, jmf.Elementwise())
    >>> jax.jit(double)(jnp.arange(4.0)).tolist()
    [0.0, 2.0, 4.0, 6.0]
  """


def _dim_entries(value, what: str) -> Any:
  """An int, None, or a tuple of ints (several batch dimensions)."""
  if value is None or (isinstance(value, int) and not isinstance(value, bool)):
    return value
  if isinstance(value, (tuple, list)) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
    return tuple(value)
  raise TypeError(f"BatchDims: each entry of {what} must be a dimension (int), None or a tuple of dimensions, "
                  f"got {value!r}")


@dataclasses.dataclass(frozen=True)
class BatchDims:
  """Which dimensions of each input and output are batch dimensions; only those may be split.

  ``inputs`` / ``outputs``: a sequence with one entry per input / output, or
  a single int (or None) for all of them. An entry is a dimension (negative
  counts from the end), a tuple of dimensions (the k-th batch dimension of
  every array is one factor), or, for inputs only, None: not batched
  (weights), so replicated. ``BatchDims(0, 0)``: everything is batched along
  dimension 0; ``BatchDims(inputs=(0, None), outputs=(0,))``: a batch and a
  shared weight::

    >>> scale_rows = jmf.sharded(lambda x, w: x * w, jmf.BatchDims(inputs=(0, None), outputs=(0,)))
    >>> jax.jit(scale_rows)(jnp.ones((8, 4)), jnp.full(4, 2.0))[0].tolist()   # rows may be split, w not
    [2.0, 2.0, 2.0, 2.0]
  """

  inputs: Any = 0
  outputs: Any = 0

  def __post_init__(self):
    for field in ("inputs", "outputs"):
      value = getattr(self, field)
      if isinstance(value, (tuple, list)):
        value = tuple(_dim_entries(v, field) for v in value)
      elif not (value is None or isinstance(value, int) and not isinstance(value, bool)):
        raise TypeError(f"BatchDims: {field} must be a dimension (int), None, or a sequence with one entry "
                        f"per array, got {value!r}")
      object.__setattr__(self, field, value)


@dataclasses.dataclass(frozen=True)
class ShardingRule:
  """A custom rule in Shardy's einsum-like notation: one space-separated factor per dimension.

  ``ShardingRule("m k, k n -> m n", replicated=("k",))``: m and n may be
  split; k may not (the kernel would need a reduction across devices). A
  factor that is in no input, or not in every output, is never split.
  A rank-0 array has an empty entry (``"i, -> i"``)::

    >>> matmul = jmf.sharded(lambda a, b: a @ b, jmf.ShardingRule("m k, k n -> m n", replicated=("k",)))
    >>> jax.jit(matmul)(jnp.ones((8, 4)), jnp.ones((4, 2))).shape
    (8, 2)
  """

  rule: str
  replicated: tuple[str, ...] = ()

  def __post_init__(self):
    if not isinstance(self.rule, str) or self.rule.count("->") != 1:
      raise ValueError(f"ShardingRule needs 'inputs -> outputs', like 'b n, b n -> b n', got {self.rule!r}")
    if isinstance(self.replicated, str):
      object.__setattr__(self, "replicated", (self.replicated,))
    object.__setattr__(self, "replicated", tuple(self.replicated))


RULES = (Elementwise, BatchDims, ShardingRule)


@dataclasses.dataclass(frozen=True)
class Factors:
  """A rule resolved for concrete avals: a factor name per dimension, and the factors never split."""

  operands: tuple[tuple[str, ...], ...]
  results: tuple[tuple[str, ...], ...]
  replicated: frozenset

  def sdy_rule(self) -> SdyShardingRule:
    used = {f for m in self.operands + self.results for f in m}
    return SdyShardingRule(tuple(ArrayMapping(*m) for m in self.operands),
                           tuple(ArrayMapping(*m) for m in self.results),
                           need_replication_factors=tuple(sorted(self.replicated & used)))

  def batched(self, mapped: Sequence[bool]) -> "Factors":
    """The rule under vmap: a new leading factor on the mapped inputs and every output; it may be split."""
    used = {f for m in self.operands + self.results for f in m}
    new = next(f"v{k}" for k in range(len(used) + 1) if f"v{k}" not in used)
    return Factors(tuple((new,) + m if b else m for m, b in zip(self.operands, mapped)),
                   tuple((new,) + m for m in self.results), self.replicated)


def _shape(a) -> str:
  return f"{a.dtype}{list(a.shape)}"


def _finish(operands, results, replicated, in_avals, out_avals, where: str) -> Factors:
  """Checks ranks and sizes, and adds the factors that can never be split."""
  for kind, mappings, avals in (("input", operands, in_avals), ("output", results, out_avals)):
    if len(mappings) != len(avals):
      raise LaunchError(f"{where}: the sharding rule names {len(mappings)} {kind}s, the call has {len(avals)}")
    for i, (m, a) in enumerate(zip(mappings, avals)):
      if len(m) != len(a.shape):
        raise LaunchError(f"{where}: the sharding rule gives {kind} {i} ({_shape(a)}) {len(m)} dimensions "
                          f"({' '.join(m) or 'none'}); it has {len(a.shape)}")
  sizes: dict[str, int] = {}
  for m, a in zip(operands + results, tuple(in_avals) + tuple(out_avals)):
    for f, d in zip(m, a.shape):
      if sizes.setdefault(f, d) != d:
        raise LaunchError(f"{where}: sharding factor {f!r} has size {sizes[f]} in one array and {d} in another")
  in_some_input = {f for m in operands for f in m}
  in_every_output = set.intersection(*(set(m) for m in results)) if results else set()
  # Split only what each shard can compute alone: a factor missing from an
  # output would need a reduction, one missing from the inputs a shard index.
  never = {f for f in sizes if f not in in_some_input or f not in in_every_output}
  return Factors(tuple(operands), tuple(results), frozenset(set(replicated) | never))


def _parse(rule: ShardingRule, where: str):
  lhs, rhs = rule.rule.split("->")
  def side(text):
    entries = tuple(tuple(part.split()) for part in text.split(","))
    for entry in entries:
      for f in entry:
        if not (f[0].isalpha() and f.replace("_", "").isalnum()):
          raise LaunchError(f"{where}: sharding factor {f!r} in {rule.rule!r} must be a name (letters, digits, "
                            "_); write one factor per dimension (no '...' or compound factors)")
    return entries
  operands, results = side(lhs), side(rhs)
  unknown = set(rule.replicated) - {f for m in operands + results for f in m}
  if unknown:
    raise LaunchError(f"{where}: replicated names {sorted(unknown)}, which are not factors of {rule.rule!r}")
  return operands, results


def _batch_mappings(entries, avals, kind: str, prefix: str, where: str):
  if not isinstance(entries, tuple):
    entries = (entries,) * len(avals)  # one entry for every array
  if len(entries) != len(avals):
    raise LaunchError(f"{where}: BatchDims has {len(entries)} {kind} entries, the call has {len(avals)} {kind}s")
  mappings = []
  for i, (entry, a) in enumerate(zip(entries, avals)):
    dims = () if entry is None else (entry,) if isinstance(entry, int) else entry
    if len({d % max(len(a.shape), 1) for d in dims}) != len(dims):
      raise LaunchError(f"{where}: BatchDims names one dimension of {kind} {i} twice: {entry}")
    if entry is None and kind == "output":
      raise LaunchError(f"{where}: BatchDims output {i} has no batch dimension; every output needs one (a shard "
                        "cannot compute an output that depends on the whole batch)")
    names = [f"{prefix}{i}_{d}" for d in range(len(a.shape))]
    for k, d in enumerate(dims):
      if not -len(a.shape) <= d < len(a.shape):
        raise LaunchError(f"{where}: BatchDims puts batch dimension {d} on {kind} {i} ({_shape(a)})")
      names[d % len(a.shape)] = f"b{k}"
    mappings.append(tuple(names))
  return tuple(mappings), {f for m in mappings for f in m if not f.startswith("b")}


def resolve(rule, in_avals, out_avals, where: str) -> Factors:
  if callable(rule) and not isinstance(rule, RULES):
    rule = rule(*in_avals)
  if isinstance(rule, Elementwise):
    shapes = {tuple(a.shape) for a in list(in_avals) + list(out_avals) if a.shape != ()}
    if len(shapes) > 1 or any(a.shape == () for a in out_avals) and shapes:
      raise LaunchError(f"{where}: Elementwise needs every input and output of one shape (or rank-0 inputs); got "
                        f"inputs ({', '.join(map(_shape, in_avals))}) and outputs "
                        f"({', '.join(map(_shape, out_avals))}); use BatchDims or ShardingRule")
    mapping = lambda a: tuple(f"d{k}" for k in range(len(a.shape)))  # noqa: E731
    return _finish(tuple(map(mapping, in_avals)), tuple(map(mapping, out_avals)), (), in_avals, out_avals, where)
  if isinstance(rule, BatchDims):
    operands, rep_in = _batch_mappings(rule.inputs, in_avals, "input", "i", where)
    results, rep_out = _batch_mappings(rule.outputs, out_avals, "output", "o", where)
    return _finish(operands, results, rep_in | rep_out, in_avals, out_avals, where)
  if isinstance(rule, ShardingRule):
    operands, results = _parse(rule, where)
    return _finish(operands, results, rule.replicated, in_avals, out_avals, where)
  raise TypeError(f"{where}: sharding must be jmf.Elementwise(), jmf.BatchDims(...), jmf.ShardingRule(...) or a "
                  f"callable of the input avals returning one, got {rule!r}")


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
