"""A call whose kernel takes a batch as the leading axis of every array (a CuTe DSL launcher's ``batch_mode=``, a
cuTile kernel's ``batch_bid=``): vmap of it, at any depth, is one launch over the whole batch, and a call outside vmap
is a batch of one."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp

from jax_mosaic_ffi.base.errors import LaunchError


def leading_axis_call(bind: Callable[[Sequence[Any], bool], Any], no_inputs: str) -> Callable[..., Any]:
  """The call of arrays over ``bind(args, batched)``, which launches once for arrays that all carry one leading
  batch axis (``batched``: True). ``no_inputs``: the error for a call with no array to batch."""

  @jax.custom_batching.custom_vmap
  def batched(*args):  # every array with one leading batch axis, the same for all
    return bind(args, True)

  @batched.def_vmap
  def merged(axis_size, in_batched, *args):
    # A batch of batches (vmap of this call, or nested vmaps): one batch, outer axis first.
    args = [a if b else jnp.broadcast_to(a, (axis_size, *a.shape)) for a, b in zip(args, in_batched)]
    inner = args[0].shape[1]
    out = batched(*(a.reshape((axis_size * inner, *a.shape[2:])) for a in args))
    out = jax.tree.map(lambda o: o.reshape((axis_size, inner, *o.shape[1:])), out)
    return out, jax.tree.map(lambda _: True, out)

  def call(*args):
    if not args:
      raise LaunchError(no_inputs)
    out = batched(*(a[None] for a in args))  # one call is a batch of one
    return jax.tree.map(lambda o: o[0], out)

  return call
