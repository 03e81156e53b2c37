"""PTX, cubin and the portable form (PTX compiled by the driver's JIT) run on the GPU.

The PTX and the cubin are made here with NVRTC directly, as a user with their
own toolchain would bring them, then wrapped with jmf.ptx_kernel /
jmf.cubin_kernel and checked against numpy (outputs start poisoned: conftest).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mosaic_ffi as jmf
from jax_mosaic_ffi.base import gpu_info
from jax_mosaic_ffi.base.module_format import ImageKind

SAXPY = r'''
extern "C" __global__ void saxpy(const float* x, const float* y, float* out, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a * x[i] + y[i];
}
'''


def nvrtc_compile(source: str, arch: str) -> bytes:
  """PTX for "compute_NN", a cubin for "sm_NN"."""
  from cuda.bindings import nvrtc
  jmf.cuda_kernel(SAXPY, "saxpy")  # loads the NVRTC library the way the package finds it

  def check(result, *values):
    assert result == nvrtc.nvrtcResult.NVRTC_SUCCESS, result
    return values[0] if len(values) == 1 else values or None

  prog = check(*nvrtc.nvrtcCreateProgram(source.encode(), b"saxpy.cu", 0, [], []))
  try:
    compiled = nvrtc.nvrtcCompileProgram(prog, 1, [f"--gpu-architecture={arch}".encode()])
    if compiled[0] != nvrtc.nvrtcResult.NVRTC_SUCCESS:
      size = check(*nvrtc.nvrtcGetProgramLogSize(prog))
      log = b" " * size
      check(*nvrtc.nvrtcGetProgramLog(prog, log))
      raise AssertionError(log.decode())
    get_size, get = ((nvrtc.nvrtcGetCUBINSize, nvrtc.nvrtcGetCUBIN) if arch.startswith("sm_")
                     else (nvrtc.nvrtcGetPTXSize, nvrtc.nvrtcGetPTX))
    data = b" " * check(*get_size(prog))
    check(*get(prog, data))
    return data.rstrip(b"\0") if not arch.startswith("sm_") else data
  finally:
    nvrtc.nvrtcDestroyProgram(prog)


def gpu_arch() -> int:
  return gpu_info.visible_gpus()[0].arch


def saxpy_call(kernel, n, a):
  return jax.jit(jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct((n,), jnp.float32), grid=jmf.cdiv(n, 128),
                                   block=128, scalars=(np.float32(a), np.int32(n))))


def check_saxpy(kernel, rng):
  for n in (1, 1000, 1 << 16):
    x, y = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    a = np.float32(rng.standard_normal())
    np.testing.assert_allclose(np.asarray(saxpy_call(kernel, n, a)(x, y)), a * x + y, rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("pdl", [True, False])
def test_a_ptx_kernel_runs_and_matches_numpy(rng, isolated_disk_cache, pdl):
  ptx = nvrtc_compile(SAXPY, f"compute_{gpu_arch()}")
  kernel = jmf.ptx_kernel(ptx, "saxpy", pdl=pdl)
  assert [i.kind for i in kernel.images] == [ImageKind.PTX]
  check_saxpy(kernel, rng)


@pytest.mark.gpu
def test_a_cubin_kernel_runs_and_matches_numpy(rng, isolated_disk_cache):
  cubin = nvrtc_compile(SAXPY, f"sm_{gpu_arch()}")
  assert cubin[:4] == b"\x7fELF"
  check_saxpy(jmf.cubin_kernel({f"sm_{gpu_arch()}": cubin}, "saxpy"), rng)


@pytest.mark.gpu
def test_the_portable_form_runs_through_the_drivers_jit(rng, isolated_disk_cache):
  # Built for sm_80 only: a cubin of another major version cannot load here,
  # so the runtime must choose the kept PTX and have the driver compile it.
  if gpu_arch() // 10 == 8:
    pytest.skip("an sm_8x GPU would run the sm_80 cubin itself")
  kernel = jmf.cuda_kernel(SAXPY, "saxpy", targets=("sm_80",))
  assert sorted((i.kind.name, i.arch.number) for i in kernel.images) == [("CUBIN", 80), ("PTX", 80)]
  check_saxpy(kernel, rng)


def test_the_formats_made_here_wrap_and_lower(isolated_disk_cache):
  # The CPU half of the tests above: NVRTC's outputs are what the wrappers take.
  ptx = nvrtc_compile(SAXPY, "compute_90")
  cubin = nvrtc_compile(SAXPY, "sm_90")
  for kernel in (jmf.ptx_kernel(ptx, "saxpy"), jmf.cubin_kernel({"sm_90": cubin}, "saxpy")):
    x = jax.ShapeDtypeStruct((256,), jnp.float32)
    call = jmf.mosaic_kernel(kernel, x, grid=2, block=128, scalars=(np.float32(2), np.int32(256)))
    assert "jax_mosaic_ffi_launch" in jax.jit(call).trace(x, x).lower(lowering_platforms=("cuda",)).as_text()
