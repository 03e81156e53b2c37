"""Autotuning: winners chosen per shapes, persisted on disk, reused; CUDA C++ and Triton on the GPU.

Without a GPU, autotuning times nothing and takes the default config; the
machinery (compile every config, skip failures, time, persist) is checked
here on the CPU by timing the configs' jax.numpy fallbacks
(JAX_MOSAIC_FFI_AUTOTUNE_ON_CPU=1).
"""

import hashlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mosaic_ffi as jmf
from jax_mosaic_ffi.transforms import autotune as autotuning
from jax_mosaic_ffi.transforms import timing
from jax_mosaic_ffi.base import disk_cache
from jax_mosaic_ffi.base import gpu_info

import benchmarks_package
import fresh_process
import kernel_sources
from hlo_inspect import custom_calls

gpu = pytest.mark.gpu
# Where there is a GPU, autotuning times the kernels themselves (the GPU tests below).
no_gpu = pytest.mark.skipif(gpu_info.has_gpu(), reason="checks what autotuning does without a GPU")


def slow_fallback(work):
  """A fallback that costs `work` chained matmuls: the configs' speeds differ on the CPU too."""
  def fallback(x, y):
    m = jnp.ones((96, 96), jnp.float32)
    m = jax.lax.fori_loop(0, work, lambda _, m: jnp.tanh(m @ m), m)
    return x + y + 0 * m[0, 0]
  return fallback


def add_factory(meta):
  kernel = jmf.cuda_kernel(kernel_sources.ADD, "add")
  return jmf.mosaic_kernel(kernel, lambda x, y: jax.ShapeDtypeStruct(x.shape, x.dtype),
                           grid=lambda x, y: jmf.cdiv(x.size, meta["block"]), block=meta["block"],
                           scalars=lambda x, y: (np.int32(x.size),), fallback=slow_fallback(meta["work"]))


CONFIGS = [{"block": 128, "work": 40}, {"block": 4096, "work": 0}, {"block": 256, "work": 1},
           {"block": 512, "work": 20}]


def stats():
  return jmf.kernel_cache_stats()


def test_a_fast_config_is_timed_as_several_calls():
  # Enough calls for ~2 ms of GPU time, at most 64, and no more than 1 GiB of one call's outputs per call.
  assert timing.repeats(5e-3, 1) == 1
  assert timing.repeats(1e-3, 1) == 2
  assert timing.repeats(1e-4, 1) == 20
  assert timing.repeats(1e-6, 1) == 64
  assert timing.repeats(1e-6, 1 << 29) == 2
  assert timing.repeats(1e-4, 1 << 31) == 1


@no_gpu
def test_without_a_gpu_the_default_config_is_used_with_a_note(isolated_disk_cache, monkeypatch):
  monkeypatch.delenv(autotuning.CPU_ENV, raising=False)
  x = jax.ShapeDtypeStruct((1000,), jnp.float32)
  before = stats()
  tuned = jmf.autotune(add_factory, configs=CONFIGS, default={"block": 256, "work": 1})
  with pytest.warns(autotuning.AutotuneSkipped, match="no GPU here.*config 2"):
    (cc,) = custom_calls(jax.jit(tuned).trace(x, x).lower(lowering_platforms=("cuda",)))
  assert cc["config"]["block"] == [256, 1, 1] and cc["config"]["grid"] == [4, 1, 1]
  after = stats()
  assert after.autotune_skipped == before.autotune_skipped + 1 and after.autotune_tunings == before.autotune_tunings
  assert tuned.last_report["source"] == "untuned"


@no_gpu
def test_winners_are_timed_persisted_and_reused(isolated_disk_cache, monkeypatch, capsys):
  monkeypatch.setenv(autotuning.CPU_ENV, "1")
  monkeypatch.setenv(autotuning.LOG_ENV, "1")
  x = np.arange(1000, dtype=np.float32)
  before = stats()
  tuned = jmf.autotune(add_factory, configs=CONFIGS, name="test-add")
  np.testing.assert_allclose(np.asarray(jax.jit(tuned)(x, x)), 2 * x)
  report = tuned.last_report
  assert report["source"] == "tuned"
  # block 4096 is over the limit of 1024 threads: skipped and reported, not fatal.
  assert report["table"][1]["us"] is None and "compile:" in report["table"][1]["error"]
  assert report["winner"] == 2, report["table"]  # the cheapest fallback that builds
  assert all(report["table"][k]["us"] > 0 for k in (0, 2, 3))
  assert "test-add" in capsys.readouterr().err  # JAX_MOSAIC_FFI_AUTOTUNE_LOG
  after = stats()
  assert after.autotune_tunings == before.autotune_tunings + 1
  # Another wrapper over the same configs in this process: the winner from memory.
  again = jmf.autotune(add_factory, configs=CONFIGS, name="test-add")
  assert again.best_config(x, x) == CONFIGS[2]
  assert stats().autotune_memory_hits == after.autotune_memory_hits + 1
  assert any(r["name"] == "test-add" and r["source"] == "tuned" for r in jmf.autotune_report())
  # Another shape: tuned again.
  jax.jit(tuned).trace(np.zeros(64, np.float32), np.zeros(64, np.float32))
  assert stats().autotune_tunings == after.autotune_tunings + 1
  # A fresh process finds the winner on disk and times nothing.
  script = """
    import json
    import jax, jax.numpy as jnp, numpy as np
    import jax_mosaic_ffi as jmf
    import test_autotune as t
    tuned = jmf.autotune(t.add_factory, configs=t.CONFIGS, name="test-add")
    x = np.arange(1000, dtype=np.float32)
    ok = bool(np.allclose(np.asarray(jax.jit(tuned)(x, x)), 2 * x))
    s = jmf.kernel_cache_stats()
    print(json.dumps({"ok": ok, "tunings": s.autotune_tunings, "disk": s.autotune_disk_hits,
                      "winner": tuned.last_report["winner"], "source": tuned.last_report["source"]}))
  """
  result = fresh_process.run(script, env={"JAX_MOSAIC_FFI_CACHE_DIR": str(isolated_disk_cache),
                                                       autotuning.CPU_ENV: "1"}).result
  assert result == {"ok": True, "tunings": 0, "disk": 1, "winner": 2, "source": "disk"}


def edited_factory(path):
  """Config 0 runs ADD; config 1 runs the kernel in the file at `path`."""
  def factory(meta):
    source = kernel_sources.ADD if meta["which"] == 0 else open(path).read()
    kernel = jmf.cuda_kernel(source, "add")
    return jmf.mosaic_kernel(kernel, lambda x, y: jax.ShapeDtypeStruct(x.shape, x.dtype),
                             grid=lambda x, y: jmf.cdiv(x.size, 128), block=128,
                             scalars=lambda x, y: (np.int32(x.size),), fallback=slow_fallback(meta["work"]))
  return factory


@no_gpu
def test_an_edited_kernel_in_any_config_is_tuned_again(isolated_disk_cache, monkeypatch, tmp_path):
  monkeypatch.setenv(autotuning.CPU_ENV, "1")
  path = tmp_path / "second.cu"
  path.write_text(kernel_sources.ADD)
  configs = [{"which": 0, "work": 2}, {"which": 1, "work": 0}]
  x = jax.ShapeDtypeStruct((1000,), jnp.float32)

  def source():
    jmf.clear_kernel_cache()  # memory only: what a new process finds is on disk
    tuned = jmf.autotune(edited_factory(path), configs=configs, name="test-edited")
    tuned.best_config(x, x)
    return tuned.last_report["source"]

  assert [source(), source()] == ["tuned", "disk"]
  path.write_text(kernel_sources.ADD.replace("a[i] + b[i]", "a[i] + 2.0f * b[i]"))
  assert source() == "tuned"


@no_gpu
def test_an_entry_that_does_not_decode_is_timed_again(isolated_disk_cache, monkeypatch):
  monkeypatch.setenv(autotuning.CPU_ENV, "1")
  x = jax.ShapeDtypeStruct((1000,), jnp.float32)
  jmf.autotune(add_factory, configs=CONFIGS[:3], name="test-deep").best_config(x, x)
  paths = [p for p in isolated_disk_cache.glob("*/*.bin") if b'"tuning-record-1"' in p.read_bytes()]
  assert len(paths) == 2  # configs 0 and 2; config 1 does not build, so nothing is kept for it
  # A valid checksum around JSON nested deeper than Python's parser recurses, in place of config 0's timing.
  deep = b"[" * 32000 + b"]" * 32000
  paths[0].write_bytes(disk_cache._ENTRY_HEADER.pack(disk_cache._ENTRY_MAGIC, len(deep),
                                                     hashlib.sha256(deep).digest()) + deep)
  jmf.clear_kernel_cache()
  again = jmf.autotune(add_factory, configs=CONFIGS[:3], name="test-deep")
  again.best_config(x, x)
  assert again.last_report["source"] == "tuned" and len(again.last_report["timed"]) == 1
  assert b'"tuning-record-1"' in paths[0].read_bytes()


@no_gpu
def test_a_key_scopes_winners_and_all_failing_is_an_error(isolated_disk_cache, monkeypatch):
  monkeypatch.setenv(autotuning.CPU_ENV, "1")
  before = stats()
  tuned = jmf.autotune(add_factory, configs=CONFIGS[:3], key=lambda x, y: x.size > 512, name="bucketed")
  for n in (600, 700, 100):
    v = jax.ShapeDtypeStruct((n,), jnp.float32)
    jax.jit(tuned).trace(v, v)
  assert stats().autotune_tunings == before.autotune_tunings + 2
  broken = jmf.autotune(add_factory, configs=[{"block": 2048, "work": 0}, {"block": 0, "work": 0}], name="broken")
  v = jax.ShapeDtypeStruct((100,), jnp.float32)
  with pytest.raises(jmf.AutotuneError, match=r"no config could be compiled and run(.|\n)*0: .*block(.|\n)*1: "):
    jax.jit(broken).trace(v, v)
  with pytest.raises(ValueError, match="at least one config"):
    jmf.autotune(add_factory, configs=[])
  with pytest.raises(ValueError, match="default"):
    jmf.autotune(add_factory, configs=CONFIGS, default=9)


@no_gpu
def test_mosaic_kernel_configs_pass_meta_to_the_callables(isolated_disk_cache, monkeypatch):
  monkeypatch.delenv(autotuning.CPU_ENV, raising=False)
  kernel = jmf.cuda_kernel(kernel_sources.ADD, "add")
  call = jmf.mosaic_kernel(kernel, lambda x, y: jax.ShapeDtypeStruct(x.shape, x.dtype),
                           grid=lambda meta, x, y: jmf.cdiv(x.size, meta["block"]),
                           block=lambda meta, x, y: meta["block"],
                           scalars=lambda meta, x, y: (np.int32(x.size),), configs=[{"block": 64}, {"block": 128}],
                           autotune_default=1)
  x = jax.ShapeDtypeStruct((1000,), jnp.float32)
  with pytest.warns(autotuning.AutotuneSkipped):
    (cc,) = custom_calls(jax.jit(call).trace(x, x).lower(lowering_platforms=("cuda",)))
  assert cc["config"]["block"] == [128, 1, 1] and cc["config"]["grid"] == [8, 1, 1]


# ---------------------------------------------------------------- GPU

# The corpus's CUDA tiled matmul (benchmarks/kernels/tiled_matmul.py): one config's call, as the benchmark tunes it.
tiled_matmul_factory = benchmarks_package.kernels("tiled_matmul").call


MATMUL_CONFIGS = [dict(BM=16, BN=16, BK=16, TM=1, TN=1), dict(BM=64, BN=64, BK=16, TM=4, TN=4),
                  dict(BM=128, BN=128, BK=8, TM=8, TN=8), dict(BM=64, BN=64, BK=8, TM=8, TN=8)]


@gpu
def test_cuda_cpp_matmul_autotuned_then_reused_by_a_fresh_process(rng, isolated_disk_cache):
  a = rng.standard_normal((320, 200)).astype(np.float32)
  b = rng.standard_normal((200, 288)).astype(np.float32)
  before = stats()
  tuned = jmf.autotune(tiled_matmul_factory, configs=MATMUL_CONFIGS, name="test-tiled-matmul")
  np.testing.assert_allclose(np.asarray(jax.jit(tuned)(a, b)), a @ b, rtol=1e-4, atol=1e-3)
  report = tuned.last_report
  assert report["source"] == "tuned" and all(row["us"] > 0 for row in report["table"]), report
  assert stats().autotune_tunings == before.autotune_tunings + 1
  script = """
    import json, sys
    import jax, numpy as np
    import jax_mosaic_ffi as jmf
    import test_autotune as t
    a, b = np.load(sys.argv[1] + "/a.npy"), np.load(sys.argv[1] + "/b.npy")
    tuned = jmf.autotune(t.tiled_matmul_factory, configs=t.MATMUL_CONFIGS, name="test-tiled-matmul")
    ok = bool(np.allclose(np.asarray(jax.jit(tuned)(a, b)), a @ b, rtol=1e-4, atol=1e-3))
    s = jmf.kernel_cache_stats()
    print(json.dumps({"ok": ok, "tunings": s.autotune_tunings, "disk": s.autotune_disk_hits,
                      "nvrtc": s.compiles["nvrtc"], "winner": tuned.last_report["winner"]}))
  """
  folder = isolated_disk_cache.parent
  np.save(folder / "a.npy", a)
  np.save(folder / "b.npy", b)
  result = fresh_process.run(script, folder,
                             env={"JAX_MOSAIC_FFI_CACHE_DIR": str(isolated_disk_cache)}).result
  assert result == {"ok": True, "tunings": 0, "disk": 1, "nvrtc": 0, "winner": report["winner"]}


@gpu
def test_triton_matmul_autotuned_through_configs(rng, isolated_disk_cache):
  import triton_required
  triton_required.import_triton()
  import triton_sources as ts
  call = jmf.mosaic_kernel(
      jmf.triton_kernel(ts.matmul), lambda a, b: jax.ShapeDtypeStruct((a.shape[0], b.shape[1]), a.dtype),
      grid=lambda meta, a, b: (jmf.cdiv(a.shape[0], meta["BM"]), jmf.cdiv(b.shape[1], meta["BN"])),
      scalars=lambda meta, a, b: (np.int32(a.shape[0]), np.int32(b.shape[1]), np.int32(a.shape[1])),
      configs=[dict(BM=32, BN=32, BK=32, num_warps=2), dict(BM=64, BN=64, BK=32, num_warps=4),
               dict(BM=128, BN=128, BK=64, num_warps=8, num_stages=3),
               dict(BM=64, BN=64, BK=8, num_warps=4)])  # tl.dot needs K >= 16: fails to compile, skipped
  a = rng.standard_normal((512, 256)).astype(np.float16)
  b = rng.standard_normal((256, 384)).astype(np.float16)
  before = stats()
  c = jax.jit(call)(a, b)
  np.testing.assert_allclose(np.asarray(c, np.float32), a.astype(np.float32) @ b.astype(np.float32),
                             rtol=2e-2, atol=6e-2)
  report = call.last_report
  assert report["source"] == "tuned" and report["table"][3]["error"], report
  assert sum(row["us"] is not None for row in report["table"]) == 3
  after = stats()
  assert after.compiles["triton"] >= before.compiles["triton"] + 3
  assert after.autotune_tunings == before.autotune_tunings + 1


@gpu
def test_adding_a_config_times_only_the_new_one_on_the_gpu(rng, isolated_disk_cache):
  a = rng.standard_normal((256, 192)).astype(np.float32)
  b = rng.standard_normal((192, 320)).astype(np.float32)
  before = autotuning.stats().configs_timed
  first = jmf.autotune(tiled_matmul_factory, configs=MATMUL_CONFIGS[:3], name="test-grow-gpu")
  np.testing.assert_allclose(np.asarray(jax.jit(first)(a, b)), a @ b, rtol=1e-4, atol=1e-3)
  assert first.last_report["timed"] == [0, 1, 2] and autotuning.stats().configs_timed == before + 3
  grown = jmf.autotune(tiled_matmul_factory, configs=MATMUL_CONFIGS, name="test-grow-gpu")
  np.testing.assert_allclose(np.asarray(jax.jit(grown)(a, b)), a @ b, rtol=1e-4, atol=1e-3)
  report = grown.last_report
  assert report["source"] == "tuned" and report["timed"] == [3], report
  assert autotuning.stats().configs_timed == before + 4
  assert [row["us"] for row in report["table"][:3]] == [row["us"] for row in first.last_report["table"]]
  assert report["winner"] == min(range(4), key=lambda k: report["table"][k]["us"])


@gpu
def test_a_loaded_tuning_file_picks_the_winner_without_timing(rng, isolated_disk_cache, monkeypatch, tmp_path):
  a = rng.standard_normal((320, 200)).astype(np.float32)
  b = rng.standard_normal((200, 288)).astype(np.float32)
  tuned = jmf.autotune(tiled_matmul_factory, configs=MATMUL_CONFIGS, name="test-file-gpu")
  jax.block_until_ready(jax.jit(tuned)(a, b))
  winner = tuned.last_report["winner"]
  assert jmf.save_tuning(tmp_path / "tuning.json") == len(MATMUL_CONFIGS)
  monkeypatch.setenv("JAX_MOSAIC_FFI_CACHE_DIR", str(tmp_path / "another-machine"))  # nothing on disk there
  jmf.clear_kernel_cache()
  assert jmf.load_tuning(tmp_path / "tuning.json") == len(MATMUL_CONFIGS)
  before = autotuning.stats()
  loaded = jmf.autotune(tiled_matmul_factory, configs=MATMUL_CONFIGS, name="test-file-gpu")
  c = jax.jit(loaded)(a, b)
  np.testing.assert_allclose(np.asarray(c), a @ b, rtol=1e-4, atol=1e-3)
  assert loaded.last_report["source"] == "file" and loaded.last_report["winner"] == winner
  after = autotuning.stats()
  assert after.configs_timed == before.configs_timed and after.disk_hits == before.disk_hits + 1


BOUNDED_ADD = kernel_sources.ADD.replace('extern "C" __global__ void',
                                         'extern "C" __global__ void __launch_bounds__(128)')


def bounded_add_factory(meta):
  kernel = jmf.cuda_kernel(BOUNDED_ADD, "add")
  return jmf.mosaic_kernel(kernel, lambda x, y: jax.ShapeDtypeStruct(x.shape, x.dtype),
                           grid=lambda x, y: jmf.cdiv(x.size, meta["block"]), block=meta["block"],
                           scalars=lambda x, y: (np.int32(x.size),))


@gpu
def test_a_config_asking_for_more_threads_than_its_kernel_allows_is_remembered(rng, isolated_disk_cache):
  # A block of 256 threads for a kernel bounded to 128: the runtime refuses it at the launch, every time. That
  # failure is kept with the timings, so a fresh process does not build and launch it again.
  configs = [{"block": 128}, {"block": 256}]
  x = rng.standard_normal(5000).astype(np.float32)
  tuned = jmf.autotune(bounded_add_factory, configs=configs, name="test-bounded")
  np.testing.assert_allclose(np.asarray(jax.jit(tuned)(x, x)), 2 * x)
  report = tuned.last_report
  assert report["winner"] == 0 and report["table"][1]["error"].startswith("resources: "), report["table"]
  jmf.clear_kernel_cache()  # memory only: what a new process finds is on disk
  again = jmf.autotune(bounded_add_factory, configs=configs, name="test-bounded")
  np.testing.assert_allclose(np.asarray(jax.jit(again)(x, x)), 2 * x)
  assert again.last_report["source"] == "disk" and again.last_report["timed"] == [], again.last_report
  assert again.last_report["table"][1]["error"] == report["table"][1]["error"]
