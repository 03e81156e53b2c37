"""`cute_call`: NVIDIA's ``cutlass.jax.cutlass_call``, over this package's CuTe DSL wing.

It has ``cutlass_call``'s signature and behaviour, so that ``from jax_mosaic_ffi import cute_call as cutlass_call``
is all a user changes; underneath it is a `cute_kernel` launched by `mosaic_kernel`'s CuTe DSL launcher
(cute/launch.py): compiled once ever, launched by our runtime, with vmap, autodiff (`jmf.differentiable`),
sharding and export.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Sequence

import jax

from jax_mosaic_ffi.base import source_location
from jax_mosaic_ffi.base.errors import LaunchError
from jax_mosaic_ffi.call import launch_values
from jax_mosaic_ffi.call.launch_options import LaunchOptions
from jax_mosaic_ffi.adapters import cute_call_aliases
from jax_mosaic_ffi.cute import launch as cute_launch
from jax_mosaic_ffi.cute.kernel import cute_kernel
from jax_mosaic_ffi.cute.launch_options import CuteOptions


def cute_call(fn: Callable[..., None], *, output_shape_dtype: Any = None, input_spec: Any = None,
              output_spec: Any = None, input_mode: Any = None, output_mode: Any = None,
              input_output_aliases: Mapping[Any, Any] | None = None, allow_cuda_graph: bool = True,
              ffi_call_target: str | None = None, compile_options: str | None = None, compile_key=None,
              use_static_tensors: bool = False, batch_mode: int | None = None, **kwargs: Any) -> Callable[..., Any]:
  """Calls a ``@cute.jit`` launcher ``(stream, *inputs, *outputs, **kwargs)`` from JAX: ``cutlass_call``'s
  signature and behaviour, on jax_mosaic_ffi's runtime::

      @jax.jit
      def run(a, b):
        return jmf.cute_call(launch, output_shape_dtype=jax.ShapeDtypeStruct(a.shape, a.dtype))(a, b)

  Args:
    fn: the launcher. Inputs may be pytrees with None leaves (absent tensors).
    output_shape_dtype: a pytree of ``jax.ShapeDtypeStruct`` (a sequence at the root: several outputs).
    input_spec, output_spec: ``cutlass.jax.TensorSpec`` per tensor, or a pytree mirroring the inputs
      (``input_mode`` / ``output_mode``: their deprecated names). ``TensorSpec(layout=(0, 1))`` makes a 2-D
      buffer column-major: XLA lays it out so, and the tensor is compact in that order (see `cute_kernel`).
    input_output_aliases: inputs and outputs that share a buffer: ``{input index: output index}`` maps a
      whole top-level input to a whole output (pytrees of the same structure, leaf by leaf), and
      ``{input key path: output key path}`` one tensor leaf to another; an input path is rooted at the tuple
      of positional arguments, an output path at the outer output sequence::

        m_path = (jax.tree_util.SequenceKey(0), jax.tree_util.DictKey("m"))  # state["m"] of f(state)
        f = jmf.cute_call(update, output_shape_dtype=({"m": m_shape, "v": v_shape},),
                          input_output_aliases={m_path: m_path})

      Aliased leaves need the same shape, dtype and layout. The launcher does not get an aliased output (it
      writes the input): a top-level output aliased by index is left out, a leaf aliased by path is None.
    allow_cuda_graph: False keeps the call out of XLA's CUDA graphs.
    ffi_call_target: not supported (it names a target of NVIDIA's own runtime); must be None.
    compile_options: more ``cute.compile`` options.
    compile_key: a stable identity of the launcher's code and state, used as the cache key's.
    use_static_tensors: compile every tensor's shape and strides in.
    batch_mode: the mode position of a batch every tensor of the launcher takes: ``vmap`` then makes one call
      (see `cute_kernel`). Not part of cutlass_call's signature.
    **kwargs: compile-time constants passed to ``fn``.

  Returns:
    A jitted callable ``(*arrays) -> outputs``.
  """
  if output_shape_dtype is None:
    raise ValueError("'output_shape_dtype' must be specified.")
  if input_spec and input_mode:
    raise ValueError("input_spec and input_mode can not both be set. Use input_spec only as input_mode is deprecated.")
  if output_spec and output_mode:
    raise ValueError("output_spec and output_mode can not both be set. Use output_spec only as output_mode is "
                     "deprecated.")
  if ffi_call_target is not None:
    raise LaunchError(f"cute_call: ffi_call_target={ffi_call_target!r} names a custom call of NVIDIA's cutlass_call "
                      "runtime; jax_mosaic_ffi launches through its own targets. Leave ffi_call_target out")
  input_spec = input_spec or input_mode
  output_spec = output_spec or output_mode
  aliases = cute_call_aliases.normalize(input_output_aliases)
  kernel = cute_kernel(fn, input_spec=input_spec, output_spec=output_spec, use_static_tensors=use_static_tensors,
                       compile_options=compile_options, compile_key=compile_key, allow_cuda_graph=allow_cuda_graph,
                       batch_mode=batch_mode, **kwargs)
  output_shape_dtype = launch_values.shape_dtype_tree(output_shape_dtype, "output_shape_dtype",
                                                     f"cute_call '{kernel.name}'")
  multiple = isinstance(output_shape_dtype, Sequence)
  outputs = tuple(output_shape_dtype) if multiple else (output_shape_dtype,)
  out_leaves, out_tree = jax.tree_util.tree_flatten(outputs)

  @jax.jit
  def call_wrapper(*args):
    leaves, in_tree = jax.tree_util.tree_flatten(args, is_leaf=lambda x: x is None)
    present = tuple(x is not None for x in leaves)
    arrays = [x for x in leaves if x is not None]
    resolved = cute_call_aliases.resolve(aliases, args, outputs, f"cute_call '{kernel.name}' at "
                                         f"{source_location.current()}")
    target = dataclasses.replace(kernel, input_tree=in_tree, input_present=present,
                                 output_tree=jax.tree_util.tree_structure(resolved.launcher_outputs))
    options = LaunchOptions(input_output_aliases=resolved.flat)
    results = cute_launch.launcher(target, list(out_leaves), options, CuteOptions())(*arrays)
    output = jax.tree_util.tree_unflatten(out_tree, list(results) if isinstance(results, (tuple, list)) else [results])
    return output if multiple else output[0]

  return call_wrapper
