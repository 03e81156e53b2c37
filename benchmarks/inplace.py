"""In-place update of 1 GiB through one pointer, with and without donation.

The kernel reads and writes one float32 buffer (input_output_aliases={0: 0},
param_order=("in0", "scalar0"): the aliased pair is one parameter). Jitted
with donate_argnums=0 the update happens in the caller's buffer; without
donation XLA must keep the input, so it copies it into the output first.
"""

from __future__ import annotations

from benchmarks import timing
from benchmarks.markdown import failure, fmt, table
from benchmarks.suite import Run

NAME = "inplace"
TITLE = "In-place update (1 GiB)"
ORDER = 25
RUNS = (Run("main"),)

GIB = 1 << 30
N = GIB // 4
ROUNDS = 50
SAMPLE = 1 << 20  # elements checked at each end

SOURCE = r'''
// One pointer, read and written: the aliased input/output pair.
extern "C" __global__ void add_one_in_place(float4* x, long long n4) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n4) {
    float4 v = x[i];
    x[i] = make_float4(v.x + 1.0f, v.y + 1.0f, v.z + 1.0f, v.w + 1.0f);
  }
}
'''


def run(rounds: int = ROUNDS) -> dict:
  import jax
  import jax.numpy as jnp
  import numpy as np

  import jax_mosaic_ffi as jmf
  n4 = N // 4
  update = jmf.mosaic_kernel(jmf.cuda_kernel(SOURCE, "add_one_in_place"), jax.ShapeDtypeStruct((N,), jnp.float32),
                             grid=n4 // 256, block=256, scalars=(np.int64(n4),), input_output_aliases={0: 0},
                             param_order=("in0", "scalar0"))
  donated, copied = jax.jit(update, donate_argnums=0), jax.jit(update)
  spec = jax.ShapeDtypeStruct((N,), jnp.float32)
  hlo_copies = {name: " copy(" in f.lower(spec).compile().as_text() for name, f in
                (("donated", donated), ("copied", copied))}
  x = jax.random.normal(jax.random.key(0), (N,), jnp.float32)
  ends = _ends(x)
  np.testing.assert_array_equal(_ends(copied(x)), ends + 1)
  np.testing.assert_array_equal(_ends(x), ends)  # not donated: the input is intact
  state = [jnp.copy(x)]
  address = state[0].unsafe_buffer_pointer()
  state[0] = donated(state[0])
  np.testing.assert_array_equal(_ends(state[0]), ends + 1)
  same_buffer = state[0].unsafe_buffer_pointer() == address

  def donated_call():
    state[0] = donated(state[0]).block_until_ready()

  seconds = timing.interleaved({"donated": donated_call, "copied": lambda: copied(x).block_until_ready()}, rounds)
  return {"donated_ms": seconds["donated"] * 1e3, "copied_ms": seconds["copied"] * 1e3,
          "copied_over_donated": seconds["copied"] / seconds["donated"],
          "donated_GBps": 2 * GIB / seconds["donated"] / 1e9, "donated_same_buffer": same_buffer,
          "hlo_copy_donated": hlo_copies["donated"], "hlo_copy_copied": hlo_copies["copied"], "rounds": rounds}


def _ends(x):
  """The first and last SAMPLE elements, on the host."""
  import numpy as np
  return np.concatenate([np.asarray(x[:SAMPLE]), np.asarray(x[-SAMPLE:])])


def tables(results: dict) -> list[str]:
  r = results.get("main")
  why = failure(r)
  if why:
    return [f"n/a: {why}"]
  yes_no = {True: "yes", False: "no"}
  rows = [["donate_argnums=0 (updated in the caller's buffer)", fmt(r["donated_ms"], 3),
           yes_no[r["hlo_copy_donated"]]],
          ["no donation (XLA keeps the input)", fmt(r["copied_ms"], 3), yes_no[r["hlo_copy_copied"]]]]
  method = (f"One jitted call of an in-place kernel (read and write one float32 pointer) on 1 GiB, host-timed "
            f"median of {r['rounds']} calls, both ways interleaved; checked once against numpy at both ends. "
            "\"copy in HLO\" says whether XLA's compiled program copies the input.")
  return [method + "\n\n" + table(["jit", "ms per call", "copy in HLO"], rows, "lrr") +
          f"\n\nWithout donation / with: **{fmt(r['copied_over_donated'])}x**; donated: "
          f"{fmt(r['donated_GBps'], 0)} GB/s (2 GiB moved), result in the donated buffer: "
          f"{yes_no[r['donated_same_buffer']]}"]
