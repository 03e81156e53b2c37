"""The CuTe DSL front end: a wing beside cuda/ and triton/ (imports the DSL only when it compiles).

    front_end.py  FRONT_END: this wing as mosaic_kernel picks it (call/front_end.py's protocol)
    options.py    CuteOptions: its keywords of mosaic_kernel (none), and what to do instead of others'
    call.py       cute_kernel; cute_call (cutlass.jax.cutlass_call's signature)
    launch.py     a launcher's launch: per trace its Plan, its kernel, the launch record
    host_call.py  HostCall: the compiled host function as an extension of the launch record
"""
