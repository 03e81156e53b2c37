"""The Triton front end: everything that imports Triton, one wing beside cuda/ and cute/ above the transformations
(layers: api -> (cuda | triton | cute) -> transforms -> call -> toolchain -> base; docs/architecture.md).

    front_end.py          FRONT_END: this wing as mosaic_kernel picks it (call/front_end.py's protocol)
    launch_options.py     TritonLaunchOptions: its keywords of mosaic_kernel (grid, scalars, uses_pdl, param_order)

    kernel.py             triton_kernel, TritonFunction: a @triton.jit function with its constexprs and options
    decorators.py         @triton.autotune / @triton.heuristics read into data
    launch.py             a Triton kernel's launch from its metadata, handed to the call layer resolved
    decorated.py          a decorated kernel's launch: the decorators applied per traced call
    decorator_args.py     a traced call's arguments as the decorators see them (ArrayArg, ArgDtype)
    tensor_descriptor.py  jmf.TensorDescriptor: a call's operands as host tensor descriptors
    compiler/             the compile room: a function and its options -> a TritonKernel, through the compile cache;
                          imports nothing of the launch half above (compiler/__init__.py lists it)

jax-triton's ``triton_call``, which runs on this wing, is an adapter: jax_mosaic_ffi/adapters/triton_call.py.
"""
