"""Launching a CuTe DSL launcher with `mosaic_kernel`: compiled per specialization, launched by its host function.

    kernel = jmf.cute_kernel(launch)                 # @cute.jit launch(stream, a, b, c)
    add = jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct(x.shape, x.dtype))
    y = jax.jit(add)(x, x)

No grid, block or scalars: the launcher picks its launch, and its non-tensor arguments are compile-time
constants (``cute_kernel(launch, BLOCK=128)``, or an autotuning config's). Each traced call builds the
`Plan` of its avals (compiler/plan.py), gets the kernel from the compile cache (compiler/compile.py) and binds the
`mosaic_kernel` primitive with the plan's ``host_args``, which the lowering sends to the CuTe target. vmap
runs the host function once per batch element (the runtime moves each buffer and reads each element's
dimensions), unless the launcher takes a batch mode (``batch_mode=``): then every call has a leading batch
axis on each array (of one in a plain call), the launcher's tensors take it at that mode, and vmap (nested
ones merged) makes one call over the whole batch. The options every front end takes (aliases, ``zero_outputs``,
``fallback``, ``sharding``, ``has_side_effect``, ``cost_estimate``) and autotuning ``configs`` work as for every
kernel; it has no options of its own (launch_options.py). The launch this resolves goes to the call layer as a
`CheckedLaunch` in checked form, its host function a launch extension (`HostCall`, host_call.py): the user's
options are checked once, when the launcher is made.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax

from jax_mosaic_ffi.base import source_location
from jax_mosaic_ffi.base.errors import LaunchError
from jax_mosaic_ffi.base.module_format import Arch
from jax_mosaic_ffi.call import batch_axis
from jax_mosaic_ffi.call import fallback as fallback_lib
from jax_mosaic_ffi.call import launch_values
from jax_mosaic_ffi.call import primitive
from jax_mosaic_ffi.call.launch_options import CheckedLaunch, LaunchOptions
from jax_mosaic_ffi.cute import specs as specs_lib
from jax_mosaic_ffi.cute.compiler.compile import compile_plan
from jax_mosaic_ffi.cute.host_call import HostCall
from jax_mosaic_ffi.cute.kernel import CuteFunction
from jax_mosaic_ffi.cute.launch_options import CuteOptions
from jax_mosaic_ffi.cute.compiler.plan import BATCH, Plan, TensorArg
from jax_mosaic_ffi.toolchain.kernel import default_targets, parse_targets


def cute_targets(targets) -> tuple[Arch, ...]:
  """The archs to compile for: given, else the visible GPUs' (arch-specific, sm_90a, from Hopper on, as the
  DSL compiles by default), else sm_90a."""
  archs = parse_targets(targets) if targets is not None else default_targets()
  return tuple(Arch(a.number, "a") if a.suffix == "" and a.number >= 90 and targets is None else a for a in archs)


def _with_batch(t: TensorArg, batch, batch_mode: int, index: int, what: str, where: str) -> TensorArg:
  """``t`` with a leading batch axis of extent ``batch`` in the buffer, at mode position ``batch_mode`` of the
  launcher's view (the batch is the outermost stride, whatever the element's layout: each element is one
  compact block). A dynamic tensor reads the extent at run time (plan.BATCH), so one compile serves every batch
  size; a static one compiles it in."""
  rank = t.rank + 1
  if not -rank <= batch_mode < rank:
    raise LaunchError(f"{where}: batch_mode={batch_mode} is no mode position of {what} #{index}, whose tensor "
                      f"has {rank} modes with the batch")
  mode = [m + 1 for m in t.mode]
  mode.insert(batch_mode % rank, 0)
  return dataclasses.replace(t, shape=(batch if t.static else BATCH, *t.shape), order=(t.rank, *t.order),
                             mode=tuple(mode), divisibility=(None, *t.divisibility))


def launcher(target: CuteFunction, out_shape, launch: LaunchOptions, options: CuteOptions,
             meta: Mapping[str, Any] | None = None):
  """The function of arrays that compiles and launches a CuTe DSL launcher (see module doc); ``meta``: an
  autotuning config's constexprs."""
  if meta is not None:
    target = target.with_meta(meta)
  name = target.name
  made = f"mosaic_kernel '{name}'"
  if callable(launch.zero_outputs):
    launch_values.zero_outputs_option(launch.zero_outputs, made)  # a callable of a compiled kernel's meta: not here
  # The options it takes, checked once, when the launcher is made.
  shared = launch.checked(made)
  aliases = dict(shared.aliases)
  fallback = fallback_lib.create(launch.fallback, made)
  targets = cute_targets(target.targets)
  batch_mode = target.batch_mode

  input_tree, input_present, output_tree = target.input_tree, target.input_present, target.output_tree

  def bind(args, batched: bool):
    """One mosaic_kernel call on ``args``; ``batched``: each has a leading batch axis, which the launcher's
    tensors take at mode ``batch_mode``."""
    site = source_location.current()
    where = f"mosaic_kernel '{name}' at {site}"
    in_avals = tuple(jax.typeof(a) for a in args)
    element_avals = tuple(a.update(shape=a.shape[1:]) for a in in_avals) if batched else in_avals
    shapes = launch_values.evaluate(out_shape, "out_shape", element_avals, where, follows_shapes=True)
    out_avals, single = launch_values.out_avals(shapes, where)
    present = tuple(input_present) if input_present is not None else (True,) * len(in_avals)
    in_specs = specs_lib.flat_specs(target.input_spec, len(in_avals), present, "input_spec", where)
    out_specs = specs_lib.flat_specs(target.output_spec, len(out_avals), (True,) * len(out_avals), "output_spec",
                                     where)
    tensors = tuple(specs_lib.tensor_arg(s, a, target.use_static_tensors, k, "input_spec", where)
                    for k, (s, a) in enumerate(zip(in_specs, element_avals))) + tuple(
        specs_lib.tensor_arg(s, a, target.use_static_tensors, k, "output_spec", where)
        for k, (s, a) in enumerate(zip(out_specs, out_avals)))
    if batched:
      batch = in_avals[0].shape[0]
      tensors = tuple(_with_batch(t, batch, batch_mode, k if k < len(in_avals) else k - len(in_avals),
                                  "input_spec" if k < len(in_avals) else "output_spec", where)
                      for k, t in enumerate(tensors))
      out_avals = tuple(jax.core.ShapedArray((batch, *a.shape), a.dtype) for a in out_avals)
      shapes = tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in out_avals)
      shapes = shapes[0] if single else shapes
    for i, o in aliases.items():
      if not (0 <= i < len(in_avals) and 0 <= o < len(out_avals)):
        continue  # CheckedLaunch names the bad index
      a, b = tensors[i], tensors[len(in_avals) + o]
      if (a.shape, a.dtype) != (b.shape, b.dtype):
        raise LaunchError(f"{where}: input {i} ({a.dtype}{list(a.shape)}) cannot alias output {o} "
                          f"({b.dtype}{list(b.shape)}); aliased buffers need the same shape and dtype")
      if a.order != b.order:
        raise LaunchError(f"{where}: input {i} (TensorSpec layout={a.order}) and output {o} (layout={b.order}) "
                          "alias, so they are one buffer with one physical layout; give both specs the same "
                          "layout=")
    kept = len(out_avals) - len(aliases)
    plan = Plan(tensors, len(in_avals),
                input_tree if input_tree is not None else jax.tree_util.tree_structure((0,) * len(in_avals)),
                output_tree if output_tree is not None else jax.tree_util.tree_structure((0,) * kept),
                present, tuple(sorted(aliases.values())), target.constexprs)
    kernel = compile_plan(target.fn, plan, name=name, targets=targets, options=target.compile_options,
                          compile_key=target.compile_key, where=site)
    # What the compiled specialization and the options checked above make, in checked form: handed on, not
    # checked again (the runtime's validator checks the attributes, as for every launch).
    host = CheckedLaunch(kernel=kernel, out_shape=shapes, grid=(1, 1, 1), block=(1, 1, 1), cluster=(1, 1, 1),
                         smem_bytes=0, uses_pdl=False, scalars=(), aliases=shared.aliases, param_order=None,
                         collective=None, zero_outputs=shared.zero_outputs, has_side_effect=shared.has_side_effect,
                         cost_estimate=shared.cost_estimate,
                         extension=HostCall(kernel.host_args, target.allow_cuda_graph),
                         layouts=None if all(t.row_major for t in tensors) else tuple(t.minor_to_major()
                                                                                      for t in tensors))
    element_fallback = fallback.vmapped((0,) * len(args)) if batched and fallback is not None else fallback
    return primitive.kernel_call(host, element_fallback)(*args)

  if batch_mode is None:
    return lambda *args: bind(args, False)

  return batch_axis.leading_axis_call(
      bind, f"mosaic_kernel '{name}': a launcher with batch_mode= needs at least one input array")
