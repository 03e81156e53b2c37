"""The errors table of the docs (docs/guides/errors.md, "What each mistake says"), row by row: each mistake made
here, on the CPU, gives exactly the message the table shows (the call site written as the table writes it,
`model.py:12 (forward)`); a message of several lines, its first line, and the whole in a text block of the
guide."""

import contextlib
import os
import re
import sys
import tempfile
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mosaic_ffi as jmf
from jax_mosaic_ffi.base import gpu_info
from jax_mosaic_ffi.transforms import autotune as autotuning

import fresh_process

ERRORS_GUIDE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "guides", "errors.md")
SITE = re.compile(r"at [\w.<>-]+:\d+ \([^)]*\)")

AXPY = r'''
extern "C" __global__ void axpy(const float* x, float* y, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i];
}
'''
SCALE = r'''
#include <cuda_bf16.h>
extern "C" __global__ void scale(const __nv_bfloat16* x, __nv_bfloat16* y, int n) {}
'''
N = 1024


def table_rows() -> dict[str, str]:
  """{mistake: message} from the errors guide's table."""
  with open(ERRORS_GUIDE) as f:
    text = f.read()
  section = text.split("\n## What each mistake says\n", 1)[1].split("\n## ", 1)[0]
  return dict(re.findall(r"^\| (.+?) \| `(.+)` \|$", section, re.MULTILINE))


def text_blocks() -> list[str]:
  """The ```text blocks of the errors guide."""
  with open(ERRORS_GUIDE) as f:
    return re.findall(r"^```text\n(.*?)\n```$", f.read(), re.MULTILINE | re.DOTALL)


def axpy_call(x_dtype=jnp.float32, scalars=None, kernel_name="axpy"):
  scalars = (np.float32(2), np.int32(N)) if scalars is None else scalars
  kernel = jmf.cuda_kernel(AXPY, kernel_name)
  call = jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct((N,), jnp.float32), grid=N // 256, block=256,
                           scalars=scalars)
  return jax.jit(call).trace(jax.ShapeDtypeStruct((N,), x_dtype))


def scale_fp16():
  call = jmf.mosaic_kernel(jmf.cuda_kernel(SCALE, "scale"), jax.ShapeDtypeStruct((N,), jnp.bfloat16), grid=4,
                           block=256, scalars=(np.int32(N),))
  jax.jit(call).trace(jax.ShapeDtypeStruct((N,), jnp.float16))


def second_derivative():
  fwd = jmf.mosaic_kernel(jmf.cuda_kernel(AXPY, "axpy"), jax.ShapeDtypeStruct((N,), jnp.float32), grid=4,
                          block=256, scalars=(np.float32(2), np.int32(N)))
  f = jmf.differentiable(fwd, bwd=lambda g: 2 * g, jvp=lambda t: 2 * t)
  jax.make_jaxpr(jax.hessian(lambda x: f(x)[0]))(jax.ShapeDtypeStruct((N,), jnp.float32))


def no_derivative():
  fwd = jmf.mosaic_kernel(jmf.cuda_kernel(AXPY, "axpy"), jax.ShapeDtypeStruct((N,), jnp.float32), grid=4,
                          block=256, scalars=(np.float32(2), np.int32(N)))
  jax.make_jaxpr(jax.grad(lambda x: fwd(x)[0]))(jax.ShapeDtypeStruct((N,), jnp.float32))


def autotune_without_gpu():
  if gpu_info.has_gpu():
    pytest.skip("with a GPU the configs are timed, and nothing warns")
  kernel = jmf.cuda_kernel(AXPY, "axpy")

  def factory(meta):
    return jmf.mosaic_kernel(kernel, lambda x: x, grid=lambda x: jmf.cdiv(x.size, meta["block"]),
                             block=meta["block"], scalars=lambda x: (np.float32(2), np.int32(x.size)))

  tuned = jmf.autotune(factory, configs=[{"block": 128}, {"block": 256}], name="axpy")
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    jax.jit(tuned).trace(jax.ShapeDtypeStruct((N,), jnp.float32))
  (warning,) = [w for w in caught if w.category is autotuning.AutotuneSkipped]
  assert warning.filename == __file__  # the user's line, not jax's
  return str(warning.message)


def cute_retargeted():
  pytest.importorskip("cutlass", reason="needs nvidia-cutlass-dsl (the cute extra)")
  import cute_kernels as K
  jmf.cute_kernel(K.add_one, compile_options="--gpu-arch sm_100a")


def cute_unkeyable_compile_key():
  pytest.importorskip("cutlass", reason="needs nvidia-cutlass-dsl (the cute extra)")
  import cute_kernels as K

  class Version:  # the launcher's version as an object of the user's, equal to any other: no exact key
    __module__, __qualname__ = "model", "Version"

    def __repr__(self):
      return "Version()"

    def __eq__(self, other):
      return True

    __hash__ = object.__hash__

  jmf.cute_kernel(K.add_one, compile_key=Version())


def triton_absurd_warps():
  from triton_required import import_triton
  import_triton()
  import triton_sources as ts
  jmf.triton_kernel(ts.add, num_warps=2**40)


def triton_out_type_not_a_shape():
  from triton_required import import_triton
  import_triton()
  import triton_sources as ts
  x = jnp.zeros(8, jnp.float32)
  jmf.triton_call(x, x, 8, kernel=ts.add, out_type=5, grid=1, BLOCK=8)


def triton_block_too_large():
  from triton_required import import_triton
  import_triton()
  import triton_sources as ts
  jmf.triton_kernel(ts.add, constexprs={"BLOCK": 2**20}, signature=["*fp32", "*fp32", "*fp32", "i32"],
                    targets=["sm_90"])  # the bound is the target's: one target on any machine


def triton_bad_compute_capability():
  from triton_required import import_triton
  import_triton()
  import triton_sources as ts
  x = jnp.zeros(8, jnp.float32)
  jmf.triton_call(x, x, n=8, kernel=ts.add, out_type=x, grid=1, BLOCK=8, compute_capability="banana")


def zeroed(meta):  # reads a metaparameter the call does not pass
  return (0,) if meta["ZERO"] else ()


def triton_zeroed_outputs_raises():
  from triton_required import import_triton
  import_triton()
  import triton_sources as ts
  x = jnp.zeros(8, jnp.float32)
  jmf.triton_call(x, x, n=8, kernel=ts.add, out_type=x, grid=1, BLOCK=8, zeroed_outputs=zeroed)


# The user's model.py, as the guide shows its message: the kernel's source a literal, compiled at line 12.
MODEL = '''import jax_mosaic_ffi as jmf

SOURCE = r"""
extern "C" __global__ void scale(float* y, float a) {
  int i = threadIdx.x;
  y[i] = a * undefined_name;
}
"""


def forward():
  return jmf.cuda_kernel(SOURCE, "scale")
'''


def typo_in_a_kernel():
  with tempfile.TemporaryDirectory() as folder, contextlib.chdir(folder):
    with open("model.py", "w") as f:
      f.write(MODEL)
    sys.path.insert(0, folder)
    sys.modules.pop("model", None)
    try:
      import model
      model.forward()
    finally:
      sys.path.remove(folder)
      sys.modules.pop("model", None)


def verify_without_fallback():
  call = jmf.mosaic_kernel(jmf.cuda_kernel(AXPY, "axpy"), jax.ShapeDtypeStruct((N,), jnp.float32), grid=N // 256,
                           block=256, scalars=(np.float32(2), np.int32(N)))
  with jmf.verify("first"), warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    jax.jit(call).trace(jax.ShapeDtypeStruct((N,), jnp.float32)).lower(lowering_platforms=("cuda",))
  (warning,) = [w for w in caught if w.category is jmf.UncheckedKernelWarning]
  assert warning.filename == __file__  # the line that calls the kernel
  return str(warning.message)


def verify_misspelt():
  script = """
    import json
    try:
      import jax_mosaic_ffi
      print(json.dumps("imported"))
    except ValueError as e:
      print(json.dumps(str(e)))
  """
  return fresh_process.run(script, env={"JAX_MOSAIC_FFI_VERIFY": "frist"}).result


def check_output_dtype():
  report = jmf.check(lambda x: (x / 3).astype(jnp.float16), jnp.zeros(1000), reference=lambda x: x / 3, shapes=None,
                     vmap=False, eager=False, grads=False)
  return report.failures[0].describe()


def check_integer_tolerance():
  jmf.check(lambda x: x + 1, jnp.zeros(8, jnp.int32), tolerances={jnp.int32: (0, 1)})


def pack_not_there():
  jmf.load_pack("model.jmfpack")


def targets_with_a_suffix():
  os.environ["JAX_MOSAIC_FFI_TARGETS"] = "sm_100a"
  try:
    jmf.cuda_kernel(AXPY, "axpy")
  finally:
    del os.environ["JAX_MOSAIC_FFI_TARGETS"]


MISTAKES = {
    "a bf16 array into `const float*`": lambda: axpy_call(x_dtype=jnp.bfloat16),
    "an int32 array into `const float*`": lambda: axpy_call(x_dtype=jnp.int32),
    "an fp16 array into `const __nv_bfloat16*`": scale_fp16,
    "int and float scalars swapped": lambda: axpy_call(scalars=(np.int32(N), np.float32(2))),
    "a scalar of the wrong width": lambda: axpy_call(scalars=(np.float32(2), np.int64(N))),
    "a Python number as a scalar": lambda: axpy_call(scalars=(np.float32(2), N)),
    "a misspelt kernel name": lambda: axpy_call(kernel_name="axpyy"),
    "a typo in a CUDA C++ kernel (`jmf.CompileError`; its whole message below)": typo_in_a_kernel,
    "`jax.grad` of a kernel without derivatives": no_derivative,
    "a second derivative of a `jmf.differentiable` kernel": second_derivative,
    "`jmf.autotune` without a GPU (a warning, at your line)": autotune_without_gpu,
    "a CuTe DSL compile retargeted by `compile_options`": cute_retargeted,
    "a `compile_key` that cannot be keyed exactly": cute_unkeyable_compile_key,
    "a Triton launch option out of range": triton_absurd_warps,
    "an `out_type` that is no shape and dtype": triton_out_type_not_a_shape,
    "a Triton block larger than a CTA can hold": triton_block_too_large,
    "a `compute_capability` that is none": triton_bad_compute_capability,
    "a `zeroed_outputs` callable that raises": triton_zeroed_outputs_raises,
    "the shadow mode on for a kernel without a fallback (a warning, at your line)": verify_without_fallback,
    "a function whose output's dtype is not its reference's (`jmf.check`: the failed row's `describe()`)":
        check_output_dtype,
    "a tolerance for an integer output (`jmf.check`, `jmf.verify`)": check_integer_tolerance,
    "a misspelt `JAX_MOSAIC_FFI_VERIFY` (at `import jax_mosaic_ffi`)": verify_misspelt,
    "a kernel pack that is not there (`jmf.load_pack`)": pack_not_there,
    "an arch with a suffix in `JAX_MOSAIC_FFI_TARGETS`": targets_with_a_suffix,
}


def message_of(mistake) -> str:
  try:
    result = mistake()
  except Exception as e:  # noqa: BLE001  (each row's own error type is the table's business, not this test's)
    result = str(e)
  assert isinstance(result, str), "the mistake raised nothing"
  return SITE.sub("at model.py:12 (forward)", result)


def test_every_row_has_a_mistake_here():
  assert set(table_rows()) == set(MISTAKES)


@pytest.mark.parametrize("row", sorted(MISTAKES))
def test_the_readme_shows_the_exact_message(isolated_disk_cache, monkeypatch, row):
  monkeypatch.delenv(autotuning.CPU_ENV, raising=False)
  message = message_of(MISTAKES[row])
  first, _, rest = message.partition("\n")
  assert first == table_rows()[row]
  if rest:  # a message of several lines: the table shows its first, a text block of the guide the whole
    assert message in text_blocks(), message
