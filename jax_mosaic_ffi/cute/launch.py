"""Launching a CuTe DSL launcher with `mosaic_kernel`: compiled per specialization, launched by its host function.

    kernel = jmf.cute_kernel(launch)                 # @cute.jit launch(stream, a, b, c)
    add = jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct(x.shape, x.dtype))
    y = jax.jit(add)(x, x)

No grid, block or scalars: the launcher picks its launch, and its non-tensor arguments are compile-time
constants (``cute_kernel(launch, BLOCK=128)``, or an autotuning config's). Each traced call builds the
`Plan` of its avals (cute/plan.py), gets the kernel from the compile cache (cute/compile.py) and binds the
`mosaic_kernel` primitive with the plan's ``host_args``, which the lowering sends to the CuTe target. vmap
runs the host function once per batch element (the runtime moves each buffer and reads each element's
dimensions); aliases, ``zero_outputs``, ``fallback``, ``sharding`` and autotuning ``configs`` work as for
every kernel.
"""

from __future__ import annotations

import dataclasses

import jax

from jax_mosaic_ffi.base import source_location
from jax_mosaic_ffi.base.errors import LaunchError, who
from jax_mosaic_ffi.base.module_format import Arch
from jax_mosaic_ffi.call import fallback as fallback_lib
from jax_mosaic_ffi.call import launch_values
from jax_mosaic_ffi.call import primitive
from jax_mosaic_ffi.call.launch_options import CheckedLaunch, LaunchOptions
from jax_mosaic_ffi.cute import specs as specs_lib
from jax_mosaic_ffi.cute.compile import compile_plan
from jax_mosaic_ffi.cute.kernel import CuteFunction
from jax_mosaic_ffi.cute.plan import Plan
from jax_mosaic_ffi.toolchain.kernel import default_targets, parse_targets


@dataclasses.dataclass(frozen=True)
class HostLaunch(CheckedLaunch):
  """A checked launch whose kernel's host function launches: its spec carries the host arguments."""

  host_args: tuple[int, ...] = ()
  host_graph: bool = True

  def spec(self, in_avals, call_site: str):
    spec, out_avals, single = super().spec(in_avals, call_site)
    # No kernel parameters: the host function takes the buffers (host_args) and launches.
    return (dataclasses.replace(spec, param_order=(), host_args=self.host_args, host_graph=self.host_graph),
            out_avals, single)


# The options a CuTe DSL launch does not take, each with why.
_REFUSED = {
    "block": "block: the launcher picks its own launch",
    "cluster": "cluster: the launcher picks its own launch",
    "smem_bytes": "smem_bytes: the launcher picks its own shared memory",
    "scalars": "scalars: pass non-tensor values as constexpr keyword arguments of jmf.cute_kernel (or configs=)",
    "param_order": "param_order: the launcher takes (stream, *inputs, *outputs, **constexprs)",
    "collective": "collective: CuTe DSL kernels are not collective here",
    "batch_grid_axis": "batch_grid_axis: under vmap the host function runs once per batch element",
    "scratch_bytes": "scratch_bytes: add an output instead (zero_outputs= zeroes it)",
    "zero_scratch": "zero_scratch: add an output and name it in zero_outputs=",
    "uses_pdl": "uses_pdl: the launcher launches its kernels itself",
}


def cute_targets(targets) -> tuple[Arch, ...]:
  """The archs to compile for: given, else the visible GPUs' (arch-specific, sm_90a, from Hopper on, as the
  DSL compiles by default), else sm_90a."""
  archs = parse_targets(targets) if targets is not None else default_targets()
  return tuple(Arch(a.number, "a") if a.suffix == "" and a.number >= 90 and targets is None else a for a in archs)


def launcher(target: CuteFunction, out_shape, options: LaunchOptions):
  """The function of arrays that compiles and launches a CuTe DSL launcher (see module doc)."""
  name = target.name
  for key, why in _REFUSED.items():
    value = getattr(options, key)
    if value is not None and value is not False and value != () and not (key.endswith("bytes") and value == 0):
      raise LaunchError(f"mosaic_kernel '{name}': a CuTe DSL launcher takes no {why}")
  if options.grid is not None:
    raise LaunchError(f"mosaic_kernel '{name}': a CuTe DSL launcher takes no grid: it picks its own launch")
  aliases = dict(options.input_output_aliases or {})
  fallback = fallback_lib.create(options.fallback, f"mosaic_kernel '{name}'")
  targets = cute_targets(target.targets)

  input_tree, input_present, output_tree = target.input_tree, target.input_present, target.output_tree

  def call(*args):
    site = source_location.current()
    where = f"mosaic_kernel '{name}' at {site}"
    in_avals = tuple(jax.typeof(a) for a in args)
    shapes = out_shape(*in_avals) if callable(out_shape) else out_shape
    out_avals, single = launch_values.out_avals(shapes, where)
    present = tuple(input_present) if input_present is not None else (True,) * len(in_avals)
    in_specs = specs_lib.flat_specs(target.input_spec, len(in_avals), present, "input_spec", where)
    out_specs = specs_lib.flat_specs(target.output_spec, len(out_avals), (True,) * len(out_avals), "output_spec",
                                     where)
    tensors = tuple(specs_lib.tensor_arg(s, a, target.use_static_tensors, k, "input_spec", where)
                    for k, (s, a) in enumerate(zip(in_specs, in_avals))) + tuple(
        specs_lib.tensor_arg(s, a, target.use_static_tensors, k, "output_spec", where)
        for k, (s, a) in enumerate(zip(out_specs, out_avals)))
    for i, o in aliases.items():
      if not (0 <= i < len(in_avals) and 0 <= o < len(out_avals)):
        continue  # CheckedLaunch names the bad index
      if tensors[i] != tensors[len(in_avals) + o]:
        raise LaunchError(f"{where}: input {i} and output {o} alias, so they need the same shape, dtype and tensor "
                          "spec")
    kept = len(out_avals) - len(aliases)
    plan = Plan(tensors, len(in_avals),
                input_tree if input_tree is not None else jax.tree_util.tree_structure((0,) * len(in_avals)),
                output_tree if output_tree is not None else jax.tree_util.tree_structure((0,) * kept),
                present, tuple(sorted(aliases.values())), target.constexprs)
    kernel = compile_plan(target.fn, plan, name=name, targets=targets, options=target.compile_options,
                          compile_key=target.compile_key, where=site)
    launch = LaunchOptions(grid=1, block=1, input_output_aliases=aliases, zero_outputs=options.zero_outputs)
    checked = CheckedLaunch.create(kernel, shapes, launch, who(kernel, site))
    host = HostLaunch(**{f.name: getattr(checked, f.name) for f in dataclasses.fields(CheckedLaunch)},
                      host_args=kernel.host_args, host_graph=target.allow_cuda_graph)
    return primitive.kernel_call(host, fallback)(*args)

  return call
