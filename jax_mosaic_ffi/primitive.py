"""The `mosaic_kernel` primitive: checking a launch, abstract eval, lowering, vmap.

`mosaic_kernel(...)` checks everything it can at trace time and binds one
primitive. Its CUDA lowering is one ``stablehlo.custom_call`` whose
attributes are the contract of docs/contract.md.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.extend
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax._src import source_info_util
from jax._src.interpreters import mlir
from jax._src.lib.mlir import ir
from jax.interpreters import ad, batching

from jax_mosaic_ffi import collective as collective_lib
from jax_mosaic_ffi import contract
from jax_mosaic_ffi import gpu_info
from jax_mosaic_ffi import registration
from jax_mosaic_ffi.collective import Collective
from jax_mosaic_ffi.kernel import Kernel

source_info_util.register_exclusion(os.path.dirname(__file__))

# Debug switch: fill every (non-aliased) output with 0xFF bytes before the
# launch, so elements a kernel forgets to write read as NaN or -1.
POISON_ENV = "JAX_MOSAIC_FFI_POISON_OUTPUTS"
MAX_PARAMS = 256  # the runtime keeps launch arguments on the stack
_MAX_GRID = (2**31 - 1, 65535, 65535)
_MAX_BLOCK = (1024, 1024, 64)
_MAX_THREADS = 1024

_SCALAR_KINDS = "biuf"
_EXTRA_SCALAR_TYPES = (ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2)


class LaunchError(ValueError):
  """A `mosaic_kernel` call that cannot launch as written."""


@dataclasses.dataclass(frozen=True)
class LaunchSpec:
  """Everything about one call site that is not the kernel's code."""

  grid: tuple[int, int, int]
  block: tuple[int, int, int]
  cluster: tuple[int, int, int]
  smem_bytes: int
  uses_pdl: bool
  param_order: tuple[int, ...]  # buffer index >= 0; scalar k as -(k + 1)
  scalar_data: bytes            # 8 bytes per scalar, little-endian
  scalar_sizes: tuple[int, ...]
  aliases: tuple[tuple[int, int], ...]  # (input, output)
  collective: Collective | None
  call_site: str


def _dims(value, what: str, who: str) -> tuple[int, int, int]:
  if isinstance(value, (int, np.integer)):
    value = (value,)
  try:
    dims = tuple(int(v) for v in value)
  except TypeError:
    raise LaunchError(f"{who}: {what} must be an int or a tuple of up to 3 ints, got {value!r}") from None
  if not 1 <= len(dims) <= 3:
    raise LaunchError(f"{who}: {what} must have 1 to 3 dimensions, got {dims}")
  return dims + (1,) * (3 - len(dims))


def _who(kernel: Kernel, call_site: str) -> str:
  return f"mosaic_kernel '{kernel.name}' at {call_site}"


def _scalar_bytes(value, index: int, who: str) -> bytes:
  if isinstance(value, (jax.Array, jax.core.Tracer)):
    raise LaunchError(
        f"{who}: scalars[{index}] is a JAX array; scalars are baked into the launch "
        "at trace time, so pass a numpy scalar (np.int32(n)), or pass the value as an input array")
  if isinstance(value, (bool, np.bool_)):
    return bytes([1 if value else 0])
  if isinstance(value, (int, float)) and not isinstance(value, np.generic):
    kind = "np.int32(...) or np.int64(...)" if isinstance(value, int) else "np.float32(...) or np.float64(...)"
    raise LaunchError(
        f"{who}: scalars[{index}] is a Python {type(value).__name__}, whose width the "
        f"kernel's parameter cannot be guessed from; pass {kind}")
  if isinstance(value, np.generic) and (value.dtype.kind in _SCALAR_KINDS or isinstance(value, _EXTRA_SCALAR_TYPES)):
    if value.dtype.itemsize > 8:
      raise LaunchError(f"{who}: scalars[{index}] has dtype {value.dtype}, wider than 8 bytes")
    return np.asarray(value).astype(value.dtype.newbyteorder("<")).tobytes()
  raise LaunchError(
      f"{who}: scalars[{index}] has unsupported type {type(value).__name__}; scalars "
      "are numpy integer, float (float16/bfloat16/float32/float64) or bool values")


def _param_order(order, n_in: int, n_out: int, n_scalars: int, who: str) -> tuple[int, ...]:
  default = tuple(range(n_in + n_out)) + tuple(-(k + 1) for k in range(n_scalars))
  if order is None:
    return default
  names = {f"in{i}": i for i in range(n_in)}
  names.update({f"out{i}": n_in + i for i in range(n_out)})
  names.update({f"scalar{k}": -(k + 1) for k in range(n_scalars)})
  codes = []
  for entry in order:
    if entry not in names:
      raise LaunchError(
          f"{who}: param_order entry {entry!r} names nothing; use "
          f"{', '.join(names) or 'nothing (no parameters)'}")
    codes.append(names[entry])
  if sorted(codes) != sorted(default):
    missing = [n for n, c in names.items() if c not in codes]
    twice = sorted({n for n in order if list(order).count(n) > 1})
    raise LaunchError(
        f"{who}: param_order must name every input, output and scalar once "
        f"(missing: {missing or 'none'}, repeated: {twice or 'none'})")
  return tuple(codes)


def _describe_param(code: int, in_avals, out_avals, scalar_sizes) -> str:
  n_in = len(in_avals)
  if code >= n_in:
    aval = out_avals[code - n_in]
    return f"out{code - n_in} ({aval.dtype}{list(aval.shape)} pointer, 8 bytes)"
  if code >= 0:
    aval = in_avals[code]
    return f"in{code} ({aval.dtype}{list(aval.shape)} pointer, 8 bytes)"
  k = -code - 1
  return f"scalar{k} ({scalar_sizes[k]} bytes)"


def _check_signature(kernel: Kernel, spec: LaunchSpec, in_avals, out_avals, who: str) -> None:
  if kernel.param_sizes is None:
    return  # a cubin: the runtime checks against the binary when it loads it
  passed = [8 if code >= 0 else spec.scalar_sizes[-code - 1] for code in spec.param_order]
  described = [_describe_param(c, in_avals, out_avals, spec.scalar_sizes) for c in spec.param_order]
  if spec.collective is not None:
    passed.append(8)
    described.append("collective metadata (pointer, 8 bytes)")
  expected = list(kernel.param_sizes)
  if passed == expected:
    return
  raise LaunchError(
      f"{who}: the kernel takes {len(expected)} parameters of "
      f"{expected} bytes, but the call passes {len(passed)}: "
      f"{'; '.join(described) or 'none'}. The order is inputs, outputs, then scalars"
      + (", then the collective metadata pointer" if spec.collective else "")
      + "; fix the kernel's signature, the scalars' dtypes, or param_order")


def _check_limits(spec: LaunchSpec, who: str) -> None:
  for what, dims, limits in (("grid", spec.grid, _MAX_GRID), ("block", spec.block, _MAX_BLOCK)):
    for axis, (d, limit) in enumerate(zip(dims, limits)):
      if not 1 <= d <= limit:
        raise LaunchError(f"{who}: {what}[{axis}] = {d} is out of range; it must be 1..{limit}")
  threads = math.prod(spec.block)
  if threads > _MAX_THREADS:
    raise LaunchError(
        f"{who}: block {spec.block} has {threads} threads; a block holds at most {_MAX_THREADS}")
  if spec.cluster != (1, 1, 1):
    for axis, (c, g) in enumerate(zip(spec.cluster, spec.grid)):
      if c < 1:
        raise LaunchError(f"{who}: cluster[{axis}] = {c}; cluster dimensions are >= 1")
      if g % c:
        raise LaunchError(
            f"{who}: grid[{axis}] = {g} is not a multiple of cluster[{axis}] = {c}")
  if spec.smem_bytes < 0:
    raise LaunchError(f"{who}: smem_bytes = {spec.smem_bytes} is negative")
  gpus = gpu_info.visible_gpus()
  if gpus:
    limit = min(g.max_shared_memory_per_block_optin for g in gpus)
    if spec.smem_bytes > limit:
      raise LaunchError(
          f"{who}: smem_bytes = {spec.smem_bytes} is over the {limit} bytes of dynamic shared "
          f"memory a block may have on {gpus[0].name}; use less shared memory per block")
  if len(spec.param_order) + (spec.collective is not None) > MAX_PARAMS:
    raise LaunchError(f"{who}: more than {MAX_PARAMS} kernel parameters")


def _normalize_aliases(aliases, in_avals, out_avals, who: str):
  if not aliases:
    return ()
  result = []
  seen_outputs = set()
  for i, o in dict(aliases).items():
    if not (isinstance(i, (int, np.integer)) and 0 <= i < len(in_avals)):
      raise LaunchError(
          f"{who}: input_output_aliases key {i!r} is not an input index (0..{len(in_avals) - 1})")
    if not (isinstance(o, (int, np.integer)) and 0 <= o < len(out_avals)):
      raise LaunchError(
          f"{who}: input_output_aliases value {o!r} is not an output index (0..{len(out_avals) - 1})")
    if o in seen_outputs:
      raise LaunchError(f"{who}: output {o} is aliased to two inputs")
    seen_outputs.add(o)
    a, b = in_avals[i], out_avals[o]
    if a.shape != b.shape or a.dtype != b.dtype:
      raise LaunchError(
          f"{who}: input {i} ({a.dtype}{list(a.shape)}) cannot alias output {o} "
          f"({b.dtype}{list(b.shape)}); aliased buffers need the same shape and dtype")
    result.append((int(i), int(o)))
  return tuple(sorted(result))


def mosaic_kernel(kernel: Kernel, out_shape, *, grid, block, cluster=None, smem_bytes: int = 0,
                  uses_pdl: bool = False, scalars: Sequence[Any] = (),
                  input_output_aliases: Mapping[int, int] | None = None,
                  param_order: Sequence[str] | None = None,
                  collective: Collective | None = None) -> Callable[..., Any]:
  """Returns a function that launches ``kernel`` on its input arrays.

  The kernel's parameters are, in order: one pointer per input, one pointer
  per output, then each scalar by value (and, for a collective kernel, the
  collective metadata pointer last). ``param_order=("out0", "in0",
  "scalar0", ...)`` names another order.

  Args:
    kernel: from `cuda_kernel`, `ptx_kernel` or `cubin_kernel`.
    out_shape: a `jax.ShapeDtypeStruct`, or a sequence of them.
    grid, block, cluster: launch dimensions, an int or up to 3 ints.
    smem_bytes: dynamic shared memory per block.
    uses_pdl: launch with programmatic dependent launch allowed.
    scalars: numpy scalars (any int or float width, or bool), passed by value.
    input_output_aliases: ``{input_index: output_index}`` for in-place updates.
    param_order: an explicit parameter order, by names ``inN``, ``outN``, ``scalarN``.
    collective: a `Collective` for kernels that talk to their peers.
  """
  if not isinstance(kernel, Kernel):
    raise TypeError(
        f"mosaic_kernel needs a Kernel from cuda_kernel/ptx_kernel/cubin_kernel, got {type(kernel).__name__}")
  who = _who(kernel, _call_site())
  single = isinstance(out_shape, (jax.ShapeDtypeStruct, jax.core.ShapedArray)) or hasattr(out_shape, "shape")
  shapes = (out_shape,) if single else tuple(out_shape)
  if not shapes:
    raise LaunchError(f"{who}: out_shape must name at least one output")
  out_avals = tuple(jax.core.ShapedArray(tuple(s.shape), jnp.dtype(s.dtype)) for s in shapes)
  scalar_blobs = [_scalar_bytes(v, k, who) for k, v in enumerate(scalars)]
  if collective is not None and not isinstance(collective, Collective):
    raise TypeError(f"{who}: collective must be a jax_mosaic_ffi.Collective")

  def call(*args):
    call_site = _call_site()
    who = _who(kernel, call_site)
    in_avals = tuple(jax.typeof(a) for a in args)
    for i, aval in enumerate(in_avals):
      if not hasattr(aval, "shape"):
        raise LaunchError(f"{who}: input {i} is not an array")
    spec = LaunchSpec(
        grid=_dims(grid, "grid", who),
        block=_dims(block, "block", who),
        cluster=_dims(cluster, "cluster", who) if cluster is not None else (1, 1, 1),
        smem_bytes=int(smem_bytes),
        uses_pdl=bool(uses_pdl),
        param_order=_param_order(param_order, len(args), len(out_avals), len(scalar_blobs), who),
        scalar_data=b"".join(b.ljust(8, b"\0") for b in scalar_blobs),
        scalar_sizes=tuple(len(b) for b in scalar_blobs),
        aliases=_normalize_aliases(input_output_aliases, in_avals, out_avals, who),
        collective=collective,
        call_site=call_site,
    )
    if collective is not None and collective.symmetric is not None and \
        len(collective.symmetric) != len(args) + len(out_avals):
      raise LaunchError(
          f"{who}: Collective.symmetric has {len(collective.symmetric)} entries; it needs "
          f"one per input and output ({len(args) + len(out_avals)})")
    if all(math.prod(a.shape) == 0 for a in out_avals):
      # Nothing to write, so nothing to launch.
      aliased = dict((o, i) for i, o in spec.aliases)
      outs = [args[aliased[o]] if o in aliased else jnp.zeros(a.shape, a.dtype)
              for o, a in enumerate(out_avals)]
      return outs[0] if single else tuple(outs)
    _check_limits(spec, who)
    _check_signature(kernel, spec, in_avals, out_avals, who)
    outs = mosaic_kernel_p.bind(*args, kernel=kernel, out_avals=out_avals, spec=spec)
    return outs[0] if single else tuple(outs)

  return call


mosaic_kernel_p = jax.extend.core.Primitive("mosaic_kernel")
mosaic_kernel_p.multiple_results = True


@mosaic_kernel_p.def_abstract_eval
def _abstract_eval(*avals, kernel, out_avals, spec):
  return out_avals


def _call_site() -> str:
  """Where the user called the kernel: "model.py:42 (forward)"."""
  frame = sys._getframe(1)
  while frame is not None:
    if source_info_util.is_user_filename(frame.f_code.co_filename):
      return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno} ({frame.f_code.co_name})"
    frame = frame.f_back
  return "<unknown call site>"


def _collective_attributes(ctx, kernel: Kernel, spec: LaunchSpec, n_buffers: int) -> dict:
  who = _who(kernel, spec.call_site)
  axis_context = ctx.module_context.axis_context
  mesh = getattr(axis_context, "mesh", None)
  devices = getattr(mesh, "devices", None)
  if devices is None:
    raise LaunchError(
        f"{who}: a collective kernel must run inside shard_map (or pmap) over a mesh "
        f"that has axis {spec.collective.axes[0]!r}")
  if jax.process_count() > 1:
    raise NotImplementedError(
        f"{who}: collective kernels across processes (jax.distributed) are not "
        "supported yet; run one process that drives all GPUs. docs/collectives.md explains the plan")
  ids = np.vectorize(lambda d: d.id, otypes=[np.int64])(devices)
  groups = collective_lib.cliques(ids, mesh.axis_names, spec.collective.axes)
  symmetric = spec.collective.symmetric or (False,) * n_buffers
  return {
      "xla_replica_ids": collective_lib.format_replica_ids(groups),
      "symmetric_memory_parameters": ",".join("1" if s else "0" for s in symmetric),
      "skip_device_barrier": bool(spec.collective.skip_device_barrier),
  }


def _i32_array(values) -> ir.Attribute:
  return ir.DenseI32ArrayAttr.get([int(v) for v in values])


def _cuda_lowering(ctx, *operands, kernel: Kernel, out_avals, spec: LaunchSpec):
  registration.ensure_registered()
  n_buffers = len(operands) + len(out_avals)
  attributes = {
      "module": kernel.module,
      "kernel_hash": kernel.hash,
      "kernel_name": kernel.name,
      "call_site": spec.call_site,
      "use_custom_barrier": False,
      "uses_xla_collective_metadata": spec.collective is not None,
      "grid": _i32_array(spec.grid),
      "block": _i32_array(spec.block),
      "cluster": _i32_array(spec.cluster),
      "smem_bytes": np.int32(spec.smem_bytes),
      "uses_pdl": spec.uses_pdl,
      "num_inputs": np.int32(len(operands)),
      "param_order": _i32_array(spec.param_order),
      "scalar_data": spec.scalar_data,
      "scalar_sizes": _i32_array(spec.scalar_sizes),
  }
  if os.environ.get(POISON_ENV, "") not in ("", "0"):
    aliased = {o for _, o in spec.aliases}
    attributes["poison_outputs"] = _i32_array(o for o in range(len(out_avals)) if o not in aliased)
  if spec.collective is not None:
    attributes.update(_collective_attributes(ctx, kernel, spec, n_buffers))
  target = contract.target_name(collective=spec.collective is not None)
  op = mlir.custom_call(
      target,
      result_types=[mlir.aval_to_ir_type(ctx.module_context, a) for a in out_avals],
      operands=list(operands),
      backend_config={k: mlir.ir_attribute(v) for k, v in attributes.items()},
      api_version=4,
      operand_output_aliases=dict(spec.aliases) or None,
      operand_layouts=[list(reversed(range(len(a.shape)))) for a in ctx.avals_in],
      result_layouts=[list(reversed(range(len(a.shape)))) for a in out_avals],
      has_side_effect=False,
  )
  return op.results


def _unsupported_platform_lowering(ctx, *operands, kernel: Kernel, spec: LaunchSpec, **_):
  who = _who(kernel, spec.call_site)
  platforms = ", ".join(ctx.module_context.platforms)
  raise NotImplementedError(
      f"{who} runs only on CUDA GPUs, but this computation is lowered for {platforms}. "
      "Put its inputs on a GPU, or export with platforms=['cuda'].")


mlir.register_lowering(mosaic_kernel_p, _unsupported_platform_lowering)
mlir.register_lowering(mosaic_kernel_p, _cuda_lowering, platform="cuda")


def _batching_rule(args, dims, *, kernel, out_avals, spec):
  """vmap runs the kernel once per batch element (a sequential lax.map)."""
  size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
  mapped = [d is not None for d in dims]
  moved = [jnp.moveaxis(a, d, 0) if m else a for a, d, m in zip(args, dims, mapped)]

  def one(xs):
    it = iter(xs)
    full = [next(it) if m else a for a, m in zip(moved, mapped)]
    return mosaic_kernel_p.bind(*full, kernel=kernel, out_avals=out_avals, spec=spec)

  outs = jax.lax.map(one, [a for a, m in zip(moved, mapped) if m])
  assert all(o.shape[0] == size for o in outs)
  return outs, [0] * len(outs)


batching.primitive_batchers[mosaic_kernel_p] = _batching_rule


def _no_derivative(primals, tangents, *, kernel, spec, **_):
  who = _who(kernel, spec.call_site)
  raise TypeError(
      f"{who} has no derivative: JAX cannot see inside a hand-written kernel. Wrap "
      "the call in jax.custom_vjp and give the backward pass (which can be another "
      "mosaic_kernel); the README shows how.")


ad.primitive_jvps[mosaic_kernel_p] = _no_derivative
