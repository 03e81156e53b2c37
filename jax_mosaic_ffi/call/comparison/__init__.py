"""A kernel's outputs compared with its reference's: how an output is compared, the report, the shadow mode.

numerics.py      the comparison: per-element tolerances of each dtype, non-finite values by position, ULPs
check_report.py  CheckReport (passed, failed, not checked) and its table
shadow.py        JAX_MOSAIC_FFI_VERIFY / jmf.verify: each kernel call compared with its fallback in the program

Imports only from `base`, and nothing of the rest of `call` (the lowering and transforms/check.py call into it).
`jmf.check`, the transformation that runs a function of kernels against its reference in every mode, is
transforms/check.py's: it is built on this comparison, one layer up.
"""
