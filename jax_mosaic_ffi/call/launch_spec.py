"""What one `mosaic_kernel` call launches: its arguments, normalised and checked.

Two steps, both pure (no lowering, no GPU needed):

* `LaunchOptions.create` checks the arguments given to `mosaic_kernel` once,
  when the wrapper is made: types, names, aliases.
* `LaunchOptions.spec` runs on every trace, with the input avals: it
  evaluates the arguments given as callables of the avals, builds the
  `LaunchSpec`, and has the C++ runtime's validator (csrc/contract.cc, the
  one owner of the contract) check the very attributes the lowering will
  emit. Trace-time and instantiate-time checks cannot disagree.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from jax_mosaic_ffi import _core
from jax_mosaic_ffi import gpu_info
from jax_mosaic_ffi.collective import Collective
from jax_mosaic_ffi.kernel import Kernel
from jax_mosaic_ffi.tensor_map import TensorMap, scratch_aval


class LaunchError(ValueError):
  """A `mosaic_kernel` call that cannot launch as written."""


TENSOR_MAP_CODE = _core.LIMITS["tensor_map_code"]


def cdiv(a: int, b: int) -> int:
  """Ceiling division, for grids: ``cdiv(n, 256)`` blocks of 256 cover n."""
  return -(-int(a) // int(b))


_SCALAR_KINDS = "biuf"
_EXTRA_SCALAR_TYPES = (ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2)


def who(kernel: Kernel, call_site: str) -> str:
  return f"mosaic_kernel '{kernel.name}' at {call_site}"


# ------------------------------------------------------------ normalisers

def _int(value, what: str, where: str) -> int:
  """A Python or numpy integer, nothing that only looks like one."""
  if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Integral, np.integer)):
    raise LaunchError(f"{where}: {what} must be an integer, got {value!r} ({type(value).__name__})")
  return int(value)


def _dims(value, what: str, where: str) -> tuple[int, int, int]:
  if isinstance(value, (numbers.Integral, np.integer)) and not isinstance(value, (bool, np.bool_)):
    value = (value,)
  if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
    raise LaunchError(f"{where}: {what} must be an int or a tuple of up to 3 ints, got {value!r}")
  if not 1 <= len(value) <= 3:
    raise LaunchError(f"{where}: {what} must have 1 to 3 dimensions, got {tuple(value)}")
  dims = tuple(_int(v, f"{what}[{i}]", where) for i, v in enumerate(value))
  return dims + (1,) * (3 - len(dims))


def _scalar_bytes(value, index: int, where: str) -> bytes:
  if isinstance(value, (jax.Array, jax.core.Tracer)):
    raise LaunchError(
        f"{where}: scalars[{index}] is a JAX array; scalars are baked into the launch "
        "at trace time, so pass a numpy scalar (np.int32(n)), or pass the value as an input array")
  if isinstance(value, (bool, np.bool_)):
    return bytes([1 if value else 0])
  if isinstance(value, (int, float)) and not isinstance(value, np.generic):
    kind = "np.int32(...) or np.int64(...)" if isinstance(value, int) else "np.float32(...) or np.float64(...)"
    raise LaunchError(
        f"{where}: scalars[{index}] is a Python {type(value).__name__}, whose width the "
        f"kernel's parameter cannot be guessed from; pass {kind}")
  if isinstance(value, np.generic) and (value.dtype.kind in _SCALAR_KINDS or isinstance(value, _EXTRA_SCALAR_TYPES)):
    if value.dtype.itemsize > 8:
      raise LaunchError(f"{where}: scalars[{index}] has dtype {value.dtype}, wider than 8 bytes")
    return np.asarray(value).astype(value.dtype.newbyteorder("<")).tobytes()
  raise LaunchError(
      f"{where}: scalars[{index}] has unsupported type {type(value).__name__}; scalars "
      "are numpy integer, float (float16/bfloat16/float32/float64) or bool values")


def _scalars(values, where: str) -> tuple[bytes, ...]:
  if isinstance(values, (np.generic, np.ndarray, jax.Array, str, bytes)) or not isinstance(values, Sequence):
    raise LaunchError(
        f"{where}: scalars must be a tuple of numpy scalars, got {values!r}; for one scalar write "
        "scalars=(np.int32(n),)")
  return tuple(_scalar_bytes(v, k, where) for k, v in enumerate(values))


def _out_avals(out_shape, where: str) -> tuple[tuple[jax.core.ShapedArray, ...], bool]:
  """The output avals, and whether one output (not a sequence) was given."""
  single = hasattr(out_shape, "shape") and hasattr(out_shape, "dtype")
  if not single and (isinstance(out_shape, (str, bytes)) or not isinstance(out_shape, Sequence)):
    raise LaunchError(
        f"{where}: out_shape must be a jax.ShapeDtypeStruct or a sequence of them, got {out_shape!r}")
  shapes = (out_shape,) if single else tuple(out_shape)
  if not shapes:
    raise LaunchError(f"{where}: out_shape must name at least one output")
  avals = []
  for i, s in enumerate(shapes):
    if not (hasattr(s, "shape") and hasattr(s, "dtype")):
      raise LaunchError(f"{where}: out_shape[{i}] must be a jax.ShapeDtypeStruct, got {s!r}")
    if isinstance(s.shape, (str, bytes)) or not isinstance(s.shape, Sequence):
      raise LaunchError(f"{where}: out_shape[{i}].shape must be a tuple of ints, got {s.shape!r}")
    shape = tuple(_int(d, f"out_shape[{i}] dimension {k}", where) for k, d in enumerate(s.shape))
    if any(d < 0 for d in shape):
      raise LaunchError(f"{where}: out_shape[{i}] has a negative dimension: {shape}")
    try:
      dtype = jnp.dtype(s.dtype)
    except TypeError as e:
      raise LaunchError(f"{where}: out_shape[{i}] has dtype {s.dtype!r}, which is not a JAX dtype") from e
    avals.append(jax.core.ShapedArray(shape, dtype))
  return tuple(avals), single


def _scratch(value, where: str) -> int:
  nbytes = _int(value, "scratch_bytes", where)
  if not 0 <= nbytes <= 1 << 40:
    raise LaunchError(f"{where}: scratch_bytes = {nbytes} is out of range 0..2^40")
  return nbytes


def _flag(value, what: str, where: str) -> bool:
  if not isinstance(value, (bool, np.bool_)):
    raise LaunchError(f"{where}: {what} must be True or False, got {value!r}")
  return bool(value)


def _zero_outputs_option(value, where: str):
  if isinstance(value, (bool, np.bool_)):
    return bool(value)
  if isinstance(value, str) or not isinstance(value, Sequence) or \
      not all(isinstance(o, (int, np.integer)) and not isinstance(o, bool) for o in value):
    raise LaunchError(f"{where}: zero_outputs must be True (every output) or a sequence of output indices, "
                      f"got {value!r}")
  return tuple(int(o) for o in value)


def _zeroed(option, n_out: int, aliases, where: str) -> tuple[int, ...]:
  """The outputs zeroed before every launch: the kernel accumulates into them."""
  aliased = {o for _, o in aliases}
  if option is True:
    return tuple(o for o in range(n_out) if o not in aliased)
  if option is False:
    return ()
  for o in option:
    if not 0 <= o < n_out:
      raise LaunchError(f"{where}: zero_outputs names output {o}, but the call has {n_out} output(s)")
    if o in aliased:
      raise LaunchError(f"{where}: zero_outputs names output {o}, which an input aliases: zeroing it would "
                        "erase that input; leave it out, or zero the input before the call")
  return tuple(sorted(set(option)))


def _aliases(aliases, where: str) -> tuple[tuple[int, int], ...]:
  if not aliases:
    return ()
  if not isinstance(aliases, Mapping):
    raise LaunchError(f"{where}: input_output_aliases must be a dict {{input_index: output_index}}, got {aliases!r}")
  pairs = [(_int(i, "an input_output_aliases key", where), _int(o, "an input_output_aliases value", where))
           for i, o in aliases.items()]
  outputs = [o for _, o in pairs]
  if len(set(outputs)) != len(outputs):
    raise LaunchError(f"{where}: input_output_aliases maps two inputs to one output")
  return tuple(sorted(pairs))


# ---------------------------------------------------------- the spec

@dataclasses.dataclass(frozen=True)
class LaunchSpec:
  """Everything about one call site that is not the kernel's code."""

  grid: tuple[int, int, int]
  block: tuple[int, int, int]
  cluster: tuple[int, int, int]
  smem_bytes: int
  uses_pdl: bool
  num_inputs: int
  num_outputs: int
  param_order: tuple[int, ...]  # buffer index >= 0 (inputs, then outputs); scalar k as -(k + 1)
  scalar_data: bytes            # 8 bytes per scalar, little-endian
  scalar_sizes: tuple[int, ...]
  aliases: tuple[tuple[int, int], ...]  # (input, output)
  collective: Collective | None
  call_site: str
  # vmap: the primitive's buffers hold batch_size elements each, batch_strides
  # bytes apart (0: an input shared by all). Launched once per element by the
  # runtime, or, with batch_grid_axis (0, 1, 2), as one launch with that grid
  # axis multiplied (see `attributes`).
  batch_size: int = 1
  batch_strides: tuple[int, ...] = ()
  batch_grid_axis: int | None = None
  # TMA descriptors the runtime builds (tensor_map.py): kTensorMapFields ints
  # each, flat, and their declarations (for messages). Scratch: the last
  # `num_scratch` outputs are the call's scratch buffer, not returned;
  # `zero_outputs` are zeroed before every launch.
  tensor_maps: tuple[int, ...] = ()
  tensor_map_decls: tuple[TensorMap, ...] = ()
  num_scratch: int = 0
  zero_outputs: tuple[int, ...] = ()
  # Not part of the launch: the jax.numpy function lowered instead of the
  # kernel off CUDA (fallback.py). Compared by identity.
  fallback: Any = None

  def attributes(self, kernel: Kernel) -> dict[str, Any]:
    """The contract attributes of the custom call (docs/contract.md), as Python values.

    Collective calls get their clique attributes at lowering, from the mesh.
    A kernel written for a batch on a grid axis (``batch_grid_axis``) always
    gets, after its scalars, a `u32`: the axis's length for one element (its
    element is blockIdx / that), and one `u64` per buffer (inputs, then
    outputs): the bytes between elements, 0 for a shared input (all 0 when
    the call is not batched). A batch is then one launch, the axis
    `batch_size` times longer.
    """
    grid, order = list(self.grid), list(self.param_order)
    sizes, data = list(self.scalar_sizes), self.scalar_data
    if self.batch_grid_axis is not None:
      grid[self.batch_grid_axis] *= self.batch_size
      strides = self.batch_strides or (0,) * (self.num_inputs + self.num_outputs)
      extra = [np.uint32(self.grid[self.batch_grid_axis])] + [np.uint64(s) for s in strides]
      order += [-(len(sizes) + k + 1) for k in range(len(extra))]
      sizes += [v.dtype.itemsize for v in extra]
      data += b"".join(v.tobytes().ljust(8, b"\0") for v in extra)
    attributes = {
        "module": kernel.module,
        "kernel_hash": kernel.hash,
        "kernel_name": kernel.name,
        "call_site": self.call_site,
        "use_custom_barrier": False,
        "uses_xla_collective_metadata": self.collective is not None,
        "grid": grid,
        "block": list(self.block),
        "cluster": list(self.cluster),
        "smem_bytes": self.smem_bytes,
        "uses_pdl": self.uses_pdl,
        "num_inputs": self.num_inputs,
        "num_outputs": self.num_outputs,
        "param_order": order,
    }
    if sizes:
      attributes["scalar_sizes"] = sizes
      attributes["scalar_data"] = data
    if self.tensor_maps:
      attributes["tensor_maps"] = list(self.tensor_maps)
    if self.zero_outputs:
      attributes["zero_outputs"] = list(self.zero_outputs)
    if self.batch_size > 1 and self.batch_grid_axis is None:
      attributes["batch_size"] = self.batch_size
      attributes["batch_strides"] = list(self.batch_strides)
    return attributes


def validate(kernel: Kernel, spec: LaunchSpec, attributes: dict | None = None) -> dict:
  """The runtime's own checks of these attributes: {"param_sizes", "num_buffers"}.

  Without ``attributes``, a collective call is checked with a one-device
  clique standing in for its mesh, which only the lowering knows (and checks).
  """
  if attributes is None:
    attributes = spec.attributes(kernel)
    if spec.collective is not None:
      attributes["xla_replica_ids"] = "0"
  try:
    return _core.validate_launch(attributes, spec.collective is not None)
  except ValueError as e:
    text = str(e)
    for m, decl in enumerate(spec.tensor_map_decls):  # the runtime knows maps by index; name the declaration
      text = text.replace(f"tensor map {m} (", f"param_order entry {decl} (tensor map {m}, ")
    raise LaunchError(f"{who(kernel, spec.call_site)}: {text}") from None


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


def _describe_param(code: int, in_avals, out_avals, scalar_sizes) -> str:
  n_in = len(in_avals)
  if code >= TENSOR_MAP_CODE:
    return f"tensor map {code - TENSOR_MAP_CODE} (CUtensorMap, 128 bytes)"
  if code >= n_in:
    aval = out_avals[code - n_in]
    return f"out{code - n_in} ({aval.dtype}{list(aval.shape)} pointer, 8 bytes)"
  if code >= 0:
    aval = in_avals[code]
    return f"in{code} ({aval.dtype}{list(aval.shape)} pointer, 8 bytes)"
  return f"scalar{-code - 1} ({scalar_sizes[-code - 1]} bytes)"


@dataclasses.dataclass(frozen=True)
class LaunchOptions:
  """The arguments of one `mosaic_kernel(...)`, checked once. Any of
  out_shape, grid, block, smem_bytes and scalars may be a callable of the
  input avals, evaluated on every trace."""

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

  @classmethod
  def create(cls, kernel, out_shape, *, grid, block, cluster, smem_bytes, uses_pdl, scalars,
             input_output_aliases, param_order, collective, batch_grid_axis=None, scratch_bytes=0,
             zero_scratch=False, zero_outputs=(), where: str) -> "LaunchOptions":
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
      _out_avals(out_shape, where)  # checked now; kept as given, to be read per trace
    if batch_grid_axis is not None and batch_grid_axis not in ("x", "y", "z"):
      raise LaunchError(f"{where}: batch_grid_axis must be 'x', 'y', 'z' or None, got {batch_grid_axis!r}")
    if batch_grid_axis is not None and collective is not None:
      raise LaunchError(f"{where}: a collective kernel cannot take a batch on a grid axis")
    fixed = lambda value, normalise: value if callable(value) else normalise(value)  # noqa: E731
    return cls(
        kernel=kernel,
        out_shape=out_shape,
        grid=fixed(grid, lambda v: _dims(v, "grid", where)),
        block=fixed(block, lambda v: _dims(v, "block", where)),
        cluster=_dims(cluster, "cluster", where) if cluster is not None else (1, 1, 1),
        smem_bytes=fixed(smem_bytes, lambda v: _int(v, "smem_bytes", where)),
        uses_pdl=bool(uses_pdl),
        scalars=fixed(scalars, lambda v: _scalars(v, where)),
        aliases=_aliases(input_output_aliases, where),
        param_order=param_order,
        collective=collective,
        batch_grid_axis=None if batch_grid_axis is None else "xyz".index(batch_grid_axis),
        scratch_bytes=fixed(scratch_bytes, lambda v: _scratch(v, where)),
        zero_scratch=_flag(zero_scratch, "zero_scratch", where),
        zero_outputs=_zero_outputs_option(zero_outputs, where),
    )

  def _evaluate(self, value, what: str, in_avals, where: str):
    if not callable(value):
      return value
    try:
      return value(*in_avals)
    except Exception as e:
      raise LaunchError(f"{where}: {what}, a callable of the input avals, raised {type(e).__name__}: {e}") from e

  def spec(self, in_avals, call_site: str) -> tuple[LaunchSpec, tuple[jax.core.ShapedArray, ...], bool]:
    """The launch for inputs of these avals: (spec, output avals, single output)."""
    where = who(self.kernel, call_site)
    for i, aval in enumerate(in_avals):
      if not hasattr(aval, "shape"):
        raise LaunchError(f"{where}: input {i} is not an array")
    out_avals, single = _out_avals(self._evaluate(self.out_shape, "out_shape", in_avals, where), where)
    grid = _dims(self._evaluate(self.grid, "grid", in_avals, where), "grid", where)
    block = _dims(self._evaluate(self.block, "block", in_avals, where), "block", where)
    smem = _int(self._evaluate(self.smem_bytes, "smem_bytes", in_avals, where), "smem_bytes", where)
    scalars = self.scalars
    if callable(scalars):
      scalars = _scalars(self._evaluate(scalars, "scalars", in_avals, where), where)
    scratch = _scratch(self._evaluate(self.scratch_bytes, "scratch_bytes", in_avals, where), where)
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
    spec = LaunchSpec(
        grid=grid, block=block, cluster=self.cluster, smem_bytes=smem, uses_pdl=self.uses_pdl,
        num_inputs=n_in, num_outputs=n_out + n_scratch, param_order=order,
        scalar_data=b"".join(b.ljust(8, b"\0") for b in scalars),
        scalar_sizes=tuple(len(b) for b in scalars),
        aliases=self.aliases, collective=self.collective, call_site=call_site,
        batch_grid_axis=self.batch_grid_axis, tensor_maps=tuple(records), tensor_map_decls=decls,
        num_scratch=n_scratch,
        zero_outputs=_zeroed(self.zero_outputs, n_out, self.aliases, where) + ((n_out,) if self.zero_scratch else ()))
    return spec, out_avals, single

  def check(self, spec: LaunchSpec, in_avals, out_avals) -> None:
    """The runtime's validator, then what only this machine or the PTX knows."""
    check_launch(self.kernel, spec, in_avals, out_avals)


def check_launch(kernel: Kernel, spec: LaunchSpec, in_avals, out_avals) -> None:
  """The runtime's validator, then what only this machine or the PTX knows."""
  where = who(kernel, spec.call_site)
  checked = validate(kernel, spec)
  gpus = gpu_info.visible_gpus()
  if gpus:
    limit = min(g.max_shared_memory_per_block_optin for g in gpus)
    if spec.smem_bytes > limit:
      raise LaunchError(
          f"{where}: smem_bytes = {spec.smem_bytes} is over the {limit} bytes of dynamic shared "
          f"memory a block may have on {gpus[0].name}; use less shared memory per block")
  expected = kernel.param_sizes
  if expected is None or list(expected) == list(checked["param_sizes"]):
    return  # a cubin is checked against the binary when it is loaded
  described = [_describe_param(c, in_avals, out_avals, spec.scalar_sizes) for c in spec.param_order]
  if spec.batch_grid_axis is not None:
    described += ["the element's grid length (4 bytes)"] + [
        f"batch stride of buffer {b} (8 bytes)" for b in range(spec.num_inputs + spec.num_outputs)]
  if spec.collective is not None:
    described.append("collective metadata (pointer, 8 bytes)")
  raise LaunchError(
      f"{where}: the kernel takes {len(expected)} parameters of {list(expected)} bytes, but the call passes "
      f"{len(checked['param_sizes'])}: {'; '.join(described) or 'none'}. The order is inputs, outputs, then "
      "scalars" + (", then the batch parameters of batch_grid_axis" if spec.batch_grid_axis is not None else "") +
      (", then the collective metadata pointer" if spec.collective else "") +
      "; fix the kernel's signature, the scalars' dtypes, or param_order")


def empty_outputs(out_avals) -> bool:
  return all(math.prod(a.shape) == 0 for a in out_avals)

