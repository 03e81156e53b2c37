"""Programmatic dependent launch by default where it is safe, and the race it must not open."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mosaic_ffi as jmf
from jax_mosaic_ffi.cuda.nvrtc import program as nvrtc_program
from jax_mosaic_ffi.base.module_format import ImageKind

import fresh_process
import kernel_sources
from hlo_inspect import custom_calls

X = jax.ShapeDtypeStruct((1024,), jnp.float32)


def ptx_of(kernel):
  return next(i.data for i in kernel.images if i.kind == ImageKind.PTX).decode()


def lowered_uses_pdl(kernel, **kwargs):
  call = jmf.mosaic_kernel(kernel, X, grid=4, block=256, scalars=(np.int32(1024),), **kwargs)
  (cc,) = custom_calls(jax.jit(call).trace(X, X).lower(lowering_platforms=("cuda",)))
  return cc["config"]["uses_pdl"]


def test_compiled_kernels_wait_at_entry_and_launch_with_pdl(isolated_disk_cache):
  kernel = jmf.cuda_kernel(kernel_sources.ADD, "add", targets="sm_90")
  assert kernel.pdl_safe
  body = ptx_of(kernel).split(".entry add(", 1)[1].split("{", 1)[1]
  assert body.lstrip().startswith("griddepcontrol.wait;")  # before any load
  assert body.index("griddepcontrol.launch_dependents;") < body.index("ld.param")
  assert kernel.images[0].data[:4] == b"\x7fELF"
  assert lowered_uses_pdl(kernel) is True
  assert lowered_uses_pdl(kernel, uses_pdl=False) is False


def test_what_cannot_be_made_safe_keeps_pdl_off(isolated_disk_cache):
  as_written = jmf.cuda_kernel(kernel_sources.ADD, "add", targets="sm_90", pdl=False)
  assert not as_written.pdl_safe and "griddepcontrol" not in ptx_of(as_written)
  older = jmf.cuda_kernel(kernel_sources.ADD, "add", targets=("sm_80", "sm_90"))  # no PDL before Hopper
  assert not older.pdl_safe
  cubin = jmf.cubin_kernel({"sm_90": as_written.images[0].data}, "add")  # a binary we cannot edit
  assert not cubin.pdl_safe
  for kernel in (as_written, older, cubin):
    assert lowered_uses_pdl(kernel) is False
  assert lowered_uses_pdl(cubin, uses_pdl=True) is True  # the user's call


def test_the_instrumentation_is_in_the_cache_key(isolated_disk_cache):
  safe = jmf.cuda_kernel(kernel_sources.ADD, "add", targets="sm_90")
  as_written = jmf.cuda_kernel(kernel_sources.ADD, "add", targets="sm_90", pdl=False)
  assert safe.hash != as_written.hash
  assert jmf.cuda_kernel(kernel_sources.ADD, "add", targets="sm_90").hash == safe.hash


def test_a_kernel_that_manages_pdl_itself_is_left_as_written(isolated_disk_cache):
  source = r'''
  extern "C" __global__ void managed(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (i < n) y[i] = x[i];
  }'''
  kernel = jmf.cuda_kernel(source, "managed", targets="sm_90")
  assert kernel.pdl_safe and ptx_of(kernel).count("griddepcontrol.wait") == 1
  only_trigger = source.replace("griddepcontrol.wait", "griddepcontrol.launch_dependents")
  assert not jmf.cuda_kernel(only_trigger, "managed", targets="sm_90").pdl_safe


def test_ptx_kernels_are_instrumented_too(isolated_disk_cache):
  text = ptx_of(jmf.cuda_kernel(kernel_sources.ADD, "add", targets="sm_90", pdl=False))
  assert jmf.ptx_kernel(text, "add").pdl_safe
  assert not jmf.ptx_kernel(text, "add", pdl=False).pdl_safe
  assert not jmf.ptx_kernel(text.replace(".target sm_90", ".target sm_80"), "add").pdl_safe


def test_options_that_shape_the_cubin_reach_the_relink():
  assert nvrtc_program._jitlink_options(["-lineinfo", "--maxrregcount=64", "-Xptxas", "-v", "-DX=1"]) == [
      "-lineinfo", "-maxrregcount=64", "-Xptxas=-v"]


def test_only_the_launched_entry_is_changed():
  ptx = (".version 8.0\n.target sm_90\n.address_size 64\n"
         ".visible .entry other(\n.param .u64 p\n)\n{\nret;\n}\n"
         ".visible .entry mine(\n.param .u64 p\n)\n.maxntid 256, 1, 1\n{\n{\n.reg .b32 r;\n}\nret;\n}\n")
  text, safe = nvrtc_program.wait_at_entry(ptx, "mine")
  assert safe and text.count("griddepcontrol.wait") == 1 and text.count("launch_dependents") == 1
  assert text.index("griddepcontrol.wait") > text.index(".entry mine(")
  assert nvrtc_program.wait_at_entry(ptx, "absent") == (ptx, False)


# ------------------------------------------------------------ on the GPU

CHAIN = '''
    import json, sys
    import jax, jax.numpy as jnp, numpy as np
    import jax_mosaic_ffi as jmf
    # Each kernel reads elements written by other blocks of the kernel before
    # it (a rotation), over many waves: a launch that ran ahead of the
    # previous grid would read stale values. With argv[1] == "no-wait" the
    # kernel lets its successor launch early but never waits itself: the race
    # this guards against, which the negative control below must see.
    source = r"""
    extern "C" __global__ void rotate_add(const float* x, float* y, long long n, long long shift) {
    #ifdef NO_WAIT
      asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    #endif
      long long stride = (long long)gridDim.x * blockDim.x;
      for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += stride)
        y[i] = x[(i + shift) % n] + 1.0f;
    }
    """
    wait = sys.argv[1] == "wait"
    kernel = jmf.cuda_kernel(source, "rotate_add", options=() if wait else ("-DNO_WAIT",))
    n, links = 1 << 24, 24
    # 64 blocks of long grid-stride loops: SMs stay free while a kernel runs, so a
    # launch let in early really starts early.
    step = jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct((n,), jnp.float32), grid=64, block=256,
                             scalars=(np.int64(n), np.int64(n // 3 + 12345)), uses_pdl=True)
    def chain(x):
      for _ in range(links):
        x = step(x)
      return x
    f = jax.jit(chain)
    x = np.arange(n, dtype=np.float32) % 4096
    shift = n // 3 + 12345
    expected = x.copy()
    for _ in range(links):
      expected = np.roll(expected, -shift) + 1.0
    wrong = 0
    for _ in range(int(sys.argv[2])):
      wrong += int((np.asarray(f(x)) != expected).sum())
    print(json.dumps({"wrong": wrong, "pdl_safe": kernel.pdl_safe}))
'''


@pytest.mark.gpu
@pytest.mark.exclusive
@pytest.mark.parametrize("command_buffers", [True, False], ids=["command-buffers", "stream"])
def test_a_chain_of_pdl_launches_reads_only_finished_results(tmp_path, command_buffers):
  result = fresh_process.run(CHAIN, "wait", 20, cwd=tmp_path, env={
      "XLA_FLAGS": "" if command_buffers else "--xla_gpu_enable_command_buffer=",
      "JAX_MOSAIC_FFI_POISON_OUTPUTS": "0", "JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / "cache")}).result
  assert result["pdl_safe"]
  assert result["wrong"] == 0


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.exclusive
def test_the_chain_detects_the_race_when_a_kernel_does_not_wait(tmp_path):
  # The negative control of the test above: without griddepcontrol.wait the
  # same chain must read unfinished results, or that test could not fail.
  # Stream launches: each carries the PDL attribute, so a successor really is
  # let in early; inside a command buffer that depends on XLA's graph edges.
  result = fresh_process.run(CHAIN, "no-wait", 20, cwd=tmp_path, env={
      "XLA_FLAGS": "--xla_gpu_enable_command_buffer=",
      "JAX_MOSAIC_FFI_POISON_OUTPUTS": "0", "JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / "cache")}).result
  assert result["wrong"] > 0, "the kernel without the wait read no stale value: this chain cannot see a race"
