"""The inputs a check runs on: the cases (shapes and dtypes) and fresh random arrays of each.

The cases come from the example arguments: their own shapes and dtypes, then (``shapes="edges"``) the edges a
kernel gets wrong, each size of the examples changed everywhere it occurs, one at a time: to a size no block
divides (an even size ``n`` becomes ``n - 1``, 2 becomes 3) and to 1. A size is a dimension's length; the same
length in two arguments is taken to be the same dimension (``(m, k) @ (k, n)``), so the arguments stay compatible.
Each case is then run in every dtype of ``dtypes`` (the floating-point arguments cast to it).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

# At most this many derived cases beyond the examples' own.
MAX_EDGES = 8


@dataclasses.dataclass(frozen=True)
class Case:
  """One set of input avals (a flat list, with the arguments' tree) and what it is."""

  avals: tuple[jax.ShapeDtypeStruct, ...]
  tree: Any
  derived: bool  # an edge the examples did not name: a function that refuses it is skipped, not failed

  def describe(self) -> str:
    return ", ".join(f"{np.dtype(a.dtype).name}{list(a.shape)}" for a in self.avals)


def _aval(x) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct(np.shape(x), jnp.result_type(x))


def _floating(dtype) -> bool:
  return jnp.issubdtype(dtype, jnp.floating)


def _edges(sizes: set[int]) -> list[tuple[int, int]]:
  """(size, replacement) pairs: not a multiple of any block, then 1."""
  ragged = [(n, n - 1 if n % 2 == 0 and n > 2 else 3) for n in sorted(sizes, reverse=True) if n % 2 == 0]
  ones = [(n, 1) for n in sorted(sizes, reverse=True) if n > 1]
  return ragged + ones


def cases(example_args: Sequence, shapes, dtypes) -> list[Case]:
  """The cases of a check, the examples' own first."""
  leaves, tree = jax.tree.flatten(tuple(example_args))
  base = tuple(_aval(x) for x in leaves)
  if shapes in (None, "examples"):
    shape_sets = [(tuple(a.shape for a in base), False)]
  elif shapes == "edges":
    shape_sets = [(tuple(a.shape for a in base), False)]
    sizes = {d for a in base for d in a.shape if d >= 2}
    for old, new in _edges(sizes)[:MAX_EDGES]:
      shape_sets.append((tuple(tuple(new if d == old else d for d in a.shape) for a in base), True))
  else:
    shape_sets = []
    for named in shapes:
      named = tuple(tuple(s) for s in named)
      if len(named) != len(base):
        raise ValueError(f"jmf.check: shapes names {len(named)} arrays per case, but the function takes "
                         f"{len(base)} (the example arguments' leaves): {list(named)}")
      shape_sets.append((named, False))
  dtype_sets = [None] if dtypes is None else [jnp.dtype(d) for d in dtypes]
  found = []
  for shape_set, derived in shape_sets:
    for dtype in dtype_sets:
      avals = tuple(jax.ShapeDtypeStruct(s, dtype if dtype is not None and _floating(a.dtype) else a.dtype)
                    for s, a in zip(shape_set, base))
      found.append(Case(avals, tree, derived))
  return found


def random_arrays(rng: np.random.Generator, avals) -> list[np.ndarray]:
  """Normal floats (complex: both parts), integers in [0, 8), random bools: each of its aval."""
  arrays = []
  for a in avals:
    dtype = np.dtype(a.dtype)
    if jnp.issubdtype(dtype, jnp.complexfloating):
      data = rng.standard_normal(a.shape) + 1j * rng.standard_normal(a.shape)
    elif jnp.issubdtype(dtype, jnp.floating):
      data = rng.standard_normal(a.shape, dtype=np.float32)
    elif dtype == np.bool_:
      data = rng.integers(0, 2, a.shape)
    else:
      data = rng.integers(0, 8, a.shape)
    arrays.append(np.asarray(data).astype(dtype))
  return arrays


def make_inputs(rng: np.random.Generator, case: Case, inputs: Callable | None) -> list:
  """The flat inputs of one case: ``inputs(rng, *avals)`` (the arguments, as the function takes them) when given,
  else `random_arrays`."""
  if inputs is None:
    return [jnp.asarray(x) for x in random_arrays(rng, case.avals)]
  made = inputs(rng, *jax.tree.unflatten(case.tree, list(case.avals)))
  leaves = jax.tree.leaves(made)
  got = [(tuple(np.shape(x)), jnp.result_type(x)) for x in leaves]
  want = [(tuple(a.shape), jnp.dtype(a.dtype)) for a in case.avals]
  if got != want:
    raise ValueError(f"jmf.check: inputs= returned {got} for the case {want}; return arrays of those shapes and dtypes")
  return [jnp.asarray(x) for x in leaves]

