"""The store (jax_mosaic_ffi/store/): one tier stack for every kind of entry, where every entry says where it came
from; family targets by default; the module a call lowers with must define the kernel it names; cold starts on the
``jax_mosaic_ffi`` logger. The job's peers are tests/test_job_share.py's (processes under jax.distributed)."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mosaic_ffi as jmf
from jax_mosaic_ffi.base import gpu_info
from jax_mosaic_ffi.base import pack_file
from jax_mosaic_ffi.base.errors import LaunchError
from jax_mosaic_ffi.pack import build as pack_build
from jax_mosaic_ffi.pack import recordings
from jax_mosaic_ffi.store import pack_record
from jax_mosaic_ffi.store import packs
from jax_mosaic_ffi.store import stack
from jax_mosaic_ffi.store import stats
from jax_mosaic_ffi.store import targets
from jax_mosaic_ffi.store.entries import Codec, Key, Unkept
from jax_mosaic_ffi.toolchain import kernel as kernel_lib

import kernel_sources

X = jax.ShapeDtypeStruct((1000,), jnp.float32)
SCALED = 'extern "C" __global__ void scaled_%d(const float* x, float* y, int n) { y[0] = %d.0f * x[0]; }'


@pytest.fixture
def clean_packs(isolated_disk_cache, monkeypatch, tmp_path):
  for name in (packs.PACKS_ENV, packs.STRICT_ENV, pack_record.ENV, kernel_lib.TARGETS_ENV):
    monkeypatch.delenv(name, raising=False)
  packs.forget()
  yield tmp_path
  packs.forget()


def _codec(**changes) -> Codec:
  return Codec("test-entry", encode=lambda value: value.encode(), decode=lambda data: data.decode(),
               shared=False, **changes)


def test_get_or_make_serves_from_memory_then_disk_then_makes_and_says_where_each_came_from(isolated_disk_cache):
  key = "5e" * 32
  made = []

  def make():
    made.append(1)
    return "the entry"
  first = stack.get_or_make(key, _codec(), make)
  assert (first.value, first.source, first.origin, first.own) == ("the entry", "made", "made", True)
  again = stack.get_or_make(key, _codec(), make)
  assert (again.source, again.origin) == ("memory", "made") and len(made) == 1
  stack.clear_memory()
  from_disk = stack.get_or_make(key, _codec(), make)
  assert (from_disk.value, from_disk.source) == ("the entry", "disk") and len(made) == 1
  assert stats.counts()["test-entry"]["disk"] >= 1


def test_an_entry_that_is_not_this_processes_own_never_reaches_the_disk_cache(isolated_disk_cache):
  """A peer's (or a tuning file's) entry kept by this process stays in memory: a later process would take a disk
  entry as its own."""
  key = Key("7a" * 32, "7a" * 32)
  stack.keep(key, _codec(), "a peer's entry", "peer", own=False)
  assert stack.find(key, _codec()).origin == "peer"
  stack.clear_memory()
  assert stack.find(key, _codec()) is None
  stack.keep(key, _codec(), "measured here", "timed", own=True)
  stack.clear_memory()
  assert stack.find(key, _codec()).value == "measured here"


def test_an_unkept_value_is_kept_nowhere_and_a_failed_make_nowhere_either(isolated_disk_cache):
  key = "3c" * 32
  assert stack.get_or_make(key, _codec(), lambda: Unkept("read files not known")).value == "read files not known"
  assert stack.find(key, _codec()) is None
  with pytest.raises(ZeroDivisionError):
    stack.get_or_make(key, _codec(), lambda: 1 / 0)
  assert stack.find(key, _codec()) is None


def test_a_stale_memory_entry_is_answered_by_the_tiers_below(isolated_disk_cache):
  key, fresh = "9d" * 32, {"now": True}
  codec = _codec(fresh=lambda value: fresh["now"])
  stack.get_or_make(key, codec, lambda: "v1")
  fresh["now"] = False
  assert stack.get_or_make(key, codec, lambda: "v2").source == "disk"


def test_the_module_a_call_lowers_with_must_define_the_kernel_it_names(isolated_disk_cache):
  """Another kernel's entry served under this one's key (a peer's) is refused at lowering, not launched."""
  other = jmf.cuda_kernel(SCALED % (1, 3), "scaled_1", targets=["sm_90"])
  forged = jmf.CudaKernel("scaled_0", other.compiled)
  call = jmf.mosaic_kernel(forged, lambda x: x, grid=1, block=1, scalars=lambda x: (np.int32(x.size),))
  with pytest.raises(LaunchError, match="defines 'scaled_1', not the kernel 'scaled_0' the call names"):
    jax.jit(call).trace(X).lower(lowering_platforms=("cuda",))
  # A C++ name's mangled entry is the kernel it names.
  source = "namespace ns { template <typename T, int N> __global__ void scale(T* y) { y[0] *= N; } }"
  templated = jmf.cuda_kernel(source, "ns::scale<float, 4>", targets=["sm_90"])
  assert templated.symbol.startswith("_Z") and templated.defines_its_name()
  assert not kernel_lib.symbol_names(templated.symbol, "ns::scaler<float, 4>")


def test_a_family_member_is_served_by_its_familys_entry_with_no_setting(clean_packs, monkeypatch):
  """A pack recorded for sm_100f serves a B300 (sm_103) node that sets nothing, in the strict mode: compiling
  nothing. The node is told its GPU by replacing this package's driver query, gpu_info.visible_gpus (as the
  recording stands a GPU in with JAX_MOSAIC_FFI_TARGETS); the pack's images are checked by the runtime's rule."""
  monkeypatch.setenv(kernel_lib.TARGETS_ENV, "sm_100f")
  monkeypatch.setenv(pack_record.ENV, str(clean_packs / "recording"))
  jmf.cuda_kernel(kernel_sources.ADD, "add")
  monkeypatch.delenv(pack_record.ENV)
  monkeypatch.delenv(kernel_lib.TARGETS_ENV)
  built = pack_build.build(recordings.read(str(clean_packs / "recording")))
  path = str(clean_packs / "family.jmfpack")
  pack_file.write(path, built.entries, built.created, built.notes)
  jmf.clear_kernel_cache(disk=True)
  b300 = gpu_info.GpuInfo(0, "NVIDIA B300", 103, 232448, 1024, (2**31 - 1, 65535, 65535), (1024, 1024, 64))
  monkeypatch.setattr(gpu_info, "visible_gpus", lambda: (b300,))
  monkeypatch.setenv(packs.PACKS_ENV, path)
  monkeypatch.setenv(packs.STRICT_ENV, "1")
  assert kernel_lib.default_targets() == (kernel_lib.Arch(103),)
  before = jmf.kernel_cache_stats()
  kernel = jmf.cuda_kernel(kernel_sources.ADD, "add")
  after = jmf.kernel_cache_stats()
  assert after.pack_hits == before.pack_hits + 1 and after.compiles["nvrtc"] == before.compiles["nvrtc"]
  assert [f"{i.kind.name.lower()} {i.arch.sm}" for i in kernel.images] == ["cubin sm_100f", "ptx sm_100f"]
  # A kernel the pack lacks: NotInPacks names the family entry, and the fix records the family target.
  with pytest.raises(jmf.NotInPacks) as missing:
    jmf.cuda_kernel(kernel_sources.ADD, "add", options=["-DVARIANT=2"])
  text = str(missing.value)
  assert "(recorded for sm_100f, a target that serves this GPU without a setting)" in text, text
  assert "pack record new.jmfpack --arch sm_100f -- " in text


def test_the_targets_that_serve_a_gpu_are_its_own_then_its_familys_then_older_ptx():
  recorded = {"sm_90", "sm_100f", "sm_100", "sm_120f", "sm_80", "sm_103f"}
  assert targets.reaching(103, recorded) == ["sm_103f", "sm_100f", "sm_100", "sm_90", "sm_80"]
  assert targets.reaching(100, recorded) == ["sm_100f", "sm_90", "sm_80"]
  assert targets.reaching(90, recorded) == ["sm_80"]
  assert targets.reaching(121, recorded) == ["sm_120f", "sm_100", "sm_90", "sm_80"]
  assert targets.reaching(75, recorded) == []
  # Not on a machine without a GPU of that arch, nor for several targets, nor under the targets setting.
  assert targets.serving((kernel_lib.Arch(103),)) == []
  assert targets.serving((kernel_lib.Arch(90), kernel_lib.Arch(100))) == []


def test_cold_starts_are_told_on_the_logger(isolated_disk_cache, caplog):
  """One record per compile or cache answer: compiled and from disk at INFO, a memory hit at DEBUG."""
  source = SCALED % (7, 7) + f"// {np.random.default_rng().integers(1 << 62)}"
  with caplog.at_level(logging.DEBUG, logger="jax_mosaic_ffi"):
    jmf.cuda_kernel(source, "scaled_7", targets=["sm_90"])
    jmf.cuda_kernel(source, "scaled_7", targets=["sm_90"])
    jmf.clear_kernel_cache()
    jmf.cuda_kernel(source, "scaled_7", targets=["sm_90"])
  records = [r for r in caplog.records if getattr(r, "jmf_kernel", None) == "scaled_7"]
  assert [(r.levelno, r.jmf_source) for r in records] == [(logging.INFO, "made"), (logging.DEBUG, "memory"),
                                                          (logging.INFO, "disk")]
  assert all(r.jmf_front_end == "CUDA C++ (NVRTC)" and r.jmf_seconds >= 0 for r in records)
  assert "CUDA C++ (NVRTC) 'scaled_7' for sm_90: compiled in " in records[0].getMessage()
  assert "from the disk cache in " in records[2].getMessage()


def test_an_autotuning_decision_is_told_on_the_logger(isolated_disk_cache, caplog):
  def factory(meta):
    kernel = jmf.cuda_kernel(SCALED % (meta["k"], 2), f"scaled_{meta['k']}", targets=["sm_90"])
    return jmf.mosaic_kernel(kernel, lambda x: x, grid=1, block=1, scalars=lambda x: (np.int32(x.size),),
                             fallback=lambda x: 2 * x)
  tuned = jmf.autotune(factory, configs=[{"k": 8}, {"k": 9}], name="test-store-logged")
  with caplog.at_level(logging.INFO, logger="jax_mosaic_ffi"), pytest.warns(UserWarning):
    tuned.best_config(X)
  (record,) = [r for r in caplog.records if getattr(r, "jmf_kernel", None) == "test-store-logged"]
  assert record.jmf_front_end == "autotune" and "autotune 'test-store-logged'" in record.getMessage()


@pytest.mark.gpu
def test_on_a_gpu_a_pack_of_an_older_arch_serves_it_by_its_ptx_with_no_setting(clean_packs, monkeypatch):
  """On the H200 (sm_90): a pack recorded for sm_80 only serves the node with no setting by the PTX the driver
  JITs there (the step after its own arch and its family's; not in the strict mode, which forbids JIT-compiling):
  NVRTC compiles nothing; the kernel runs and matches numpy on fresh random inputs (outputs poisoned first:
  conftest). In the strict mode the same kernel is NotInPacks."""
  arch = gpu_info.visible_gpus()[0].arch
  if arch < 90:
    pytest.skip(f"needs a GPU newer than sm_80's major version, this one is sm_{arch}")
  monkeypatch.setenv(kernel_lib.TARGETS_ENV, "sm_80")
  monkeypatch.setenv(pack_record.ENV, str(clean_packs / "recording"))
  jmf.cuda_kernel(kernel_sources.ADD, "add")
  monkeypatch.delenv(pack_record.ENV)
  monkeypatch.delenv(kernel_lib.TARGETS_ENV)
  built = pack_build.build(recordings.read(str(clean_packs / "recording")))
  path = str(clean_packs / "older.jmfpack")
  pack_file.write(path, built.entries, built.created, built.notes)
  jmf.clear_kernel_cache(disk=True)
  packs.forget()
  monkeypatch.setenv(packs.PACKS_ENV, path)
  monkeypatch.setenv(packs.STRICT_ENV, "1")
  with pytest.raises(jmf.NotInPacks):
    jmf.cuda_kernel(kernel_sources.ADD, "add")
  monkeypatch.setenv(packs.STRICT_ENV, "0")
  before = jmf.kernel_cache_stats()
  kernel = jmf.cuda_kernel(kernel_sources.ADD, "add")
  after = jmf.kernel_cache_stats()
  assert after.pack_hits == before.pack_hits + 1 and after.compiles["nvrtc"] == before.compiles["nvrtc"]
  assert [f"{i.kind.name.lower()} {i.arch.sm}" for i in kernel.images] == ["cubin sm_80", "ptx sm_80"]
  n = 4099
  call = jmf.mosaic_kernel(kernel, lambda a, b: a, grid=lambda a, b: jmf.cdiv(a.size, 256), block=256,
                           scalars=lambda a, b: (np.int32(a.size),))
  rng = np.random.default_rng()
  a, b = (rng.standard_normal(n, dtype=np.float32) for _ in range(2))
  np.testing.assert_array_equal(np.asarray(jax.jit(call)(a, b)), a + b)
