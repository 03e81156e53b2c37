"""The call layer: one `mosaic_kernel` launch as a JAX primitive, its lowering to the typed-FFI custom call,
and the runtime's registration with XLA; the front-end protocol (front_end.py) and the launch record every front
end resolves (launch_options.py), which name no front end.

Imports only from `toolchain` and `base`.
"""
