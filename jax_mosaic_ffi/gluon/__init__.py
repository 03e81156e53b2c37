"""The Gluon front end: ``@gluon.jit`` kernels (``triton.experimental.gluon``), a wing built on the Triton wing
(layers: api -> gluon -> (cuda | triton | cute) -> ...; docs/architecture.md, "A wing built on another").

    front_end.py   FRONT_END: this wing as mosaic_kernel picks it, on the Triton front end's launcher and options
    kernel.py      gluon_kernel, GluonFunction, GluonKernel; Gluon's host checks of a descriptor's layout
    compiler/      its compiler room: language.py, GLUON: Gluon as Triton's compiler takes it (its source,
                   stages, a failure's advice)

Everything else a Gluon kernel gets is the Triton wing's: the compile (triton/compiler/, whose keys.py reads the
code a kernel reaches through its constexprs, @aggregate classes included), the specialization, the decorators,
the launch from Triton's metadata, the scratch, and `triton_call`, which takes a Gluon kernel as jax-triton does.
"""
