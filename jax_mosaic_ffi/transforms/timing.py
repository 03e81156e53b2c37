"""How the autotuner times its configs (`time_configs`): compiled calls on random inputs of the call's shapes (or
the call's own: timing_inputs.py), in rounds in which the executables take turns, on the GPU's own clock
(`gpu_clock.py`), or the host's where there is no GPU (the machinery's tests, with JAX_MOSAIC_FFI_AUTOTUNE_ON_CPU=1);
and how many calls one timed program makes.
"""

from __future__ import annotations

import concurrent.futures
import os
import statistics
import time
from typing import Callable

import jax
import numpy as np

from jax_mosaic_ffi.call.comparison import shadow
from jax_mosaic_ffi.transforms import gpu_clock
from jax_mosaic_ffi.store import tuning_failures
from jax_mosaic_ffi.store import tuning_records


def random_inputs(avals, device):
  """Arrays of these avals on ``device``, the same in every process (seed 0): normal floats, small ints."""
  rng = np.random.default_rng(0)
  arrays = []
  for aval in avals:
    dtype = np.dtype(aval.dtype)
    if dtype.kind == "f" or dtype.name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
      data = rng.standard_normal(aval.shape, dtype=np.float32).astype(dtype)
    elif dtype.kind in "iu":
      data = rng.integers(0, 4, aval.shape).astype(dtype)
    elif dtype.kind == "b":
      data = rng.integers(0, 2, aval.shape).astype(bool)
    else:
      data = np.zeros(aval.shape, dtype)
    arrays.append(jax.device_put(data, device))
  return arrays


def host_time_each(executables: dict, inputs, *, warmup: int = 2, rounds: int = 7,
                    round_s: float = 10e-3) -> dict:
  """Median seconds per call of each executable: rounds of back-to-back calls, each round long enough to hide
  dispatch. The executables take turns round by round (in a rotating order), so that the GPU's clock and
  temperature drifting during tuning do not favour whichever config happened to run first: measured on an
  H200, timing configs one after another picked a matmul config 4% slower than the best."""
  reps = {}
  for k, executable in executables.items():
    for _ in range(warmup):
      jax.block_until_ready(executable(*inputs))
    start = time.perf_counter()
    jax.block_until_ready(executable(*inputs))
    once = max(time.perf_counter() - start, 1e-6)
    reps[k] = int(min(max(round_s / once, 1), 200))

  def seconds(k) -> float:
    start = time.perf_counter()
    out = None
    for _ in range(reps[k]):
      out = executables[k](*inputs)
    jax.block_until_ready(out)
    return (time.perf_counter() - start) / reps[k]

  return _median_in_turns(executables, rounds, seconds)


# On the GPU, one timed program makes the call enough times for about _REPEAT_TARGET_S of GPU time, at most
# _MAX_REPEATS times and with at most _MAX_REPEAT_BYTES of one call's outputs per call made.
_MAX_REPEATS = 64
_MAX_REPEAT_BYTES = 1 << 30
_REPEAT_TARGET_S = 2e-3


def output_bytes(outputs) -> int:
  """The bytes of one call's outputs."""
  return sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(outputs))


def repeats(once_s: float, bytes_per_call: int) -> int:
  """How many calls one timed program makes, given one call's GPU time and output bytes."""
  wanted = min(max(int(np.ceil(_REPEAT_TARGET_S / max(once_s, 1e-7))), 1), _MAX_REPEATS)
  return int(max(1, min(wanted, _MAX_REPEAT_BYTES // max(bytes_per_call, 1))))


def gpu_time_each(executables: dict, inputs, *, warmup: int, rounds: int) -> dict:
  """Median GPU seconds between the stamps of each `gpu_clock.timed` executable, the executables taking
  turns round by round in a rotating order (the GPU's clock and temperature drift during tuning)."""
  for executable in executables.values():
    for _ in range(warmup):
      jax.block_until_ready(executable(*inputs))

  def seconds(k) -> float:
    start, stop, _ = executables[k](*inputs)
    return gpu_clock.elapsed_s(start, stop)

  return _median_in_turns(executables, rounds, seconds)


def _median_in_turns(executables: dict, rounds: int, seconds) -> dict:
  """The median of ``seconds(k)`` for each key of ``executables``, measured in ``rounds`` rounds in which
  the keys take turns in an order rotated by one each round."""
  samples = {k: [] for k in executables}
  order = list(executables)
  for r in range(rounds):
    for k in order[r % len(order):] + order[:r % len(order)]:
      samples[k].append(seconds(k))
  return {k: statistics.median(v) for k, v in samples.items()}


def time_configs(call_for: Callable[[int], Callable], avals, device, indices: list[int], *, warmup: int,
                 rounds: int, make_inputs: Callable = random_inputs) -> dict[int, tuning_records.Timing]:
  """Times the calls of configs ``indices`` (``call_for(k)``) on ``device``, on ``make_inputs(avals, device)``
  (random inputs of ``avals``, or the call's own: timing_inputs.py): each built (in threads), run once, then timed
  in rounds; a config that fails to build or run gets its error instead (tuning_failures.py says which will
  repeat)."""
  on_gpu = device.platform in ("gpu", "cuda")

  def build(index, repeats=1):
    call = gpu_clock.repeated(call_for(index), repeats)
    with shadow.suspended():  # a timed program runs the kernels alone, whatever the shadow mode
      return jax.jit(gpu_clock.timed(call) if on_gpu else call).lower(*avals).compile()

  def build_all(which, repeats=1):
    built = {}
    with concurrent.futures.ThreadPoolExecutor(max(1, min(len(which), os.cpu_count() or 1, 8))) as pool:
      futures = {k: pool.submit(build, k, repeats) for k in which}
      for k, future in futures.items():
        # exception(), not result(): a re-raised exception's traceback would hold this frame, whose
        # `futures` hold the exception: a cycle keeping every executable built here alive until collected.
        error = future.exception()
        if error is None:
          built[k] = future.result()
        else:
          timings[k] = tuning_records.Timing(None, f"{tuning_failures.compile_failure(str(error))}: "
                                                   f"{tuning_failures.error_text(error)}")
    return built

  timings: dict[int, tuning_records.Timing] = {}
  inputs = make_inputs(avals, device)  # first: a call's own inputs that are wrong fail before anything compiles
  executables = build_all(indices)
  launched, first_s, most_bytes = [], [], 0
  for k, executable in executables.items():  # one that fails to launch is left out of the timed rounds
    try:
      jax.block_until_ready(executable(*inputs))
      if on_gpu:
        start, stop, outputs = executable(*inputs)
        first_s.append(gpu_clock.elapsed_s(start, stop))
        most_bytes = max(most_bytes, output_bytes(outputs))
      launched.append(k)
    except Exception as e:
      timings[k] = tuning_records.Timing(None, f"{tuning_failures.launch_failure(str(e))}: "
                                               f"{tuning_failures.error_text(e)}")
  if not launched:
    return timings
  # On the GPU a fast kernel is timed as several calls in one program: the stamps' own gaps spread over more work.
  calls = repeats(min(first_s), most_bytes) if on_gpu else 1
  runnable = build_all(launched, calls) if calls > 1 else {k: executables[k] for k in launched}
  if runnable:
    try:
      if on_gpu:
        seconds = gpu_time_each(runnable, inputs, warmup=warmup, rounds=rounds)
      else:
        seconds = host_time_each(runnable, inputs, warmup=warmup, rounds=rounds)
    except Exception as e:  # a config that passes alone but fails when timed: none of this round counts
      seconds = {}
      for k in runnable:
        timings[k] = tuning_records.Timing(None, f"launch: {tuning_failures.error_text(e)}")
    for k, value in seconds.items():
      timings[k] = tuning_records.Timing(value / calls * 1e6, None)
  return timings
