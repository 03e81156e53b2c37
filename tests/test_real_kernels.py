"""Real-world kernels as users bring them: the kernel corpus's CUDA C++ files (benchmarks/kernels/corpus/*.cu,
with their cases in benchmarks/kernels/cuda_corpus.py), compiled unchanged and run under jax.jit.

On the CPU every case is compiled for sm_90 and its recipe lowered for CUDA,
which checks the recipe against the kernel's signature; on a GPU each runs
twice with fresh random inputs (outputs are poisoned, see conftest.py).
"""

from __future__ import annotations

import concurrent.futures
import os
import subprocess

import jax
import numpy as np
import pytest

import jax_mosaic_ffi as jmf

import benchmarks_package
from conftest import NO_NVCC, NVCC

corpus = benchmarks_package.kernels("cuda_corpus")
CASES, CORPUS, Case, compile_case, f64, source_of, spec = (corpus.CASES, corpus.CORPUS, corpus.Case,
                                                           corpus.compile_case, corpus.f64, corpus.source_of,
                                                           corpus.spec)


# --- the tests ------------------------------------------------------------------

def params(cases):
  return [pytest.param(c, id=c.id) for c in cases]


@pytest.fixture(scope="module")
def sm90_kernels(tmp_path_factory):
  """Each case compiled for sm_90 once for the CPU tests of this module, with
  a disk cache of its own (NVRTC takes seconds for the CUB ones)."""
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv("JAX_MOSAIC_FFI_CACHE_DIR", str(tmp_path_factory.mktemp("kernel-cache")))
    jmf.clear_kernel_cache()
    yield lambda case: compile_case(case, targets="sm_90")  # the memory cache does the rest
  jmf.clear_kernel_cache()


@pytest.mark.parametrize("case", params(CASES))
def test_compiles_unchanged(case, sm90_kernels):
  kernel = sm90_kernels(case)
  assert kernel.param_sizes, "a kernel from source has PTX to read its signature from"


@pytest.mark.parametrize("case", params(CASES))
def test_launch_recipe_lowers_for_cuda(case, sm90_kernels):
  # Tracing checks the recipe against the kernel's signature (parameter
  # count and sizes from the PTX), so a wrong param_order or scalar dtype
  # shows here, without a GPU.
  kernel = sm90_kernels(case)
  avals = [spec(x.shape, x.dtype) for x in case.inputs(np.random.default_rng(0))]
  lowered = jax.jit(case.call(kernel)).trace(*avals).lower(lowering_platforms=("cuda",))
  assert "jax_mosaic_ffi_launch" in lowered.as_text()


def test_the_corpus_benchmark_builds_each_case_at_its_own_size(sm90_kernels):
  """benchmarks/corpus.py times these very cases at larger sizes: each builds there, against XLA's side of the same
  shapes (build checks that), and the size the benchmark sets is the one the recipe and inputs take."""
  import benchmarks.corpus as bench  # the package is loaded: benchmarks_package.kernels above
  for b in bench.BENCHES:
    case = getattr(corpus, b.case)
    sm90_kernels(case)  # compiled once, for the other tests too
    small = case.inputs(np.random.default_rng(0))
    ours, xla, inputs = bench.build(corpus, b, np.random.default_rng(0), targets="sm_90")
    assert sum(x.size for x in inputs) > sum(x.size for x in small), b.case
    assert set(xla) == {key for key, _, _ in b.xla}
    jax.jit(ours).trace(*[spec(x.shape, x.dtype) for x in inputs]).lower(lowering_platforms=("cuda",))


def assert_matches_reference(case: Case, inputs, outs, what: str = "") -> None:
  expected = case.reference(*inputs)
  assert len(outs) == len(expected) == len(case.tolerance)
  for index, (got, want, tolerance) in enumerate(zip(outs, expected, case.tolerance)):
    where = f"{case.id} output {index}{what}"
    assert got.shape == np.shape(want), where
    if tolerance is None:
      np.testing.assert_array_equal(got, want, err_msg=where)
    elif tolerance != "by check":  # else case.check compares it
      rtol, atol = tolerance
      np.testing.assert_allclose(f64(got), f64(want), rtol=rtol, atol=atol, err_msg=where)
  if case.check is not None:
    case.check(inputs, outs)


@pytest.mark.gpu
@pytest.mark.parametrize("case", params(CASES))
def test_runs_under_jit_and_matches_the_reference(case, rng, isolated_disk_cache):
  run = jax.jit(case.call(compile_case(case)))
  for attempt in range(2):  # new inputs the second time: a stale or partial result cannot pass
    inputs = case.inputs(rng)
    outs = run(*inputs)
    outs = tuple(np.asarray(o) for o in (outs if isinstance(outs, tuple) else (outs,)))
    assert_matches_reference(case, inputs, outs, f", run {attempt}")


# --- the corpus itself --------------------------------------------------------------

def test_every_corpus_file_is_run_and_says_what_it_mirrors():
  files = sorted(p.name for p in CORPUS.glob("*.cu"))
  assert len(files) >= 10
  assert sorted({c.file for c in CASES}) == files
  for name in files:
    lines = (CORPUS / name).read_text().splitlines()
    header = "\n".join(line for line in lines[:next(i for i, text in enumerate(lines) if not text.startswith("//"))])
    assert "Mirrors:" in header and "Our own code" in header and "Apache-2.0" in header, name


def test_the_corpus_covers_the_idioms_that_broke():
  text = {c.file: source_of(c) for c in CASES}
  everything = "\n".join(text.values())
  for idiom in ["assert(", "INFINITY", "uint ", "cub::BlockReduce", "__launch_bounds__", "__restrict__", "__ldg(",
                "cg::reduce", "template <", "__nv_bfloat162", "__half2", "<mma.h>", "wmma::mma_sync",
                "extern __shared__", "__shfl_xor_sync", "std::numeric_limits", "M_PI"]:
    assert idiom in everything, idiom
  assert corpus.SG_SMEM > 48 * 1024
  assert any(c.in_place for c in CASES)
  assert any(c.name == "kernels::scale<float, 4>" for c in CASES)




@pytest.mark.skipif(NVCC is None, reason=NO_NVCC)
def test_nvcc_accepts_the_same_files(tmp_path):
  # The premise: these are sources nvcc compiles as they are (with the
  # --expt-relaxed-constexpr real builds pass, for std::max in device code).
  # Taking each kernel's address instantiates the templates, as a launch would.
  def nvcc(file):
    names = [c.name for c in CASES if c.file == file]
    source = tmp_path / file
    source.write_text((CORPUS / file).read_text() + "".join(
        f"\n[[maybe_unused]] static void* const jmf_instantiate{i} = (void*)&{n};" for i, n in enumerate(names)))
    result = subprocess.run([NVCC, "-std=c++17", "-arch=sm_90", "--expt-relaxed-constexpr", "-cubin",
                             "-o", str(source.with_suffix(".cubin")), str(source)], capture_output=True, text=True)
    return file, result

  files = sorted({c.file for c in CASES})
  with concurrent.futures.ThreadPoolExecutor(os.cpu_count()) as pool:  # nvcc takes seconds a file
    failed = {file: r.stderr for file, r in pool.map(nvcc, files) if r.returncode != 0}
  assert not failed, failed
