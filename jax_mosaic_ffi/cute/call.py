"""`cute_kernel` and `cute_call`: CuTe DSL launchers inside `jax.jit`.

`cute_call` has ``cutlass.jax.cutlass_call``'s signature and behaviour, so that
``from jax_mosaic_ffi import cute_call as cutlass_call`` is all a user changes; underneath it is a
`mosaic_kernel` launch (cute/launch.py): compiled once ever, launched by our runtime, with vmap, autodiff
(`jmf.differentiable`), sharding and export.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Sequence

import jax

from jax_mosaic_ffi.cute import package
from jax_mosaic_ffi.base import source_location
from jax_mosaic_ffi.base.errors import LaunchError, ValueKeyError
from jax_mosaic_ffi.call import launch_values
from jax_mosaic_ffi.call.launch_options import LaunchOptions
from jax_mosaic_ffi.cute import aliases as aliases_lib
from jax_mosaic_ffi.cute import compile as cute_compile
from jax_mosaic_ffi.cute import dsl
from jax_mosaic_ffi.cute import fingerprint
from jax_mosaic_ffi.cute import launch as cute_launch
from jax_mosaic_ffi.cute.kernel import CuteFunction
from jax_mosaic_ffi.cute.options import CuteOptions


def _name(fn) -> str:
  name = getattr(fn, "__name__", None) or type(fn).__name__
  return "lambda" if name == "<lambda>" else name


def cute_kernel(fn: Callable[..., None], *, input_spec=None, output_spec=None, use_static_tensors: bool = False,
                compile_options: str | None = None, compile_key=None, targets=None, allow_cuda_graph: bool = True,
                batch_mode: int | None = None, **constexprs) -> CuteFunction:
  """A CuTe DSL launcher for `mosaic_kernel`.

  ``fn`` is a ``@cute.jit`` function (or any callable that calls one) taking ``(stream, *inputs, *outputs,
  **constexprs)``: each array arrives as a ``cute.Tensor``. It is compiled with ``cute.compile`` per
  specialization when a call is traced, once ever (the compile cache keeps the object on disk)::

      @cute.jit
      def add_one(stream, x: cute.Tensor, y: cute.Tensor, *, BLOCK: cutlass.Constexpr):
        ...  # add_one_kernel(x, y).launch(grid=..., block=(BLOCK, 1, 1), stream=stream)

      f = jmf.mosaic_kernel(jmf.cute_kernel(add_one, BLOCK=256), jax.ShapeDtypeStruct(x.shape, x.dtype))
      y = jax.jit(f)(x)

  Args:
    fn: the launcher.
    input_spec, output_spec: ``cutlass.jax.TensorSpec`` per tensor (layout, mode, static, divisibility,
      ptr_assumed_align), as `cute_call` takes them. ``layout`` is the buffer's physical stride order (CuTe's
      minor-to-major: ``(0, 1)`` is column-major): XLA lays the array out so (copying it where it is laid out
      otherwise), and the launcher's tensor is compact in that order. An input and output that alias need the
      same layout.
    use_static_tensors: compile every tensor's shape and strides in.
    compile_options: more ``cute.compile`` options (``"--opt-level 3"``); not ``--gpu-arch`` (``targets=`` says
      what to compile for) nor ``--host-target`` or ``--enable-tvm-ffi`` (the runtime runs x86-64 objects of the
      DSL's own calling convention).
    compile_key: a stable value that identifies the launcher's code and state: the cache then keys on it
      instead of reading the code. Keyed by its content (a str, bytes, numbers, tuples of them...); one that
      cannot be keyed exactly is refused.
    targets: archs to compile for (default: the visible GPUs', arch-specific: ``sm_90a``).
    allow_cuda_graph: False keeps the call out of XLA's CUDA graphs.
    batch_mode: for a launcher whose tensors take a batch mode (as the DSL's GEMM examples take (M, K, L)): the
      mode position of that batch in every tensor (``2``, or ``-1`` for the last). Each tensor then has it: of
      extent 1 in a plain call, and the whole batch under ``jax.vmap``, which makes one call (inputs vmap does
      not batch are broadcast to the batch). The arrays keep their own shapes: ``(M, K)`` arrays reach the
      launcher as ``(M, K, 1)`` tensors. Without it, ``vmap`` runs the launcher once per batch element.
    **constexprs: keyword arguments passed to ``fn`` as compile-time constants.

  Raises:
    CuteUnavailable: nvidia-cutlass-dsl is missing or of an unsupported release.
  """
  dsl.check_release(package.compiler_release())
  if not callable(fn):
    raise TypeError(f"cute_kernel needs a @cute.jit launcher (a callable), got {type(fn).__name__}")
  if batch_mode is not None and (isinstance(batch_mode, bool) or not isinstance(batch_mode, int)):
    raise TypeError(f"cute_kernel: batch_mode is a mode position (an int, -1 for the last), got {batch_mode!r}")
  made = f"cute_kernel '{_name(fn)}'"
  if compile_key is not None:
    try:
      fingerprint.exact_key(compile_key, "compile_key")
    except ValueKeyError as e:
      raise LaunchError(f"{made}: compile_key={compile_key!r} cannot be keyed exactly ({e}); the cache would take "
                        "another launcher's kernel for this one. Pass a str, bytes, number, or a tuple of them "
                        "(a version string of the launcher's code and state)") from None
  compile_options = cute_compile.checked_options(compile_options, made)
  return CuteFunction(fn, _name(fn), input_spec, output_spec, bool(use_static_tensors), tuple(constexprs.items()),
                      compile_options, compile_key, None if targets is None else tuple(targets),
                      bool(allow_cuda_graph), batch_mode=batch_mode)


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
  aliases = aliases_lib.normalize(input_output_aliases)
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
    resolved = aliases_lib.resolve(aliases, args, outputs, f"mosaic_kernel '{kernel.name}' at "
                                   f"{source_location.current()}")
    target = dataclasses.replace(kernel, input_tree=in_tree, input_present=present,
                                 output_tree=jax.tree_util.tree_structure(resolved.launcher_outputs))
    options = LaunchOptions(input_output_aliases=resolved.flat)
    results = cute_launch.launcher(target, list(out_leaves), options, CuteOptions())(*arrays)
    output = jax.tree_util.tree_unflatten(out_tree, list(results) if isinstance(results, (tuple, list)) else [results])
    return output if multiple else output[0]

  return call_wrapper
