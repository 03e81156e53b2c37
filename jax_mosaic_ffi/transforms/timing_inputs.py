"""What an autotuned call is timed on: random arrays of its avals (timing.py's `random_inputs`: normal floats,
integers in [0, 4)), or the arrays its own ``inputs(rng, *avals)`` makes (`autotune(..., inputs=)`,
``mosaic_kernel(..., autotune_inputs=)``) for a call whose integer inputs are data: lengths, block tables, indices.
Random small integers there time a kernel that does almost nothing (a length of 2), or reads out of bounds.

The arrays are made once per decision, with a numpy Generator seeded alike in every process (the processes of a
job time on the same inputs), and checked against the avals before anything runs on them. A timing's key holds
no value of them: it holds the call (its name, configs, kernels and launch values, avals or ``key=``) and, for
timings made on the call's own inputs, the inputs function's qualified name (`tag`): a stable name, like the
factory's that names a call by default, so timings on random inputs and on the call's own are never mixed up,
and a second process finds the first one's.
"""

from __future__ import annotations

from typing import Callable

import jax
import numpy as np

from jax_mosaic_ffi.transforms import timing


def tag(inputs: Callable | None) -> str:
  """What a timing's signature adds for a call timed on its own inputs: nothing without them (its key is then
  the one it always had), else the function's qualified name."""
  if inputs is None:
    return ""
  name = getattr(inputs, "__qualname__", None) or type(inputs).__qualname__
  return f" timed on {getattr(inputs, '__module__', None) or ''}.{name}"


def maker(inputs: Callable | None, call: str) -> Callable:
  """``make(avals, device)`` -> the arrays the configs of autotuned call ``call`` are timed on, on ``device``."""
  if inputs is None:
    return timing.random_inputs

  def make(avals, device):
    made = inputs(np.random.default_rng(0), *avals)
    return [jax.device_put(array, device) for array in checked(made, avals, call)]
  return make


def _text(aval) -> str:
  return f"{np.dtype(aval.dtype).name}{list(aval.shape)}"


def checked(made, avals, call: str) -> list:
  """``made`` if it is one array per aval, each of the aval's shape and dtype; else a TypeError or ValueError
  naming the call, what came back and what it should be."""
  want = ", ".join(map(_text, avals))
  fix = f"inputs(rng, *avals) must return one array per input of autotune '{call}', of its shape and dtype: ({want})"
  if not isinstance(made, (tuple, list)):
    raise TypeError(f"{fix}; it returned a {type(made).__name__}")
  if len(made) != len(avals):
    raise ValueError(f"{fix}; it returned {len(made)} arrays")
  for k, (array, aval) in enumerate(zip(made, avals)):
    if not (hasattr(array, "shape") and hasattr(array, "dtype")):
      raise TypeError(f"{fix}; input {k} is a {type(array).__name__}, not an array")
    if tuple(array.shape) != tuple(aval.shape) or np.dtype(array.dtype) != np.dtype(aval.dtype):
      raise ValueError(f"{fix}; input {k} is {_text(array)}")
  return list(made)
