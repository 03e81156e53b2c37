"""The CuTe DSL front end: a wing beside cuda/ and triton/ (imports the DSL only when it compiles).

    front_end.py          FRONT_END: this wing as mosaic_kernel picks it (call/front_end.py's protocol)
    kernel.py             cute_kernel, and its types: CuteFunction, CuteKernel
    launch_options.py     CuteOptions: its keywords of mosaic_kernel (none), and what to do instead of others'
    compile_options.py    cute_kernel(compile_options=): the cute.compile options a launcher may pass
    launch.py             a launcher's launch: per trace its Plan, its kernel, the launch record
    compile.py            cute.compile per specialization, through the compile cache
    host_call.py          HostCall: the compiled host function as an extension of the launch record

cutlass_call's ``cute_call``, which runs on this wing, is an adapter: jax_mosaic_ffi/adapters/cute_call.py.
"""
