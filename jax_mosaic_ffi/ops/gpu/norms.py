"""What `layer_norm` and `rms_norm` share (kernels/norms.py, SUBTRACT_MEAN on or off): their kernel calls over x
viewed as (M, N), their fallbacks, and the function with its backward attached (`jmf.differentiable`).

The forward returns y and, for the backward, each row's mean and 1/std (float32); the backward returns dx and
dw, db summed in float32 (cast to the weights' dtypes after), in two stages: the kernel's programs each write
their rows' sums (`backward_groups`), which XLA then adds. Rows may be split under ``jit``, in the forward and the
backward alike: the backward's kernel sees x as (groups, rows of a group, N) and its partial sums as (groups,
splits, N), so a device holding some groups writes their partial sums, and XLA's sum of them across devices is
an all-reduce of N floats.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jax_mosaic_ffi.api import mosaic_kernel
from jax_mosaic_ffi.call.launch_values import cdiv
from jax_mosaic_ffi.ops.gpu import calls
from jax_mosaic_ffi.transforms.autodiff import differentiable
from jax_mosaic_ffi.transforms.sharding_rules import BatchDims, ShardingRule
from jax_mosaic_ffi.triton.kernel import triton_kernel

# The longest row one program holds whole; longer rows are walked in blocks of LONG_BLOCK.
MAX_BLOCK_N = 16384
LONG_BLOCK = 4096
# The backward's programs (about): each sums at least MIN_PROGRAM_ROWS rows' dw and db terms into its own row of
# partial sums (each costs 8 bytes a column written and read again: a program of 16 rows adds a sixth to what a
# 16-bit row costs). Rows are viewed as (groups, rows of a group), up to MAX_GROUPS groups: the largest power of
# two dividing the row count, so that devices splitting the rows split whole groups.
BACKWARD_PROGRAMS = 512
MIN_PROGRAM_ROWS = 16
MAX_GROUPS = 256


class Norm(NamedTuple):
  """What fixes a norm's kernels besides shapes."""
  subtract_mean: bool
  eps: float
  num_warps: int | None     # None: autotuned
  backward_pass_impl: str


def row_configs(n: int, rows: int, num_warps: int | None) -> list[dict]:
  """Rows per program and warps for rows of ``n`` (<= MAX_BLOCK_N): Pallas's one row per program with its warps
  first (block // 256, 1 to 8), then more rows per program for short rows and more warps for long ones."""
  block = calls.padded(n, 1)
  pallas_warps = min(max(min(max(block, 128), 4096) // 256, 1), 8)
  if num_warps is not None:
    return [calls.config(num_warps, 1, BLOCK_M=1)]
  candidates = [(1, pallas_warps), (1, 4), (1, 8), (1, 16), (2, 4), (4, 4), (4, 8), (8, 8), (16, 8), (1, 2)]
  configs = []
  for block_m, warps in candidates:
    per_thread = block_m * block / (32 * warps)
    if (block_m, warps) == (1, pallas_warps) or (1 <= per_thread <= 64 and block_m <= calls.padded(rows, 1)):
      configs.append(calls.config(warps, 1, BLOCK_M=block_m))
  return calls.clamp_configs(configs, {})


def forward_reference(norm: Norm, x, w, b):
  """(y, mean, rstd) as the forward kernel computes them."""
  xf = x.astype(jnp.float32)
  mean = jnp.mean(xf, axis=1) if norm.subtract_mean else jnp.zeros(x.shape[:1], jnp.float32)
  centered = xf - mean[:, None]
  rstd = 1.0 / jnp.sqrt(jnp.mean(centered * centered, axis=1) + norm.eps)
  y = centered * rstd[:, None] * w.astype(jnp.float32) + b.astype(jnp.float32)
  return y.astype(x.dtype), mean, rstd


def backward_reference(norm: Norm, x, w, dy, mean, rstd):
  """(dx, dw, db) as the backward kernel computes them (dw and db float32)."""
  xhat = (x.astype(jnp.float32) - mean[:, None]) * rstd[:, None]
  dyf = dy.astype(jnp.float32)
  wdy = w.astype(jnp.float32) * dyf
  c1 = jnp.mean(xhat * wdy, axis=1, keepdims=True)
  c2 = jnp.mean(wdy, axis=1, keepdims=True) if norm.subtract_mean else 0.0
  dx = (wdy - (xhat * c1 + c2)) * rstd[:, None]
  return dx.astype(x.dtype), jnp.sum(dyf * xhat, axis=0), jnp.sum(dyf, axis=0)


def _launch(fn, configs, constexprs, **options):
  if len(configs) == 1:
    fixed = dict(configs[0])
    warps, stages = fixed.pop("num_warps"), fixed.pop("num_stages")
    return mosaic_kernel(triton_kernel(fn, num_warps=warps, num_stages=stages, constexprs={**constexprs, **fixed}),
                         **options)
  return mosaic_kernel(triton_kernel(fn, constexprs=constexprs), configs=configs, **options)


@calls.cached
def forward_call(norm: Norm, n: int, rows_fill: int):
  """(x (M, N), w, b) -> (y, mean, rstd)."""
  module = calls.kernels("norms")
  options = dict(
      out_shape=lambda x, w, b: (jax.ShapeDtypeStruct(x.shape, x.dtype),
                                 jax.ShapeDtypeStruct(x.shape[:1], jnp.float32),
                                 jax.ShapeDtypeStruct(x.shape[:1], jnp.float32)),
      scalars=lambda meta, x, w, b: (calls.i32(x.shape[0]), calls.i32(x.shape[1]), calls.f32(norm.eps)),
      fallback=lambda x, w, b: forward_reference(norm, x, w, b),
      sharding=BatchDims(inputs=(0, None, None), outputs=0))
  if n > MAX_BLOCK_N:
    return _launch(module.norm_forward_long, [calls.config(norm.num_warps or 8, 1)],
                   {"SUBTRACT_MEAN": norm.subtract_mean, "BLOCK_N": LONG_BLOCK},
                   grid=lambda meta, x, w, b: x.shape[0], **options)
  return _launch(module.norm_forward, row_configs(n, rows_fill, norm.num_warps),
                 {"SUBTRACT_MEAN": norm.subtract_mean, "BLOCK_N": calls.padded(n, 1)},
                 grid=lambda meta, x, w, b: cdiv(x.shape[0], meta["BLOCK_M"]), **options)


def backward_groups(rows: int) -> tuple[int, int, int]:
  """(groups, splits of a group, rows a program takes) for the backward over ``rows`` rows."""
  groups = min(rows & -rows, MAX_GROUPS) if rows else 1
  group_rows = rows // groups
  splits = max(1, min(cdiv(BACKWARD_PROGRAMS, groups), cdiv(group_rows, MIN_PROGRAM_ROWS)))
  per_program = max(1, cdiv(group_rows, splits))
  return groups, max(1, cdiv(group_rows, per_program)), per_program


def backward_partials_reference(norm: Norm, splits: int, per_program: int, x, w, dy, mean, rstd):
  """What the backward kernel computes on x (G, R, N): (dx, dw and db partial sums (G, splits, N) float32)."""
  groups, group_rows, n = x.shape
  flat = lambda a: a.reshape(groups * group_rows, *a.shape[2:])  # noqa: E731
  dx = backward_reference(norm, flat(x), w, flat(dy), flat(mean), flat(rstd))[0].reshape(x.shape)
  xhat = (x.astype(jnp.float32) - mean[..., None]) * rstd[..., None]
  dyf = dy.astype(jnp.float32)

  def partials(terms):
    terms = jnp.pad(terms, ((0, 0), (0, splits * per_program - group_rows), (0, 0)))
    return jnp.sum(terms.reshape(groups, splits, per_program, n), axis=2)
  return dx, partials(dyf * xhat), partials(dyf)


def weight_grads(x, dy, mean, rstd):
  """dw and db, float32, as XLA's column sums (rows longer than a kernel's block)."""
  xhat = (x.astype(jnp.float32) - mean[:, None]) * rstd[:, None]
  return jnp.sum(dy.astype(jnp.float32) * xhat, axis=0), jnp.sum(dy.astype(jnp.float32), axis=0)


@calls.cached
def backward_call(norm: Norm, n: int, splits: int, per_program: int):
  """(x (G, R, N), w, dy (G, R, N), mean (G, R), rstd (G, R)) -> (dx, dw and db partial sums (G, splits, N)
  float32); groups may be split under jit."""
  module = calls.kernels("norms")
  partials = lambda x: jax.ShapeDtypeStruct((x.shape[0], splits, n), jnp.float32)  # noqa: E731
  return _launch(module.norm_backward, row_configs(n, per_program, norm.num_warps),
                 {"SUBTRACT_MEAN": norm.subtract_mean, "BLOCK_N": calls.padded(n, 1)},
                 out_shape=lambda x, *_: (jax.ShapeDtypeStruct(x.shape, x.dtype), partials(x), partials(x)),
                 grid=lambda meta, x, *_: (splits, x.shape[0]),
                 scalars=lambda meta, x, *_: (calls.i32(x.shape[1]), calls.i32(n), calls.i32(per_program)),
                 fallback=lambda *args: backward_partials_reference(norm, splits, per_program, *args),
                 sharding=ShardingRule("g r n, n, g r n, g r, g r -> g r n, g s n, g s n", replicated=("r", "n")))


@calls.cached
def backward_long_call(norm: Norm, n: int):
  """(x (M, N), w, dy, mean, rstd) -> dx, for rows longer than MAX_BLOCK_N; rows may be split under jit."""
  return _launch(calls.kernels("norms").norm_backward_long, [calls.config(norm.num_warps or 8, 1)],
                 {"SUBTRACT_MEAN": norm.subtract_mean, "BLOCK_N": LONG_BLOCK},
                 out_shape=lambda x, *_: jax.ShapeDtypeStruct(x.shape, x.dtype),
                 grid=lambda meta, x, *_: x.shape[0],
                 scalars=lambda meta, x, *_: (calls.i32(x.shape[0]), calls.i32(x.shape[1])),
                 fallback=lambda *args: backward_reference(norm, *args)[0],
                 sharding=BatchDims(inputs=(0, None, 0, 0, 0), outputs=0))


@calls.cached
def function(norm: Norm, n: int, rows_fill: int):
  """(x (M, N), w, b) -> (y, mean, rstd) with its backward attached, jitted."""
  forward = forward_call(norm, n, rows_fill)

  def backward(x, w, b, mean, rstd, dy, d_mean, d_rstd):
    del d_mean, d_rstd  # internal outputs: the callers never see them
    if norm.backward_pass_impl == "xla":
      _, vjp = jax.vjp(lambda x, w, b: forward_reference(norm, x, w, b)[0], x, w, b)
      return vjp(dy)
    if n > MAX_BLOCK_N:
      dx = backward_long_call(norm, n)(x, w, dy, mean, rstd)
      dw, db = weight_grads(x, dy, mean, rstd)
    else:
      groups, splits, per_program = backward_groups(x.shape[0])
      grouped = lambda a: a.reshape(groups, x.shape[0] // groups, *a.shape[1:])  # noqa: E731
      dx, dw, db = backward_call(norm, n, splits, per_program)(grouped(x), w, grouped(dy), grouped(mean),
                                                               grouped(rstd))
      dx, dw, db = dx.reshape(x.shape), jnp.sum(dw, axis=(0, 1)), jnp.sum(db, axis=(0, 1))
    return dx, dw.astype(w.dtype), db.astype(b.dtype)

  return jax.jit(differentiable(forward, bwd=backward, residuals=("in0", "in1", "in2", "out1", "out2")))


def apply(norm: Norm, name: str, x, weight, bias):
  """y = norm(x) * weight + bias over x's last axis."""
  if norm.backward_pass_impl not in ("triton", "xla"):
    raise ValueError(f"{name}: backward_pass_impl must be 'triton' or 'xla', got {norm.backward_pass_impl!r}")
  if x.ndim < 1 or weight.shape != x.shape[-1:] or bias.shape != x.shape[-1:]:
    raise ValueError(f"{name}: weight and bias must be (N,) for x (..., N); got {x.shape=}, {weight.shape=}, "
                     f"{bias.shape=}")
  n = x.shape[-1]
  rows = x.size // n if n else 0
  y, _, _ = function(norm, n, calls.padded(rows, 1))(x.reshape(rows, n), weight, bias)
  return y.reshape(x.shape)
