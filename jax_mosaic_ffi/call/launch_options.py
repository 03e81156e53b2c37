"""`mosaic_kernel`'s launch options: as given (`LaunchOptions`, their one definition), and checked for one
kernel (`CheckedLaunch`).

Two steps, both pure (no lowering, no GPU needed):

* `CheckedLaunch.create` checks the options given to `mosaic_kernel` once,
  when the wrapper is made: types, names, aliases. A front end that resolves
  the launch itself (Triton: block, shared memory and cluster from the
  compiled kernel's metadata) builds its `CheckedLaunch` directly from what it
  resolved, in checked form, and nothing is checked twice.
* `CheckedLaunch.spec` runs on every trace, with the input avals: it
  evaluates the options given as callables of the avals (or of a config's
  ``meta`` and the avals: `launch_values.evaluate`), builds the `LaunchSpec`,
  and has the C++ runtime's validator (csrc/contract/contract.cc, the one
  owner of the contract) check the very attributes the lowering will emit.
  Trace-time and instantiate-time checks cannot disagree.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np
from jax.export import is_symbolic_dim

from jax_mosaic_ffi.base.errors import LaunchError, who
from jax_mosaic_ffi.call import launch_programs
from jax_mosaic_ffi.call import launch_values
from jax_mosaic_ffi.call.launch_programs import DimScalar
from jax_mosaic_ffi.call.collective import Collective
from jax_mosaic_ffi.call.launch_spec import TENSOR_MAP_CODE, LaunchSpec, check_launch
from jax_mosaic_ffi.call.tensor_map import TensorMap, scratch_aval
from jax_mosaic_ffi.toolchain.kernel import Kernel


@dataclasses.dataclass(frozen=True)
class LaunchOptions:
  """The launch options of one `mosaic_kernel(...)` call, as given: their one definition (`mosaic_kernel`
  documents each). Every path (CUDA, Triton, autotuned, sharded) takes this one object."""

  grid: Any
  block: Any = None
  cluster: Any = None
  smem_bytes: Any = 0
  uses_pdl: bool | None = None
  scalars: Any = ()
  input_output_aliases: Mapping[int, int] | None = None
  param_order: Sequence[Any] | None = None
  collective: Collective | None = None
  batch_grid_axis: str | None = None
  fallback: Callable | None = None
  sharding: Any = None
  scratch_bytes: Any = 0
  zero_scratch: bool = False
  zero_outputs: Any = ()


# The options a config's meta reaches, when one is given (an autotuning config's values): the others'
# callables get the input avals alone.
_META_OPTIONS = ("grid", "block", "smem_bytes", "scalars")


@dataclasses.dataclass(frozen=True)
class CheckedLaunch:
  """The launch options of one `mosaic_kernel(...)` for one kernel, checked once. Any of
  out_shape, grid, block, smem_bytes and scalars may be a callable of the
  input avals (with ``meta``: grid, block, smem_bytes and scalars of ``(meta,
  *avals)``), evaluated on every trace. Every other value is in checked form:
  `create`'s, or a front end's that resolved it."""

  kernel: Kernel
  out_shape: Any
  grid: Any
  block: Any
  cluster: tuple[int, int, int]
  smem_bytes: Any
  uses_pdl: bool
  scalars: Any
  aliases: tuple[tuple[int, int], ...]
  param_order: tuple[str, ...] | None
  collective: Collective | None
  batch_grid_axis: int | None = None
  scratch_bytes: Any = 0
  zero_scratch: bool = False
  zero_outputs: Any = ()  # output indices, or True for all
  meta: Mapping[str, Any] | None = None  # an autotuning config's values, for the callables

  @classmethod
  def create(cls, kernel, out_shape, options: LaunchOptions, where: str,
             meta: Mapping[str, Any] | None = None) -> "CheckedLaunch":
    """Checks ``options`` for ``kernel`` (its fallback and sharding are the caller's); ``meta``: a config's
    values, which the callables among grid, block, smem_bytes and scalars get first."""
    grid, block, cluster, smem_bytes, scalars = (options.grid, options.block, options.cluster, options.smem_bytes,
                                                 options.scalars)
    uses_pdl, param_order, collective = options.uses_pdl, options.param_order, options.collective
    batch_grid_axis, scratch_bytes = options.batch_grid_axis, options.scratch_bytes
    if not isinstance(kernel, Kernel):
      raise TypeError(
          f"mosaic_kernel needs a Kernel from cuda_kernel/ptx_kernel/cubin_kernel, got {type(kernel).__name__}")
    if collective is not None and not isinstance(collective, Collective):
      raise TypeError(f"{where}: collective must be a jax_mosaic_ffi.Collective")
    if uses_pdl is None:
      uses_pdl = kernel.pdl_safe
    if not isinstance(uses_pdl, (bool, np.bool_)):
      raise LaunchError(f"{where}: uses_pdl must be True, False or None (PDL when the kernel is safe for it), "
                        f"got {uses_pdl!r}")
    if param_order is not None:
      if isinstance(param_order, str) or not isinstance(param_order, Sequence) or \
          not all(isinstance(n, (str, TensorMap)) for n in param_order):
        raise LaunchError(f"{where}: param_order must be a sequence of names like ('in0', 'out0', 'scalar0') "
                          f"or jmf.TensorMap(...) declarations, got {param_order!r}")
      param_order = tuple(param_order)
    if not callable(out_shape):
      launch_values.out_avals(out_shape, where)  # checked now; kept as given, to be read per trace
    if batch_grid_axis is not None and batch_grid_axis not in ("x", "y", "z"):
      raise LaunchError(f"{where}: batch_grid_axis must be 'x', 'y', 'z' or None, got {batch_grid_axis!r}")
    if batch_grid_axis is not None and collective is not None:
      raise LaunchError(f"{where}: a collective kernel cannot take a batch on a grid axis")
    aliases = launch_values.aliases(options.input_output_aliases, where)
    _check_nvshmem(kernel, collective, bool(uses_pdl), aliases, where)
    fixed = lambda value, normalise: value if callable(value) else normalise(value)  # noqa: E731
    for what, value in (("block", block), ("smem_bytes", smem_bytes), ("scratch_bytes", scratch_bytes)):
      if not callable(value) and launch_values.has_symbolic_dim(value):
        raise LaunchError(launch_values.constant_refusal(what, (), where))

    def keep_scalars(values):
      checked = launch_values.scalars(values, where)
      # Scalars computed from symbolic sizes (jmf.dim_scalar) stay as given, to be encoded per trace.
      return tuple(values) if launch_values.has_symbolic_dim(values) else checked
    return cls(
        kernel=kernel,
        out_shape=out_shape,
        grid=fixed(grid, lambda v: launch_values.dims(v, "grid", where, symbolic=True)),
        block=fixed(block, lambda v: launch_values.dims(v, "block", where)),
        cluster=launch_values.dims(cluster, "cluster", where) if cluster is not None else (1, 1, 1),
        smem_bytes=fixed(smem_bytes, lambda v: launch_values.integer(v, "smem_bytes", where)),
        uses_pdl=bool(uses_pdl),
        scalars=fixed(scalars, keep_scalars),
        aliases=aliases,
        param_order=param_order,
        collective=collective,
        batch_grid_axis=None if batch_grid_axis is None else "xyz".index(batch_grid_axis),
        scratch_bytes=fixed(scratch_bytes, lambda v: launch_values.scratch_bytes(v, where)),
        zero_scratch=launch_values.flag(options.zero_scratch, "zero_scratch", where),
        zero_outputs=launch_values.zero_outputs_option(options.zero_outputs, where),
        meta=None if meta is None else dict(meta),
    )

  def _evaluate(self, value, what: str, in_avals, where: str, normalise=None):
    """A launch value for these avals (`launch_values.evaluate`): a callable's result, normalised by
    ``normalise``; a value given as it is, checked when the launch was made. Under jax.export with shape
    polymorphism, out_shape, the grid and the scalars may depend on symbolic dimensions (launch_programs.py);
    block, smem_bytes, scratch_bytes and whatever a config's meta computes may not."""
    if not callable(value):
      return value
    meta = self.meta if what in _META_OPTIONS else None
    follows_shapes = meta is None and what in ("out_shape", "grid", "scalars")
    result = launch_values.evaluate(value, what, in_avals, where, meta=meta, follows_shapes=follows_shapes)
    return result if normalise is None else normalise(result)

  def spec(self, in_avals, call_site: str) -> tuple[LaunchSpec, tuple[jax.core.ShapedArray, ...], bool]:
    """The launch for inputs of these avals: (spec, output avals, single output)."""
    where = who(self.kernel, call_site)
    for i, aval in enumerate(in_avals):
      if not hasattr(aval, "shape"):
        raise LaunchError(f"{where}: input {i} is not an array")
    out_avals, single = launch_values.out_avals(self._evaluate(self.out_shape, "out_shape", in_avals, where), where)
    grid = self._evaluate(self.grid, "grid", in_avals, where,
                          lambda v: launch_values.dims(v, "grid", where, symbolic=True))
    block = self._evaluate(self.block, "block", in_avals, where, lambda v: launch_values.dims(v, "block", where))
    smem = self._evaluate(self.smem_bytes, "smem_bytes", in_avals, where,
                          lambda v: launch_values.integer(v, "smem_bytes", where))
    scalars, computed = self.scalars, ()
    if callable(scalars) or not all(isinstance(s, launch_values.Scalar) for s in scalars):
      values = self._evaluate(scalars, "scalars", in_avals, where)
      scalars = launch_values.scalars(values, where)
      computed = tuple((k, v) for k, v in enumerate(values) if isinstance(v, DimScalar))
    scratch = self._evaluate(self.scratch_bytes, "scratch_bytes", in_avals, where,
                             lambda v: launch_values.scratch_bytes(v, where))
    if self.zero_scratch and not scratch:
      raise LaunchError(f"{where}: zero_scratch=True without scratch_bytes; ask for scratch_bytes=N")
    n_in, n_out = len(in_avals), len(out_avals)
    for i, o in self.aliases:
      if not 0 <= i < n_in:
        raise LaunchError(f"{where}: input_output_aliases key {i} is not an input index (0..{n_in - 1})")
      if not 0 <= o < n_out:
        raise LaunchError(f"{where}: input_output_aliases value {o} is not an output index (0..{n_out - 1})")
      a, b = in_avals[i], out_avals[o]
      if a.shape != b.shape or a.dtype != b.dtype:
        raise LaunchError(
            f"{where}: input {i} ({a.dtype}{list(a.shape)}) cannot alias output {o} "
            f"({b.dtype}{list(b.shape)}); aliased buffers need the same shape and dtype")
    if self.collective is not None and self.collective.symmetric is not None and \
        len(self.collective.symmetric) != n_in + n_out:
      raise LaunchError(
          f"{where}: Collective.symmetric has {len(self.collective.symmetric)} entries; it needs "
          f"one per input and output ({n_in + n_out})")
    n_scratch = 1 if scratch else 0
    order = _param_codes(self.param_order, n_in, n_out, len(scalars), self.aliases, where, n_scratch)
    if scratch:
      out_avals = out_avals + (scratch_aval(scratch),)
    decls = tuple(e for e in self.param_order or () if isinstance(e, TensorMap))
    records = []
    for decl in decls:
      buffer = int(decl.operand[2:]) if decl.operand.startswith("in") else n_in + int(decl.operand[3:])
      aval = in_avals[buffer] if buffer < n_in else out_avals[buffer - n_in]
      try:
        records += decl.record(buffer, aval, where)
      except ValueError as e:
        raise LaunchError(str(e)) from None
    programs = ()
    if computed or launch_values.has_symbolic_dim(grid):
      grid, programs = self._launch_programs(grid, computed, in_avals, out_avals, where)
    spec = LaunchSpec(
        grid=grid, block=block, cluster=self.cluster, smem_bytes=smem, uses_pdl=self.uses_pdl,
        num_inputs=n_in, num_outputs=n_out + n_scratch, param_order=order,
        scalar_data=b"".join(s.data.ljust(8, b"\0") for s in scalars),
        scalar_sizes=tuple(len(s.data) for s in scalars), scalar_dtypes=tuple(s.dtype for s in scalars),
        aliases=self.aliases, collective=self.collective, call_site=call_site,
        batch_grid_axis=self.batch_grid_axis, tensor_maps=tuple(records), tensor_map_decls=decls,
        num_scratch=n_scratch, launch_programs=programs,
        zero_outputs=(launch_values.zeroed(self.zero_outputs, n_out, self.aliases, where) +
                      ((n_out,) if self.zero_scratch else ())))
    return spec, out_avals, single

  def _launch_programs(self, grid, computed, in_avals, out_avals, where: str):
    """The grid with placeholders (a multiple of the cluster, valid everywhere) where it depends on symbolic
    sizes, and the `launch_programs` that compute those axes and the computed scalars at run time."""
    if self.collective is not None:
      raise LaunchError(f"{where}: a collective kernel's grid and scalars cannot depend on symbolic dimensions "
                        f"(inputs {'; '.join(launch_values.symbolic_inputs(in_avals))}); export once per concrete "
                        "size")
    if self.batch_grid_axis is not None:
      raise LaunchError(f"{where}: with batch_grid_axis the grid cannot depend on symbolic dimensions (the batch "
                        "multiplies it at lowering); export once per concrete size")
    shapes = [a.shape for a in in_avals] + [a.shape for a in out_avals]
    n_in, code = len(in_avals), []
    for axis, value in enumerate(grid):
      if is_symbolic_dim(value):
        code += launch_programs.program(
            launch_programs.GRID, axis,
            launch_programs.encode(value, f"grid[{axis}]", shapes, n_in, where))
    for k, scalar in computed:
      target = launch_programs.SIGNED_SCALAR if scalar.dtype.kind == "i" else launch_programs.UNSIGNED_SCALAR
      code += launch_programs.program(
          target, k, launch_programs.encode(scalar.value, f"scalars[{k}]", shapes, n_in, where))
    placeholders = tuple(self.cluster[i] if is_symbolic_dim(v) else v for i, v in enumerate(grid))
    return placeholders, tuple(code)

  def check(self, spec: LaunchSpec, in_avals, out_avals) -> None:
    """The runtime's validator, then what only this machine or the PTX knows."""
    check_launch(self.kernel, spec, in_avals, out_avals)


def _check_nvshmem(kernel: Kernel, collective: Collective | None, uses_pdl: bool, aliases, where: str) -> None:
  """A kernel that calls NVSHMEM runs only as an NVSHMEM collective, which is launched cooperatively."""
  nvshmem_call = collective is not None and collective.nvshmem
  if kernel.uses_nvshmem and not nvshmem_call:
    raise LaunchError(
        f"{where}: the kernel uses NVSHMEM, so it must run as an NVSHMEM collective: pass "
        f"collective=jmf.Collective(axis, transport='nvshmem') and call it inside shard_map"
        + (f" (it has transport={collective.transport!r})" if collective is not None else ""))
  if not nvshmem_call:
    return
  if uses_pdl:
    raise LaunchError(f"{where}: an NVSHMEM collective is launched cooperatively (nvshmemx_collective_launch), "
                      "not with programmatic dependent launch; leave uses_pdl unset")
  if aliases:
    raise LaunchError(f"{where}: input_output_aliases is not supported with transport='nvshmem' yet (symmetric "
                      "buffers are staged through NVSHMEM's heap); return a new output instead")


def _param_codes(order, n_in: int, n_out: int, n_scalars: int, aliases, where: str,
                 n_scratch: int = 0) -> tuple[int, ...]:
  """Parameter codes for `param_order` names.

  Every input, output and scalar is named once, except that an aliased
  input/output pair is one buffer: naming either member (or both) is enough,
  and a buffer a `TensorMap` describes need not be passed as a pointer too.
  The scratch buffer (output `n_out`, when there is one) is ``"scratch"``;
  `TensorMap` entries get codes TENSOR_MAP_CODE + m, in their order.
  """
  default = tuple(range(n_in + n_out + n_scratch)) + tuple(-(k + 1) for k in range(n_scalars))
  if order is None:
    return default
  names = {f"in{i}": i for i in range(n_in)}
  names.update({f"out{i}": n_in + i for i in range(n_out)})
  if n_scratch:
    names["scratch"] = n_in + n_out
  names.update({f"scalar{k}": -(k + 1) for k in range(n_scalars)})
  unknown = [entry for entry in order if not isinstance(entry, TensorMap) and entry not in names]
  unknown += [f"TensorMap of {e.operand!r}" for e in order if isinstance(e, TensorMap) and e.operand not in names]
  if unknown:
    raise LaunchError(f"{where}: param_order entry {unknown[0]!r} names nothing; use "
                      f"{', '.join(names) or 'nothing (no parameters)'}")
  maps = iter(range(TENSOR_MAP_CODE, TENSOR_MAP_CODE + len(order)))
  codes = tuple(next(maps) if isinstance(entry, TensorMap) else names[entry] for entry in order)
  described = {names[e.operand] for e in order if isinstance(e, TensorMap)}
  twice = sorted({entry for entry in order if not isinstance(entry, TensorMap) and order.count(entry) > 1})
  pairs = {i: n_in + o for i, o in aliases}
  paired = set(pairs) | set(pairs.values())
  missing = [n for n, c in names.items() if c not in codes and c not in paired and c not in described]
  neither = [f"in{i} / out{o - n_in}" for i, o in pairs.items()
             if not {i, o} & (set(codes) | described)]
  if twice or missing or neither:
    raise LaunchError(
        f"{where}: param_order must name every input, output and scalar once, and one member of each "
        f"aliased input/output pair (missing: {missing or 'none'}, repeated: {twice or 'none'}, "
        f"aliased pairs named by neither member: {neither or 'none'})")
  return codes
