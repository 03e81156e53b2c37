"""The CuTe DSL front end: a wing beside cuda/ and triton/ (imports the DSL only when it compiles).

    front_end.py          FRONT_END: this wing as mosaic_kernel picks it (call/front_end.py's protocol)
    kernel.py             cute_kernel, and CuteFunction (what it returns)
    launch_options.py     CuteOptions: its keywords of mosaic_kernel (none), and what to do instead of others'
    launch.py             a launcher's launch: per trace its Plan, its kernel, the launch record
    specs.py              cutlass_call's input_spec / output_spec read into the plan's TensorArgs
    host_call.py          HostCall: the compiled host function as an extension of the launch record
    compiler/             the compiler room: cute.compile per specialization into a CuteKernel, through the compile
                          cache; imports nothing of the launch half above (compiler/__init__.py lists it)

cutlass_call's ``cute_call``, which runs on this wing, is an adapter: jax_mosaic_ffi/adapters/cute_call.py.
"""
