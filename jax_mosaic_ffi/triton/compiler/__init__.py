"""The Triton wing's compiler room: a ``@triton.jit`` (or Gluon) function, its options and a call's specialization
in, a `TritonKernel` out, through the one compile cache. It imports only `toolchain` and `base` below it, never the
launch half of its wing (front_end, kernel, launch, decorators: pyproject.toml's import-linter contract).

    compile.py         compile_triton: the compile (TritonKernel, TritonInfo: Triton's launch metadata)
    options.py         TritonOptions: num_warps, num_stages, num_ctas, maxnreg and Triton's other compile options
    keys.py            the key's extras: Triton's values read whole (KeyedSource), Triton's knobs (settings_key)
    release.py         the supported Triton releases, and require_triton (TritonUnavailable)
    errors.py          what a compile that gave no kernel says
    bounds.py          BoundedSource: a tensor over the target's bound refused before Triton's stages (TensorTooLarge)
    forked.py          BoundedCompile: a compile's work in a forked child killed at the compile timeout
    stages.py          which of Triton's stages that child is in, for a CompileTimeout's message
    ttir.py            the TTIR Triton's frontend makes: the IR key's fallback and the key audit's witness
    specialize.py      a call's specialization, decided by Triton's own launcher code
    tensordesc_abi.py  Triton's calling convention for tensordesc parameters (the ABI a launch expands them to)
    languages.py       Language: what a compile takes of the language Triton's compiler compiles; TRITON
"""
