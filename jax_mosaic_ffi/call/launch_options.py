"""`mosaic_kernel`'s shared launch options (`LaunchOptions`, what every front end takes) and the launch record
a front end resolves for one kernel (`CheckedLaunch`).

Two steps, both pure (no lowering, no GPU needed):

* A front end checks its options once, when the wrapper is made, and builds the `CheckedLaunch`: the CUDA front
  end from the options given (cuda/launch.py), Triton from its compiled kernel's metadata (block, shared memory,
  cluster), CuTe from its compiled host function (a launch extension). Nothing is checked twice.
* `CheckedLaunch.spec` runs on every trace, with the input avals: it
  evaluates the values given as callables of the avals (or of a config's
  ``meta`` and the avals: `launch_values.evaluate`), builds the `LaunchSpec`,
  and has the C++ runtime's validator (csrc/contract/contract.cc, the one
  owner of the contract) check the very attributes the lowering will emit.
  Trace-time and instantiate-time checks cannot disagree.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import jax
from jax.export import is_symbolic_dim

from jax_mosaic_ffi.base.errors import LaunchError, who
from jax_mosaic_ffi.call import launch_programs
from jax_mosaic_ffi.call import launch_values
from jax_mosaic_ffi.call import operands
from jax_mosaic_ffi.call.collective import Collective
from jax_mosaic_ffi.call.launch_extension import LaunchExtension
from jax_mosaic_ffi.call.launch_programs import DimScalar
from jax_mosaic_ffi.call.launch_spec import TENSOR_MAP_CODE, LaunchSpec, check_launch
from jax_mosaic_ffi.call.operands import Operand
from jax_mosaic_ffi.call.tensor_map import TensorMap, scratch_aval
from jax_mosaic_ffi.toolchain.kernel import Kernel


@dataclasses.dataclass(frozen=True)
class LaunchOptions:
  """The launch options of one `mosaic_kernel(...)` call that every front end takes, as given (`mosaic_kernel`
  documents each); a front end's own options (the CUDA front end's grid, block, ...) are its options object's.
  Every path (CUDA, Triton, CuTe, autotuned, sharded) takes this one object."""

  input_output_aliases: Mapping[int, int] | None = None
  fallback: Callable | None = None
  sharding: Any = None
  zero_outputs: Any = ()
  has_side_effect: bool = False
  cost_estimate: Mapping[str, Any] | None = None

  def checked(self, where: str) -> "CheckedOptions":
    """The options a launch record holds, checked once (the fallback and the sharding are the caller's: the
    primitive runs one, `mosaic_kernel` applies the other). ``zero_outputs`` may stay a callable: of a compiled
    kernel's or a config's meta (and the avals), evaluated per launch by the front end that takes one."""
    zero_outputs = self.zero_outputs
    return CheckedOptions(
        aliases=launch_values.aliases(self.input_output_aliases, where),
        zero_outputs=zero_outputs if callable(zero_outputs) else launch_values.zero_outputs_option(zero_outputs, where),
        has_side_effect=launch_values.flag(self.has_side_effect, "has_side_effect", where),
        cost_estimate=launch_values.cost_estimate(self.cost_estimate, where))


@dataclasses.dataclass(frozen=True)
class CheckedOptions:
  """The shared options in checked form, as a front end puts them in its `CheckedLaunch`."""

  aliases: tuple[tuple[int, int], ...]
  zero_outputs: Any
  has_side_effect: bool
  cost_estimate: str | None


# The options a config's meta reaches, when one is given (an autotuning config's values): the others'
# callables get the input avals alone.
_META_OPTIONS = ("grid", "block", "smem_bytes", "scalars")


@dataclasses.dataclass(frozen=True)
class CheckedLaunch:
  """The launch record of one `mosaic_kernel(...)` for one kernel, resolved by its front end and checked once.
  Any of out_shape, grid, block, smem_bytes and scalars may be a callable of the input avals (with ``meta``:
  grid, block, smem_bytes and scalars of ``(meta, *avals)``), evaluated on every trace. Every other value is in
  checked form. It names no front end: what one adds beyond a kernel launched with parameters is its
  ``extension`` (call/launch_extension.py)."""

  kernel: Kernel
  out_shape: Any
  grid: Any
  block: Any
  cluster: tuple[int, int, int]
  smem_bytes: Any
  uses_pdl: bool
  scalars: Any
  aliases: tuple[tuple[int, int], ...]
  param_order: tuple[Operand | TensorMap, ...] | None
  collective: Collective | None
  batch_grid_axis: int | None = None
  scratch_bytes: Any = 0
  zero_scratch: bool = False
  zero_outputs: Any = ()  # output indices, or True for all
  has_side_effect: bool = False
  cost_estimate: str | None = None  # JSON
  meta: Mapping[str, Any] | None = None  # an autotuning config's values, for the callables
  extension: LaunchExtension | None = None
  layouts: tuple[tuple[int, ...], ...] | None = None  # LaunchSpec.layouts

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
    if self.extension is not None and not self.extension.kernel_params:
      order = ()  # the entry takes the buffers its own way (the extension's attributes say how)
    else:
      order = _param_codes(self.param_order, n_in, n_out, len(scalars), self.aliases, where, n_scratch)
    if scratch:
      out_avals = out_avals + (scratch_aval(scratch),)
    decls = tuple(e for e in self.param_order or () if isinstance(e, TensorMap))
    records = []
    for decl in decls:
      buffer = operands.buffer_index(decl.ref, n_in, n_out)
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
                      ((n_out,) if self.zero_scratch else ())),
        has_side_effect=self.has_side_effect, cost_estimate=self.cost_estimate, extension=self.extension,
        layouts=self.layouts)
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


def _param_codes(order, n_in: int, n_out: int, n_scalars: int, aliases, where: str,
                 n_scratch: int = 0) -> tuple[int, ...]:
  """Parameter codes for a `param_order` of operands and `TensorMap` declarations.

  Every input, output and scalar is named once, except that an aliased
  input/output pair is one buffer: naming either member (or both) is enough,
  and a buffer a `TensorMap` describes need not be passed as a pointer too.
  The scratch buffer (output `n_out`, when there is one) is ``scratch``;
  `TensorMap` entries get codes TENSOR_MAP_CODE + m, in their order.
  """
  default = tuple(range(n_in + n_out + n_scratch)) + tuple(-(k + 1) for k in range(n_scalars))
  if order is None:
    return default
  codes_of = {operands.input_(i): i for i in range(n_in)}
  codes_of.update({operands.output(o): n_in + o for o in range(n_out)})
  if n_scratch:
    codes_of[operands.SCRATCH] = n_in + n_out
  codes_of.update({operands.scalar(k): -(k + 1) for k in range(n_scalars)})
  unknown = [str(entry) for entry in order if not isinstance(entry, TensorMap) and entry not in codes_of]
  unknown += [f"TensorMap of {e.operand!r}" for e in order if isinstance(e, TensorMap) and e.ref not in codes_of]
  if unknown:
    raise LaunchError(f"{where}: param_order entry {unknown[0]!r} names nothing; use "
                      f"{', '.join(map(str, codes_of)) or 'nothing (no parameters)'}")
  maps = iter(range(TENSOR_MAP_CODE, TENSOR_MAP_CODE + len(order)))
  codes = tuple(next(maps) if isinstance(entry, TensorMap) else codes_of[entry] for entry in order)
  described = {codes_of[e.ref] for e in order if isinstance(e, TensorMap)}
  twice = sorted({str(entry) for entry in order if not isinstance(entry, TensorMap) and order.count(entry) > 1})
  pairs = {i: n_in + o for i, o in aliases}
  paired = set(pairs) | set(pairs.values())
  missing = [str(n) for n, c in codes_of.items() if c not in codes and c not in paired and c not in described]
  neither = [f"in{i} / out{o - n_in}" for i, o in pairs.items()
             if not {i, o} & (set(codes) | described)]
  if twice or missing or neither:
    raise LaunchError(
        f"{where}: param_order must name every input, output and scalar once, and one member of each "
        f"aliased input/output pair (missing: {missing or 'none'}, repeated: {twice or 'none'}, "
        f"aliased pairs named by neither member: {neither or 'none'})")
  return codes
