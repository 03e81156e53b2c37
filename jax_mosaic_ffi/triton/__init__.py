"""The Triton front end: everything that imports Triton, one wing beside cuda/ and cute/ above the transformations
(layers: api -> (cuda | triton | cute) -> transforms -> call -> toolchain -> base; docs/architecture.md).

    front_end.py          FRONT_END: this wing as mosaic_kernel picks it (call/front_end.py's protocol)
    launch_options.py     TritonLaunchOptions: its keywords of mosaic_kernel (grid, scalars, uses_pdl, param_order)

    kernel.py             triton_kernel, TritonFunction: a @triton.jit function with its constexprs and options
    compile_options.py    TritonOptions: num_warps, num_stages, num_ctas, maxnreg, Triton's other compile options
    compile.py            the compile (TritonKernel, TritonInfo) through the one compile cache
    specialize.py         a call's specialization, decided by Triton's own launcher code
    descriptors.py        Triton's calling convention for host tensor descriptors
    decorators.py         @triton.autotune / @triton.heuristics read into data
    launch.py             a Triton kernel's launch from its metadata, handed to the call layer resolved
    decorated.py          a decorated kernel's launch: the decorators applied per traced call
    decorator_args.py     a traced call's arguments as the decorators see them (ArrayArg, ArgDtype)
    tensor_descriptor.py  jmf.TensorDescriptor: a call's operands as host tensor descriptors

jax-triton's ``triton_call``, which runs on this wing, is an adapter: jax_mosaic_ffi/adapters/triton_call.py.
"""
