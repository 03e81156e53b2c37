"""cuTile kernels as cuTile's users write them (``@ct.kernel``, tiles loaded by block index, ``ct.Constant`` tile
sizes): the samples the cuTile benchmark runs through both launchers (benchmarks/cutile_native.py) and the GPU tests
check against numpy (tests/test_cutile_gpu.py). Each is written here for this package; they follow the shape of
cuTile's own samples (vector add, softmax, matmul, layer norm).

Imports cuTile at import: import this module only where cuda-tile is installed.
"""

import cuda.tile as ct

ConstInt = ct.Constant[int]
ZERO = ct.PaddingMode.ZERO


@ct.kernel
def vector_add(a, b, c, TILE: ConstInt):
  """c = a + b, one tile of TILE elements per block (the last tile zero-padded, its store masked)."""
  block = ct.bid(0)
  x = ct.load(a, index=(block,), shape=(TILE,), padding_mode=ZERO)
  y = ct.load(b, index=(block,), shape=(TILE,), padding_mode=ZERO)
  ct.store(c, index=(block,), tile=x + y)


@ct.kernel
def softmax(x, y, TILE_N: ConstInt):
  """Row-wise softmax of a (M, N) array, one row per block, TILE_N >= N (a power of two), in float32."""
  row = ct.bid(0)
  t = ct.astype(ct.load(x, index=(row, 0), shape=(1, TILE_N), padding_mode=ct.PaddingMode.NEG_INF), ct.float32)
  shifted = t - ct.max(t, axis=1, keepdims=True)
  e = ct.exp(shifted)
  ct.store(y, index=(row, 0), tile=ct.astype(e / ct.sum(e, axis=1, keepdims=True), y.dtype))


@ct.kernel
def matmul(a, b, c, TM: ConstInt, TN: ConstInt, TK: ConstInt):
  """c = a @ b for (M, K) x (K, N), one (TM, TN) tile of c per block, accumulated in float32 on the tensor cores."""
  bm, bn = ct.bid(0), ct.bid(1)
  acc = ct.full((TM, TN), 0, dtype=ct.float32)
  for k in range(ct.num_tiles(a, axis=1, shape=(TM, TK))):
    x = ct.load(a, index=(bm, k), shape=(TM, TK), padding_mode=ZERO)
    w = ct.load(b, index=(k, bn), shape=(TK, TN), padding_mode=ZERO)
    acc = ct.mma(x, w, acc)
  ct.store(c, index=(bm, bn), tile=ct.astype(acc, c.dtype))


@ct.kernel
def layer_norm(x, weight, bias, y, eps: float, TILE_N: ConstInt):
  """y = (x - mean) / sqrt(var + eps) * weight + bias over each row of a (M, N) array, one row per block,
  TILE_N >= N; ``eps`` a runtime scalar."""
  row = ct.bid(0)
  n = x.shape[1]
  t = ct.astype(ct.load(x, index=(row, 0), shape=(1, TILE_N), padding_mode=ZERO), ct.float32)
  inside = ct.reshape(ct.arange(TILE_N, dtype=ct.int32) < n, (1, TILE_N))
  mean = ct.sum(t, axis=1, keepdims=True) / n
  centered = ct.where(inside, t - mean, 0.0)
  rstd = ct.rsqrt(ct.sum(centered * centered, axis=1, keepdims=True) / n + eps)
  w = ct.astype(ct.load(weight, index=(0,), shape=(TILE_N,), padding_mode=ZERO), ct.float32)
  b = ct.astype(ct.load(bias, index=(0,), shape=(TILE_N,), padding_mode=ZERO), ct.float32)
  out = centered * rstd * ct.reshape(w, (1, TILE_N)) + ct.reshape(b, (1, TILE_N))
  ct.store(y, index=(row, 0), tile=ct.astype(out, y.dtype))


@ct.kernel
def scale_wide(x: ct.IndexedWithInt64, y: ct.IndexedWithInt64, s: float, n: ct.ScalarInt64, TILE: ConstInt):
  """y = s * x (its first n elements) with 64-bit shapes, strides and count (ct.IndexedWithInt64, ct.ScalarInt64):
  the other index width."""
  block = ct.bid(0)
  t = ct.load(x, index=(block,), shape=(TILE,), padding_mode=ZERO)
  inside = ct.arange(TILE, dtype=ct.int64) + block * TILE < n
  ct.store(y, index=(block,), tile=ct.where(inside, t * s, 0.0))


@ct.kernel(num_ctas=2)
def vector_add_pairs(a, b, c, TILE: ConstInt):
  """vector_add compiled for clusters of two blocks (num_ctas=2): the cluster is the tile compiler's."""
  block = ct.bid(0)
  x = ct.load(a, index=(block,), shape=(TILE,), padding_mode=ZERO)
  y = ct.load(b, index=(block,), shape=(TILE,), padding_mode=ZERO)
  ct.store(c, index=(block,), tile=x + y)


@ct.kernel
def add_after_previous(a, b, c, TILE: ConstInt):
  """vector_add that waits for the previous kernel first (ct.grid_dependency_control_wait): safe to launch with
  programmatic dependent launch (uses_pdl=True)."""
  ct.grid_dependency_control_wait()
  block = ct.bid(0)
  x = ct.load(a, index=(block,), shape=(TILE,), padding_mode=ZERO)
  y = ct.load(b, index=(block,), shape=(TILE,), padding_mode=ZERO)
  ct.store(c, index=(block,), tile=x + y)


@ct.kernel
def batched_add(a, b, c, TILE: ConstInt):
  """vector_add over a leading batch axis indexed by ct.bid(1) (cutile_kernel(batch_bid=1)): one launch for a
  whole vmap batch."""
  block, item = ct.bid(0), ct.bid(1)
  x = ct.load(a, index=(item, block), shape=(1, TILE), padding_mode=ZERO)
  y = ct.load(b, index=(item, block), shape=(1, TILE), padding_mode=ZERO)
  ct.store(c, index=(item, block), tile=x + y)
