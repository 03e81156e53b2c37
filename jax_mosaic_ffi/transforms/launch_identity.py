"""What an autotuning config launches, as its timing's key holds it (store/tuning_records.py's TimingKey)."""

from __future__ import annotations

import json

from jax_mosaic_ffi.call.primitive import mosaic_kernel_p


def of_jaxpr(jaxpr) -> list[str]:
  """One string per mosaic_kernel call in a jaxpr (sub-jaxprs included): its kernel's module hash and what it
  launches (`LaunchSpec.identity`: grid, scalars...; the buffers' shapes), so that a timing is kept per config
  and not reused once its kernel or launch changes, while a config whose kernel hash stays the same but whose
  grid or scalars change is timed again."""
  found = []
  # A stack, not a recursive closure: a function that refers to itself is a cycle only the collector frees.
  pending = [iter(jaxpr.jaxpr.eqns)]
  while pending:
    eqn = next(pending[-1], None)
    if eqn is None:
      pending.pop()
      continue
    if eqn.primitive is mosaic_kernel_p:
      launch = eqn.params["spec"].identity()
      launch["buffers"] = [f"{v.aval.dtype}{list(v.aval.shape)}" for v in (*eqn.invars, *eqn.outvars)]
      found.append(f"{eqn.params['kernel'].hash.hex()} {json.dumps(launch, sort_keys=True, default=repr)}")
    subs = []
    for value in eqn.params.values():
      for sub in value if isinstance(value, (list, tuple)) else (value,):
        inner = getattr(sub, "jaxpr", sub)
        if hasattr(inner, "eqns"):
          subs.append(iter(inner.eqns))
    pending.extend(reversed(subs))  # the first sub-jaxpr next, as the order of the launches found
  return found
