"""The sharding rules a kernel declares (`Elementwise`, `BatchDims`, `ShardingRule` in Shardy's einsum-like
notation), and `resolve`: a rule, for one call's avals, as the `Factors` of each operand and result (which may be
split, which are replicated) that sharding.py hands XLA's partitioner.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from jax.experimental.custom_partitioning import ArrayMapping, SdyShardingRule

from jax_mosaic_ffi.base.errors import LaunchError


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
    # Shardy numbers the factors in the order they first appear and wants the ones kept whole in that order.
    appearing = dict.fromkeys(f for m in self.operands + self.results for f in m)
    return SdyShardingRule(tuple(ArrayMapping(*m) for m in self.operands),
                           tuple(ArrayMapping(*m) for m in self.results),
                           need_replication_factors=tuple(f for f in appearing if f in self.replicated))

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
