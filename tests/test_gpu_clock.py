"""GPU time read from the GPU's clock inside a jitted program (transforms/gpu_clock.py), as the autotuner and the
Triton benchmark time kernels."""

import os
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mosaic_ffi as jmf
from jax_mosaic_ffi.transforms import gpu_clock

from conftest import NO_NVCC, NVCC
from hlo_inspect import custom_calls

# Holds its block for `ns` nanoseconds of the GPU's clock, then writes x + 1.
SPIN = r'''
extern "C" __global__ void spin(const float* x, float* y, int n, long long ns) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); } while ((long long)(now - start) < ns);
  for (int i = threadIdx.x; i < n; i += blockDim.x) y[i] = x[i] + 1.0f;
}
'''
N = 4096
X = jax.ShapeDtypeStruct((N,), jnp.float32)


def spin_call(ns):
  return jmf.mosaic_kernel(jmf.cuda_kernel(SPIN, "spin"), X, grid=1, block=256,
                           scalars=(np.int32(N), np.int64(ns)))


def test_the_stamps_bracket_the_body_in_the_lowered_program(isolated_disk_cache):
  spin = spin_call(1000)
  program = gpu_clock.timed(lambda x: spin(spin(x)))
  lowered = jax.jit(program).trace(X).lower(lowering_platforms=("cuda",))
  calls = custom_calls(lowered)
  assert len(calls) == 4
  assert "stablehlo.optimization_barrier" in lowered.as_text()  # the body's inputs wait for the first stamp
  # clock_before reads the first input; clock_after reads the body's last result (four buffer parameters).
  assert [c["operands"] for c in calls] == [1, 1, 1, 4]
  assert [c["results"] for c in calls] == [1, 1, 1, 1]


@pytest.mark.skipif(NVCC is None, reason=NO_NVCC)
@pytest.mark.parametrize("arch", [80, 90, 100])
def test_the_stamps_are_ptx_that_ptxas_assembles(tmp_path, arch):
  """The stamps need no compiler (PTX, as the runtime's own kernels): the driver's assembler must take them, for
  GPUs before Hopper (no PDL) and from Hopper on (a PDL-safe entry)."""
  ptxas = os.path.join(os.path.dirname(NVCC), "ptxas")
  for symbol, reads in (("clock_before", 1), ("clock_after", 4)):
    text = gpu_clock.stamp_ptx(symbol, reads, arch)
    assert ("griddepcontrol.wait" in text) == (arch >= 90)
    source = tmp_path / f"{symbol}{arch}.ptx"
    source.write_text(text)
    result = subprocess.run([ptxas, f"-arch=sm_{arch}", str(source), "-o", str(source.with_suffix(".cubin"))],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_a_call_repeated_in_one_program_is_made_every_time():
  """Each call after the previous, none merged with another by XLA, every call's results returned and right."""
  program = gpu_clock.repeated(lambda x: (jnp.sin(x) * 2 + 1,), 5)
  x = jnp.arange(8.0)
  outputs = jax.jit(program)(x)
  assert len(outputs) == 5
  for (out,) in outputs:
    np.testing.assert_allclose(out, np.sin(np.arange(8.0)) * 2 + 1, rtol=1e-6)
  assert jax.jit(program).lower(x).compile().as_text().count(" sine(") == 5


def test_a_function_without_array_results_is_refused(isolated_disk_cache):
  with pytest.raises(ValueError, match="returned no arrays"):
    jax.jit(gpu_clock.timed(lambda x: ())).trace(X).lower(lowering_platforms=("cuda",))


@pytest.mark.gpu
@pytest.mark.exclusive
@pytest.mark.parametrize("calls", [1, 3])
def test_the_gpu_time_of_kernels_of_known_length(rng, isolated_disk_cache, calls):
  """Kernels that hold the GPU for 200 us each read as 200 us each plus the gaps between kernels (about 20 us
  for the first on an H200), never less; their results are right."""
  spin_ns = 200_000
  spin = spin_call(spin_ns)

  def body(x):
    for _ in range(calls):
      x = spin(x)
    return x
  timed = jax.jit(gpu_clock.timed(body))
  x = rng.standard_normal(N).astype(np.float32)
  samples = []
  for _ in range(5):
    start, stop, y = timed(x)
    samples.append(gpu_clock.elapsed_s(start, stop))
  np.testing.assert_allclose(np.asarray(y), x + calls, rtol=1e-6)
  measured = float(np.median(samples))
  assert calls * spin_ns * 1e-9 <= measured <= calls * spin_ns * 1e-9 + 60e-6, samples
