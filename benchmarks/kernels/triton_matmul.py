"""The Triton matmul of the autotune benchmark: fp16 in, fp32 accumulation, fp16 out,
row-major, one program per BM x BN tile of C, tiles grouped GROUP rows at a time for L2 reuse.
The output pointer comes last, where jax-triton puts outputs, so both runtimes launch this very kernel
(ours with param_order)."""

import triton
import triton.language as tl


@triton.jit
def matmul(a_ptr, b_ptr, M, N, K, c_ptr,
           BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr):
  pid = tl.program_id(0)
  tiles_m = tl.cdiv(M, BM)
  tiles_n = tl.cdiv(N, BN)
  per_group = GROUP * tiles_n
  first_m = (pid // per_group) * GROUP
  group_m = min(tiles_m - first_m, GROUP)
  pid_m = first_m + (pid % per_group) % group_m
  pid_n = (pid % per_group) // group_m
  rm = pid_m * BM + tl.arange(0, BM)
  rn = pid_n * BN + tl.arange(0, BN)
  rk = tl.arange(0, BK)
  a_ptrs = a_ptr + rm[:, None] * K + rk[None, :]
  b_ptrs = b_ptr + rk[:, None] * N + rn[None, :]
  acc = tl.zeros((BM, BN), dtype=tl.float32)
  for k in range(0, tl.cdiv(K, BK)):
    a = tl.load(a_ptrs, mask=(rm[:, None] < M) & (rk[None, :] < K - k * BK), other=0.0)
    b = tl.load(b_ptrs, mask=(rk[:, None] < K - k * BK) & (rn[None, :] < N), other=0.0)
    acc = tl.dot(a, b, acc)
    a_ptrs += BK
    b_ptrs += BK * N
  tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc.to(tl.float16), mask=(rm[:, None] < M) & (rn[None, :] < N))
