"""The CuTe DSL wing's compiler room: a launcher and a `Plan` per specialization and target in, a `CuteKernel` out,
through the one compile cache. It imports only `toolchain` and `base` below it, never the launch half of its wing
(front_end, kernel, launch, specs, host_call: pyproject.toml's import-linter contract).

    compile.py    cute.compile per specialization into a module (image kind 3); CuteKernel, what it compiles to
    options.py    cute_kernel(compile_options=): the cute.compile options a launcher may pass, checked
    keys.py       the key's extras: the launcher's identity without a trace, read whole by value_key; the DSL's
                  CUTE_* settings (settings_key)
    plan.py       a specialization (TensorArg per buffer: TensorSpec semantics) and its host function's arguments
    wrapper.py    the compiled host function: raw pointers and int64 dimensions -> cute.Tensors
    dsl.py        the DSL imported on first use; the supported releases (the wing's release check)
    package.py    where the DSL's runtime library is installed and its release (CuteUnavailable); imports no DSL
"""
