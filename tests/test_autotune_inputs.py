"""Autotuning on a call's own timing inputs (``autotune(..., inputs=)``, ``mosaic_kernel(..., autotune_inputs=)``):
what is refused, that the tuner makes its arrays from the call's avals and times the configs on exactly them, how
the timings are keyed; on a GPU, that the timings are those of the given inputs (a kernel whose time follows an
int32 it reads), and that the Pallas ops with lengths and block tables are tuned.

Without a GPU the machinery is checked by timing the configs' fallbacks on the CPU (JAX_MOSAIC_FFI_AUTOTUNE_ON_CPU).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mosaic_ffi as jmf
from jax_mosaic_ffi.base import gpu_info
from jax_mosaic_ffi.transforms import autotune as autotuning

no_gpu = pytest.mark.skipif(gpu_info.has_gpu(), reason="checks the machinery on the CPU, timing fallbacks")

HEAD = r'''
extern "C" __global__ void head(const float* x, const int* lengths, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] + lengths[0];
}'''
CONFIGS = [{"block": 128}, {"block": 256}]
X = jax.ShapeDtypeStruct((1000,), jnp.float32)
LENGTHS = jax.ShapeDtypeStruct((2,), jnp.int32)


def head_call(seen=None, **tuning):
  """A tuned call of (x, lengths) whose fallback notes every lengths array it runs on."""
  def fallback(x, lengths):
    if seen is not None:
      jax.debug.callback(lambda v: seen.append(np.asarray(v).tolist()), lengths)
    return x + lengths[0].astype(x.dtype)
  return jmf.mosaic_kernel(jmf.cuda_kernel(HEAD, "head"), lambda x, lengths: x,
                           block=lambda meta, x, lengths: meta["block"],
                           grid=lambda meta, x, lengths: jmf.cdiv(x.size, meta["block"]),
                           scalars=lambda meta, x, lengths: (np.int32(x.size),), fallback=fallback, configs=CONFIGS,
                           **tuning)


def full_lengths(rng, x, lengths):
  """Timing inputs: lengths no random small int could be."""
  return [rng.standard_normal(x.shape).astype(x.dtype), np.full(lengths.shape, 1000 + x.shape[0], np.int32)]


def test_what_is_refused():
  with pytest.raises(TypeError, match="autotune inputs must be a function inputs"):
    jmf.autotune(lambda meta: None, configs=CONFIGS, inputs=[1, 2])
  with pytest.raises(TypeError, match="autotune_inputs= makes the arrays configs= are timed on; without configs="):
    jmf.mosaic_kernel(jmf.cuda_kernel(HEAD, "head"), lambda x, lengths: x, grid=1, block=128,
                      autotune_inputs=full_lengths)


@no_gpu
@pytest.mark.parametrize("made, error, message", [
    (lambda rng, x, lengths: np.zeros(3), TypeError, "it returned a ndarray"),
    (lambda rng, x, lengths: [np.zeros(1000, np.float32)], ValueError, "it returned 1 arrays"),
    (lambda rng, x, lengths: [np.zeros(1000, np.float32), np.zeros(2, np.int64)], ValueError,
     r"input 1 is int64\[2\]"),
    (lambda rng, x, lengths: [np.zeros(999, np.float32), np.zeros(2, np.int32)], ValueError,
     r"input 0 is float32\[999\]"),
    (lambda rng, x, lengths: [np.zeros(1000, np.float32), 3], TypeError, "input 1 is a int, not an array")])
def test_inputs_that_are_not_the_calls_are_refused_naming_the_call(made, error, message, monkeypatch,
                                                                   isolated_disk_cache):
  monkeypatch.setenv(autotuning.CPU_ENV, "1")
  call = head_call(autotune_inputs=made)
  with pytest.raises(error, match=r"inputs\(rng, \*avals\) must return one array per input of autotune "
                     r"'mosaic_kernel head', of its shape and dtype: \(float32\[1000\], int32\[2\]\); " + message):
    jax.jit(call).trace(X, LENGTHS)


@no_gpu
def test_the_tuner_times_the_configs_on_the_calls_own_inputs(monkeypatch, isolated_disk_cache):
  monkeypatch.setenv(autotuning.CPU_ENV, "1")
  calls, seen = [], []

  def inputs(rng, *avals):
    calls.append((type(rng), [(a.shape, a.dtype) for a in avals]))
    return full_lengths(rng, *avals)

  call = head_call(seen, autotune_inputs=inputs)
  x, lengths = np.ones(1000, np.float32), np.array([5, 7], np.int32)
  np.testing.assert_array_equal(np.asarray(jax.jit(call)(x, lengths)), x + 5)
  # Called once for the decision, with a numpy Generator and the call's avals.
  assert calls == [(np.random.Generator, [((1000,), jnp.float32), ((2,), jnp.int32)])]
  timed, ran = [v for v in seen if v != [5, 7]], [v for v in seen if v == [5, 7]]
  assert timed and all(v == [2000, 2000] for v in timed), seen  # every timed run on the given lengths
  assert ran  # the program itself, on the caller's
  assert call.last_report["source"] == "tuned" and all(row["us"] > 0 for row in call.last_report["table"])
  # Under vmap the tuner decides on one element's avals: the inputs function gets those.
  calls.clear()
  call = head_call(autotune_inputs=inputs)
  jax.jit(jax.vmap(call)).trace(jax.ShapeDtypeStruct((3, 500), jnp.float32),
                                jax.ShapeDtypeStruct((3, 2), jnp.int32))
  assert calls == [(np.random.Generator, [((500,), jnp.float32), ((2,), jnp.int32)])]


def _random_full_lengths(seed):
  def full_lengths(rng, x, lengths):  # one qualified name, values that differ from one seed to the next
    del rng
    return [np.random.default_rng(seed).standard_normal(x.shape).astype(x.dtype),
            np.full(lengths.shape, 1000 + seed, np.int32)]
  return full_lengths


@no_gpu
def test_timings_are_keyed_by_the_inputs_function_not_by_its_values(monkeypatch, isolated_disk_cache):
  monkeypatch.setenv(autotuning.CPU_ENV, "1")
  jax.jit(head_call()).trace(X, LENGTHS)  # timed on random inputs: kept under the call's usual key
  given = head_call(autotune_inputs=_random_full_lengths(1))
  jax.jit(given).trace(X, LENGTHS)
  assert given.last_report["source"] == "tuned"  # not the random inputs' timings
  # Another process (memory cleared): the same function makes other values, and the timings on disk serve.
  autotuning.clear_memory_cache()
  again = head_call(autotune_inputs=_random_full_lengths(2))
  jax.jit(again).trace(X, LENGTHS)
  assert again.last_report["source"] == "disk" and again.last_report["timed"] == []
  # Without inputs, the call's key is the one it always had: its timings from the first trace.
  autotuning.clear_memory_cache()
  plain = head_call()
  jax.jit(plain).trace(X, LENGTHS)
  assert plain.last_report["source"] == "disk"


@no_gpu
def test_the_ops_with_lengths_and_block_tables_are_tuned_on_full_valid_inputs(monkeypatch, isolated_disk_cache):
  pytest.importorskip("triton", reason="the Pallas ops build their calls with Triton")
  from jax_mosaic_ffi.ops.gpu import decode_attention, paged_attention, decode_calls  # noqa: PLC0415
  monkeypatch.setenv(autotuning.CPU_ENV, "1")
  rng = np.random.default_rng(0)
  q = jnp.asarray(rng.standard_normal((2, 16, 64)), jnp.float16)
  k_pages = jnp.asarray(rng.integers(-127, 128, (2, 40, 16, 64)), jnp.int8)
  scales = jnp.full((2, 40, 16), 0.01, jnp.float32)
  tables = jnp.asarray(rng.permutation(40)[:26].reshape(2, 13), jnp.int32)
  lengths = jnp.array([200, 17], jnp.int32)
  paged_attention.paged_attention(q, k_pages, k_pages, tables, lengths, scales, scales, k_splits=4)
  report = [r for r in jmf.autotune_report() if "paged_split" in r["name"]][-1]  # the combine is untuned
  assert "paged_split" in report["name"] and report["source"] == "tuned" and len(report["table"]) > 3, report
  # What its configs were timed on: distinct pages in range, every sequence full, int8 pages as int8 data.
  avals = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (q, k_pages, k_pages, scales, scales, tables, lengths)]
  made = paged_attention.paged_timing_inputs(np.random.default_rng(0), *avals)
  assert [(m.shape, m.dtype) for m in made] == [(a.shape, a.dtype) for a in avals]
  assert len(set(made[5].ravel().tolist())) == 26 and made[5].min() >= 0 and made[5].max() < 40
  assert made[6].tolist() == [13 * 16] * 2 and np.abs(made[1]).max() > 4
  kv = jnp.asarray(rng.standard_normal((2, 300, 2, 64)), jnp.bfloat16)
  decode_attention.gqa(q.astype(jnp.bfloat16), kv, kv, kv_seq_len=jnp.array([10, 300], jnp.int32), k_splits=2)
  report = [r for r in jmf.autotune_report() if "decode_split" in r["name"]][-1]
  assert report["source"] == "tuned" and len(report["table"]) > 3, report
  avals = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (q, kv, kv, lengths, lengths)]
  made = decode_calls.decode_timing_inputs(np.random.default_rng(0), *avals)
  assert made[3].tolist() == [0, 0] and made[4].tolist() == [300, 300]


def _steps_call(**tuning):
  import triton_required  # noqa: PLC0415
  triton_required.import_triton()
  import triton_sources as ts  # noqa: PLC0415
  return jmf.mosaic_kernel(jmf.triton_kernel(ts.steps_from_memory), lambda x, steps: x,
                           grid=lambda meta, x, steps: jmf.cdiv(x.size, meta["BLOCK"]),
                           scalars=lambda meta, x, steps: (np.int32(x.size),),
                           configs=[dict(BLOCK=128, num_warps=4), dict(BLOCK=256, num_warps=4),
                                    dict(BLOCK=512, num_warps=8)], **tuning)


@pytest.mark.gpu
def test_on_the_gpu_the_timings_are_the_given_inputs(isolated_disk_cache, rng):
  many = 1 << 16
  given = _steps_call(autotune_inputs=lambda rng, x, steps: [rng.standard_normal(x.shape).astype(x.dtype),
                                                               np.array([many], np.int32)])
  plain = _steps_call()  # random ints in [0, 4): at most 3 steps
  x = rng.standard_normal(4096).astype(np.float32)
  for call in (given, plain):
    got = np.asarray(jax.jit(call)(x, np.array([40], np.int32)))
    np.testing.assert_allclose(got, 2 * x * (1 - 0.5 ** 40), rtol=1e-5, atol=1e-6)
    assert call.last_report["source"] == "tuned", call.last_report
  slowest_plain = max(row["us"] for row in plain.last_report["table"])
  fastest_given = min(row["us"] for row in given.last_report["table"])
  # 65536 dependent steps against at most 3: the given inputs' timings are of another order.
  assert fastest_given > 20 * slowest_plain, (given.last_report["table"], plain.last_report["table"])


@pytest.mark.gpu
def test_on_the_gpu_the_ops_with_lengths_and_pages_are_tuned_and_right(isolated_disk_cache, rng):
  import pallas_ops_cases as cases  # noqa: PLC0415
  from jax_mosaic_ffi.ops.gpu import decode_attention, paged_attention  # noqa: PLC0415
  q, k_pages, v_pages, tables, lengths = cases._paged_inputs(rng, jnp.bfloat16)
  got = paged_attention.paged_attention(q, k_pages, v_pages, tables, lengths, k_splits=4)
  report = [r for r in jmf.autotune_report() if "paged_split" in r["name"]][-1]
  assert report["source"] == "tuned" and sum(row["us"] is not None for row in report["table"]) > 3, report
  cases.assert_close(got, cases._paged_reference(q, k_pages, v_pages, tables, lengths), jnp.bfloat16, "paged")
  q, k, v, start, length = cases._decode_inputs(rng, jnp.float16, mqa=False, lengths=True)
  got = decode_attention.gqa(q, k, v, start, length)
  report = [r for r in jmf.autotune_report() if "decode_split" in r["name"]][-1]
  assert report["source"] == "tuned" and sum(row["us"] is not None for row in report["table"]) > 3, report
  cases.assert_close(got, decode_attention.gqa_reference(q, k, v, start, length), jnp.float16, "gqa")
