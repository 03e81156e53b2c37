"""Hand-written GPU kernels inside `jax.jit`.

    import jax_mosaic_ffi as jmf

    kernel = jmf.cuda_kernel(source, "add")
    add = jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct(x.shape, x.dtype),
                            grid=blocks, block=256, scalars=(np.int32(n),))
    y = jax.jit(add)(x, x)

Each public name is documented in its docstring (the docs site's API reference: ``bash scripts/docs.sh``);
the guides are in docs/guides/, and docs/architecture.md has the layers this file re-exports from
(base <- toolchain <- call <- transforms <- cuda | triton | cute <- gluon <- api <- ops).
"""

from __future__ import annotations

from jax_mosaic_ffi.base import versions as _versions
from jax_mosaic_ffi.base.native import core as _core

# First, so that an unsupported jax gets a message naming the supported range
# rather than an error from deep inside a module that uses it.
_versions.check(_core.BUILT_AGAINST["jaxlib"])

from jax_mosaic_ffi.base import contract  # noqa: F401  (jmf.contract: the target names)
from jax_mosaic_ffi.base.errors import (AutotuneError, CompileError, CompileTimeout, KeyAuditError, LaunchError,
                                       NotInPacks, NvshmemUnavailable, PackError, ReferenceMismatch,
                                       ReferenceMismatchWarning, StreamCaptureWarning, UncheckedKernelWarning)
from jax_mosaic_ffi.toolchain.kernel import Kernel
from jax_mosaic_ffi.store.packs import load_pack
from jax_mosaic_ffi.store.ahead import compile_ahead
from jax_mosaic_ffi.cuda.kernel import CudaKernel, cubin_kernel, cuda_kernel, ptx_kernel
from jax_mosaic_ffi.call import lowering as _lowering  # noqa: F401  (registers the CUDA lowering)
from jax_mosaic_ffi.call import registration  # noqa: F401  (jmf.registration.status(), as the docs say)
from jax_mosaic_ffi.call.comparison.check_report import CheckReport
from jax_mosaic_ffi.call.collective import Collective
from jax_mosaic_ffi.call.launch_programs import dim_scalar
from jax_mosaic_ffi.call.launch_values import cdiv
from jax_mosaic_ffi.call.primitive import mosaic_kernel_p
from jax_mosaic_ffi.call.comparison.shadow import verify
from jax_mosaic_ffi.call.tensor_map import TensorMap
from jax_mosaic_ffi.adapters.cute_call import cute_call
from jax_mosaic_ffi.cute.kernel import cute_kernel
from jax_mosaic_ffi.cute.kernel import CuteFunction
from jax_mosaic_ffi.cute.compiler.compile import CuteKernel
from jax_mosaic_ffi.cute.compiler.package import CuteUnavailable
from jax_mosaic_ffi.transforms.autodiff import differentiable
from jax_mosaic_ffi.transforms.check import check
from jax_mosaic_ffi.transforms.autotune import Autotuned, autotune
from jax_mosaic_ffi.transforms.autotune_report import report as autotune_report
from jax_mosaic_ffi.transforms.tuning_files import TuningFileIgnored, load_tuning, save_tuning
from jax_mosaic_ffi.transforms.sharding import sharded
from jax_mosaic_ffi.transforms.sharding_rules import BatchDims, Elementwise, ShardingRule
from jax_mosaic_ffi.adapters.triton_call import triton_call
from jax_mosaic_ffi.triton.compiler.compile import TritonKernel
from jax_mosaic_ffi.triton.compiler.release import TritonUnavailable
from jax_mosaic_ffi.triton.kernel import TritonFunction, triton_kernel
from jax_mosaic_ffi.triton.compiler.bounds import TensorTooLarge
from jax_mosaic_ffi.triton.tensor_descriptor import TensorDescriptor
from jax_mosaic_ffi.gluon.kernel import GluonFunction, GluonKernel, gluon_kernel
from jax_mosaic_ffi.cutile.kernel import CutileFunction, cutile_kernel
from jax_mosaic_ffi.cutile.compiler.compile import CutileKernel
from jax_mosaic_ffi.cutile.compiler.release import CutileUnavailable
from jax_mosaic_ffi.api import (KernelCacheStats, clear_kernel_cache, export_disabled_checks, kernel_cache_stats,
                                mosaic_kernel)
from jax_mosaic_ffi import ops
from jax_mosaic_ffi import testing

register = registration.register

# jax-triton's other public names live in jax_mosaic_ffi.jax_triton, whose TensorDescriptor takes an array (ours
# names an operand of mosaic_kernel): code that imported this package as `jt` is told where they are.
_JAX_TRITON_NAMES = ("strides_from_shape", "CUSTOM_CALL_TARGET_NAME", "__version_info__")


def __getattr__(name: str):
  if name in _JAX_TRITON_NAMES:
    raise AttributeError(f"jax_mosaic_ffi has no {name!r}: it is jax-triton's, and `import jax_mosaic_ffi.jax_triton "
                         f"as jt` gives jax-triton's whole public API (jt.{name}, jt.triton_call, jt.TensorDescriptor)")
  raise AttributeError(f"module 'jax_mosaic_ffi' has no attribute {name!r}")

from jax_mosaic_ffi._version import __version__  # noqa: F401  (re-exported: jax_mosaic_ffi.__version__)

__all__ = [
    "BatchDims", "Collective", "CompileError", "Elementwise", "Kernel", "KernelCacheStats", "LaunchError",
    "ShardingRule", "TensorDescriptor", "TensorMap", "cdiv", "clear_kernel_cache", "cubin_kernel", "cuda_kernel",
    "differentiable", "dim_scalar", "export_disabled_checks", "kernel_cache_stats", "mosaic_kernel", "mosaic_kernel_p",
    "ops", "ptx_kernel", "register", "sharded", "AutotuneError", "Autotuned", "TritonFunction", "TritonKernel",
    "TritonUnavailable", "NvshmemUnavailable", "autotune", "autotune_report", "triton_kernel", "TuningFileIgnored",
    "load_tuning", "save_tuning", "triton_call", "CuteFunction", "CuteKernel", "CuteUnavailable", "cute_call",
    "cute_kernel", "check", "CheckReport", "verify", "ReferenceMismatch", "ReferenceMismatchWarning",
    "UncheckedKernelWarning", "testing", "GluonFunction", "GluonKernel", "gluon_kernel", "KeyAuditError",
    "CompileTimeout", "TensorTooLarge", "CudaKernel", "load_pack", "PackError", "NotInPacks", "StreamCaptureWarning",
    "CutileFunction", "CutileKernel", "CutileUnavailable", "cutile_kernel", "compile_ahead",
]
