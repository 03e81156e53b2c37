"""Bounded Triton and Gluon compiles, with real Triton and ptxas on the CPU: a tensor larger than a CTA can hold is
refused before Triton's stages run (triton/compiler/bounds.py), and a compile past JAX_MOSAIC_FFI_COMPILE_TIMEOUT_S is
stopped in whatever stage it is, its process killed with its ptxas (toolchain/forked_compile.py)."""

import os
import re
import tempfile
import time

import pytest

import fresh_process
from triton_required import import_triton

import_triton()

import gluon_sources as gs  # noqa: E402  (after the guard: they import triton)
import triton_sources as ts  # noqa: E402
from triton import knobs  # noqa: E402

import jax_mosaic_ffi as jmf  # noqa: E402
from jax_mosaic_ffi.triton.compiler import bounds as triton_bounds  # noqa: E402

ADD = ["*fp32", "*fp32", "*fp32", "i32"]
TIMEOUT = "JAX_MOSAIC_FFI_COMPILE_TIMEOUT_S"


@pytest.fixture
def triton_cache(tmp_path, monkeypatch):
  """Triton's own cache, empty: a kernel an earlier run compiled would not run ptxas again."""
  monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-cache"))
  return tmp_path / "triton-cache"


def add(block: int, **options):
  """The kernel compiled now for sm_90 (the messages name the target; a GPU machine's default may be another)."""
  return jmf.triton_kernel(ts.add, constexprs={"BLOCK": block}, signature=ADD, targets=["sm_90"], **options)


def recording_ptxas(tmp_path, monkeypatch):
  """Triton's ptxas binaries behind scripts that log each call's arguments, then run them: the log of every ptxas
  Triton starts. Returns the log's path."""
  log = tmp_path / "ptxas.log"
  log.touch()
  for name in ("ptxas", "ptxas_blackwell"):  # Triton's knobs for its ptxas binaries
    real = getattr(knobs.nvidia, name).path
    script = tmp_path / f"recorded-{name}"
    script.write_text(f'#!/bin/sh\necho "$*" >> {log}\nexec {real} "$@"\n')
    script.chmod(0o700)
    monkeypatch.setenv(knobs.nvidia.knob_descriptors[name].key, str(script))
  return log


def compiles_logged(log) -> list[str]:
  return [line for line in log.read_text().splitlines() if line.strip() != "--version"]


# ---------------------------------------------------------------- the tensors a CTA can hold

def test_a_block_larger_than_a_cta_holds_is_refused_before_ptxas_starts(isolated_disk_cache, triton_cache, tmp_path,
                                                                        monkeypatch):
  log = recording_ptxas(tmp_path, monkeypatch)
  add(1024)
  assert len(compiles_logged(log)) == 1  # the log sees the ptxas Triton runs
  with pytest.raises(jmf.TensorTooLarge) as caught:
    add(2**20)  # ptxas would run for many minutes and gigabytes
  assert len(compiles_logged(log)) == 1  # no ptxas started: refused before it, whatever the machine's speed
  message = str(caught.value)
  assert message.startswith("triton_kernel 'add' for sm_90 with num_warps=4, num_stages=3, num_ctas=1, BLOCK=1048576; "
                            "signature (*fp32, *fp32, *fp32, i32) (called at test_triton_bounds.py:"), message
  assert re.search(r"\(called at test_triton_bounds\.py:\d+ \(add\)\): its tensor tensor<1048576x", message), message
  assert ("is more than a CTA can hold on sm_90, at most 968 KiB a tensor (twice an SM's 256 KiB of registers and "
          "228 KiB of shared memory)") in message
  assert "use smaller blocks (the constexprs that size this tensor)" in message
  error = caught.value
  assert isinstance(error, jmf.CompileError) and error.kernel == "add" and error.compiler == "Triton"
  assert error.shape == (1048576,) and error.bound == 968 * 1024


def test_a_gluon_block_larger_than_a_cta_holds_is_refused(isolated_disk_cache, triton_cache):
  with pytest.raises(jmf.TensorTooLarge, match=r"^gluon_kernel 'axpy' for sm_80 with .*XBLOCK=1048576.*its tensor "
                                               r"tensor<1048576x.* at most 840 KiB a tensor"):
    jmf.gluon_kernel(gs.axpy, constexprs={"XBLOCK": 2**20}, signature=ADD + ["fp32"], targets=["sm_80"])


def test_real_kernels_fit_the_bound(isolated_disk_cache, triton_cache):
  # A 128x256 fp32 accumulator (128 KiB; its output pointers 256 KiB), and a 64K-element fp32 row reduction (its
  # pointers 512 KiB) compile for every target, sm_75 (640 KiB) to sm_120.
  matmul = jmf.triton_kernel(ts.matmul, constexprs={"BM": 128, "BN": 256, "BK": 32}, num_warps=8,
                             signature=["*fp16", "*fp16", "*fp32", "i32", "i32", "i32"], targets=["sm_90", "sm_80"])
  assert matmul.info.shared > 0
  row = jmf.triton_kernel(ts.row_sums_atomic, constexprs={"BLOCK": 65536}, signature=["*fp32", "*fp32", "i32", "i32"],
                          targets=["sm_75"])  # the smallest bound
  assert row.info.num_warps == 4
  assert min(triton_bounds.bound_bytes(a) for a in (75, 80, 86, 89, 90, 100, 103, 120, 121)) == 640 * 1024
  assert [triton_bounds.bound_bytes(a) // 1024 for a in (75, 80, 86, 90, 100, 120)] == [640, 840, 712, 968, 968, 712]


@pytest.mark.parametrize("text, shape, element, size", [
    ("tensor<1048576xf32>", (1048576,), "f32", 4 << 20),
    ("tensor<65536x!tt.ptr<f32>>", (65536,), "!tt.ptr<f32>", 512 << 10),
    ("tensor<128x256xf32, #ttg.blocked<{sizePerThread = [1, 4], order = [1, 0]}>>", (128, 256), "f32", 128 << 10),
    ("tensor<128x64x!tt.ptr<f16>, #blocked>", (128, 64), "!tt.ptr<f16>", 64 << 10),
    ("tensor<1024xi1>", (1024,), "i1", 1024),
    ("tensor<64x64xbf16>", (64, 64), "bf16", 8192),
    ("tensor<256xf8E4M3FN>", (256,), "f8E4M3FN", 256),
])
def test_tensor_types_read_from_tritons_ir(text, shape, element, size):
  tensor = triton_bounds.parse(text)
  assert (tensor.shape, tensor.element, tensor.bytes) == (shape, element, size)


@pytest.mark.parametrize("text", ["f32", "!tt.ptr<f32>", "!tt.tensordesc<tensor<64x64xf16>>",
                                  "!ttg.memdesc<128x64xf16, #shared, #smem, mutable>"])
def test_what_is_no_tensor_is_not_counted(text):
  assert triton_bounds.parse(text) is None


# ---------------------------------------------------------------- the compile's deadline

def test_a_compile_past_the_bound_is_stopped_naming_the_kernel_and_its_stage(isolated_disk_cache, triton_cache,
                                                                              monkeypatch):
  # 1 ms: a compile's process takes longer to start, on any machine, so the bound ends it in its first stage.
  monkeypatch.setenv(TIMEOUT, "0.001")
  with pytest.raises(jmf.CompileTimeout) as caught:
    add(1024)
  assert re.sub(r" \(called at test_triton_bounds\.py:\d+ \(add\)\):\n", ":\n", str(caught.value), count=1) == (
      "Triton could not compile kernel 'add' for sm_90 with num_warps=4, num_stages=3, num_ctas=1, BLOCK=1024; "
      "signature (*fp32, *fp32, *fp32, i32):\n"
      "the compile ran past JAX_MOSAIC_FFI_COMPILE_TIMEOUT_S=0.001 seconds in Triton's frontend (the kernel's Python "
      "traced to TTIR) for sm_90, and its process was killed\n\n"
      "advice: a compile's time grows with the elements each thread holds and with the code unrolled "
      "(tl.static_range): use smaller blocks (the constexprs that size them), more num_warps or a loop that is not "
      "unrolled; or raise JAX_MOSAIC_FFI_COMPILE_TIMEOUT_S (0: no bound)")
  assert isinstance(caught.value, jmf.CompileError) and caught.value.kernel == "add"
  before = jmf.kernel_cache_stats().compiles.get("triton", 0)
  monkeypatch.setenv(TIMEOUT, "0")  # no bound: compiled in this process
  assert add(1024).name == "add"  # nothing kept of the stopped compile
  assert jmf.kernel_cache_stats().compiles["triton"] == before + 1


def test_a_gluon_compile_past_the_bound_is_stopped(isolated_disk_cache, triton_cache, monkeypatch):
  monkeypatch.setenv(TIMEOUT, "0.001")
  with pytest.raises(jmf.CompileTimeout, match=r"kernel 'axpy' for sm_90 with .*XBLOCK=1024.*\n.*"
                                               r"in Gluon's frontend \(the kernel's Python traced to TTIR\) for "
                                               r"sm_90, and its process was killed"):
    jmf.gluon_kernel(gs.axpy, constexprs={"XBLOCK": 1024}, signature=ADD + ["fp32"], targets=["sm_90"])
  monkeypatch.setenv(TIMEOUT, str(fresh_process.INNER_GUARD_S))  # forked again, under a hang guard
  assert jmf.gluon_kernel(gs.axpy, constexprs={"XBLOCK": 1024}, signature=ADD + ["fp32"], targets=["sm_90"])


STAGES = r"Triton's (frontend|ttir stage|ttgir stage|llir stage|ptx stage|cubin stage \(ptxas\))"


def test_an_unrolled_loop_is_stopped_in_tritons_own_stages(isolated_disk_cache, triton_cache, monkeypatch):
  # The case: a tl.static_range loop ran for 456 s under a 20 s bound, which stopped only ptxas. 2**40
  # unrolled loads cannot be traced on any machine (65536 take Triton's frontend about 100 s on 2 cores), so only
  # the bound stops them.
  monkeypatch.setenv(TIMEOUT, "2")
  with pytest.raises(jmf.CompileTimeout, match=rf"kernel 'unrolled_sum' for sm_90 with .*STEPS={2**40}.*\n"
                                               rf"the compile ran past JAX_MOSAIC_FFI_COMPILE_TIMEOUT_S=2 seconds in "
                                               rf"{STAGES} .*for sm_90, and its process was killed"):
    jmf.triton_kernel(ts.unrolled_sum, constexprs={"STEPS": 2**40}, signature=["*fp32", "*fp32"], targets=["sm_90"])
  # This process is as it was: the same kernel, unrolled less, compiles under a bound that is only a hang guard,
  # and without one.
  monkeypatch.setenv(TIMEOUT, str(fresh_process.INNER_GUARD_S))
  kernel = jmf.triton_kernel(ts.unrolled_sum, constexprs={"STEPS": 8}, signature=["*fp32", "*fp32"],
                             targets=["sm_90"])
  monkeypatch.setenv(TIMEOUT, "0")
  jmf.clear_kernel_cache(disk=True)
  again = jmf.triton_kernel(ts.unrolled_sum, constexprs={"STEPS": 8}, signature=["*fp32", "*fp32"],
                            targets=["sm_90"])
  assert again.compiled.to_bytes() == kernel.compiled.to_bytes()


def test_the_pieces_of_one_compile_share_one_deadline(isolated_disk_cache, triton_cache, monkeypatch):
  # The frontend's TTIR for the key and the compile's frontend each take 0.6 of the bound: one deadline stops the
  # compile, wherever the time went (a fresh bound per piece let it finish, at up to twice the bound).
  monkeypatch.setenv(TIMEOUT, "10")
  monkeypatch.setenv("JMF_TEST_TRACE_SLEEP_S", "6")
  with pytest.raises(jmf.CompileTimeout, match=r"ran past JAX_MOSAIC_FFI_COMPILE_TIMEOUT_S=10 seconds"):
    jmf.triton_kernel(ts.sleeps_in_its_frontend, signature=["*fp32", "*fp32"], targets=["sm_90"])


def test_a_slow_ptxas_is_stopped_and_left_running_nowhere(isolated_disk_cache, triton_cache, tmp_path, monkeypatch):
  # 65536 elements a thread holds in one warp: about 6 s of Triton's stages and 70 s of ptxas on a 2-core machine,
  # many times the 3 s bound on any machine. Which stage the bound ends depends on the machine; the outcome does
  # not: the compile's process is killed, with the ptxas it started, and its files are removed.
  monkeypatch.setenv(TIMEOUT, "3")
  monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # Triton's PTX and cubin files, found by their folder
  with pytest.raises(jmf.CompileTimeout, match=rf"kernel 'add' for sm_90 with num_warps=1, .*BLOCK=65536.*\n"
                                               rf"the compile ran past JAX_MOSAIC_FFI_COMPILE_TIMEOUT_S=3 seconds in "
                                               rf"{STAGES} .*for sm_90, and its process was killed"):
    add(65536, num_warps=1)
  deadline = time.monotonic() + fresh_process.INNER_GUARD_S  # SIGKILL lands at once; the guard is for a hang
  while fresh_process.running(str(tmp_path)) and time.monotonic() < deadline:
    time.sleep(0.01)
  assert not fresh_process.running(str(tmp_path))
  assert not list(tmp_path.glob("jmf-compile-*"))  # the compile's folder, with its PTX and cubin files, removed


def test_reporting_the_stages_leaves_tritons_cache_key_alone(isolated_disk_cache, triton_cache, monkeypatch):
  monkeypatch.setenv(TIMEOUT, "0")  # in this process, no stage reported: Triton keeps the kernel in its cache
  plain = add(512)
  entries = sorted(os.listdir(triton_cache))
  assert entries
  jmf.clear_kernel_cache(disk=True)
  # Forked (under a hang guard), its stages reported: the same key, so Triton's cache hits.
  monkeypatch.setenv(TIMEOUT, str(fresh_process.INNER_GUARD_S))
  bounded = add(512)
  assert sorted(os.listdir(triton_cache)) == entries
  assert bounded.compiled.to_bytes() == plain.compiled.to_bytes()


def test_a_bad_timeout_is_named_before_triton_compiles(isolated_disk_cache, monkeypatch):
  monkeypatch.setenv(TIMEOUT, "soon")
  with pytest.raises(ValueError, match=re.escape("JAX_MOSAIC_FFI_COMPILE_TIMEOUT_S must be a number of seconds")):
    add(256)
