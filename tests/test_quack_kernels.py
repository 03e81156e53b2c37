"""quack-kernels' softmax (its `Softmax` / `SoftmaxBackward` CuTe DSL classes, unchanged) through `jmf.cute_call`, as
benchmarks/kernels/quack_user.py calls them.

Runs where quack-kernels and its torch import (not in CI: torch is GBs; on the GPU machine the `quack` bundle
is carried, docs/compatibility.md). Any such machine: forward, gradient, vmap and export each lower to our
custom calls, the kernels compiled once per dtype and row length. GPU: each matches numpy on fresh random inputs,
outputs poisoned by the runtime first (conftest.py); rows long enough for quack's 2-CTA clusters and ragged ones.
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cute_required  # noqa: F401  (skips the module without the CuTe DSL)
import kernel_libraries

kernel_libraries.import_or_skip("quack.softmax", "quack-kernels")

import jax_mosaic_ffi as jmf

import benchmarks_package
import fresh_process

q = benchmarks_package.kernels("quack_user")
gpu = pytest.mark.gpu

LOWER = """
import json, warnings
import jax, jax.numpy as jnp
import jax_mosaic_ffi as jmf
from hlo_inspect import custom_calls
import benchmarks_package
q = benchmarks_package.kernels("quack_user")
x = jax.ShapeDtypeStruct((512, 4096), jnp.bfloat16)
w = jax.ShapeDtypeStruct((512, 4096), jnp.float32)
loss = lambda x, w: (q.softmax(x).astype(jnp.float32) * w).sum()
programs = {"forward": (q.softmax, (x,)), "grad": (jax.grad(loss), (x, w)),
            "vmap": (jax.vmap(q.softmax), (jax.ShapeDtypeStruct((3, 512, 4096), jnp.bfloat16),)),
            "again": (lambda x: q.softmax(x) * 2, (x,))}
found = {}
with warnings.catch_warnings():
  warnings.simplefilter("ignore")  # no GPU here
  for name, (fn, avals) in programs.items():
    lowered = jax.jit(fn).trace(*avals).lower(lowering_platforms=("cuda",))
    found[name] = [[c["target"], c["operands"], c["results"], int(c["config"].get("batch_size", 1))]
                   for c in custom_calls(lowered)]
  exported = jax.export.export(jax.jit(q.softmax), platforms=["cuda"],
                               disabled_checks=jmf.export_disabled_checks())(x)
  back = jax.export.deserialize(exported.serialize())
found["exported"] = [len(exported.serialize()), str(back.out_avals[0])]
found["compiles"] = jmf.kernel_cache_stats().compiles["cute"]
print(json.dumps(found))
"""


def test_softmax_lowers_to_our_custom_calls_compiled_once(tmp_path):
  found = fresh_process.run(LOWER, env={
      "CUTE_DSL_ARCH": "sm_90a", "CUTE_DSL_CACHE_DIR": str(tmp_path / "dsl"),
      "JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / "jmf"), "QUACK_CACHE_DIR": str(tmp_path / "quack")}).result
  ours = "jax_mosaic_ffi_cute"
  assert [c[:3] for c in found["forward"]] == [[found["forward"][0][0], 1, 1]], found
  assert found["forward"][0][0].startswith(ours)
  # The gradient: the forward, then the backward on (dy, y); both quack's kernels.
  assert [c[0].startswith(ours) for c in found["grad"]] == [True, True]
  assert [c[1:3] for c in found["grad"]] == [[1, 1], [2, 1]]
  # vmap: one call over the batch (the launcher runs per element).
  assert len(found["vmap"]) == 1 and found["vmap"][0][3] == 3
  assert "bfloat16[512,4096]" in found["exported"][1], found["exported"]
  # Forward and backward at one row length: two compiles, every later trace (vmap, a new function) a cache hit.
  assert found["compiles"] == 2


# ---------------------------------------------------------------- GPU

def bf16(rng, shape):
  return rng.standard_normal(shape, np.float32).astype(jnp.bfloat16)


def relative_error(got, want) -> float:
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30))


@gpu
@pytest.mark.parametrize("shape", [(1000, 4096), (77, 1000), (64, 32768)], ids=["4096", "ragged", "clusters"])
def test_softmax_matches_numpy(rng, shape):
  x = bf16(rng, shape)
  got = np.asarray(jax.jit(q.softmax)(x), np.float32)
  assert relative_error(got, q.softmax_reference(x)) < 2e-2


@gpu
def test_softmax_gradient_matches_numpy(rng):
  x, w = bf16(rng, (512, 4096)), rng.standard_normal((512, 4096), np.float32)
  got = jax.jit(jax.grad(lambda x: (q.softmax(x).astype(jnp.float32) * w).sum()))(x)
  y = q.softmax_reference(x)
  assert relative_error(got, y * (w - (w * y).sum(-1, keepdims=True))) < 3e-2


@gpu
def test_softmax_under_vmap_matches_numpy(rng):
  x = bf16(rng, (3, 256, 4096))
  got = np.asarray(jax.jit(jax.vmap(q.softmax))(x), np.float32)
  assert relative_error(got, q.softmax_reference(x)) < 2e-2


@gpu
def test_exported_softmax_runs_in_a_fresh_process(rng, tmp_path):
  x = bf16(rng, (256, 4096))
  exported = jax.export.export(jax.jit(q.softmax), platforms=["cuda"],
                               disabled_checks=jmf.export_disabled_checks())(jax.ShapeDtypeStruct(x.shape, x.dtype))
  path = tmp_path / "softmax.jax"
  path.write_bytes(exported.serialize())
  np.save(tmp_path / "x.npy", x.astype(np.float32))
  # The serving process imports our runtime only: not quack, not torch, not the DSL.
  found = fresh_process.run(f"""
import json, sys
import jax, jax.numpy as jnp, numpy as np
import jax_mosaic_ffi
exported = jax.export.deserialize(bytearray(open({str(path)!r}, "rb").read()))
x = jnp.asarray(np.load({str(tmp_path / "x.npy")!r})).astype(jnp.bfloat16)
y = np.asarray(exported.call(x), np.float32)
print(json.dumps({{"y": y.tolist(), "quack": "quack" in sys.modules, "torch": "torch" in sys.modules}}))
""", env={"JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / "jmf")}).result
  assert not found["quack"] and not found["torch"]
  assert relative_error(np.array(found["y"]), q.softmax_reference(x)) < 2e-2
  assert os.path.getsize(path) < 64 * 1024
