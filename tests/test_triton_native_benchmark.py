"""The Triton-native benchmark's kernels (benchmarks/kernels/triton_user.py) through jmf: they compile and lower
on any machine, with the launch the decorators' configs and heuristics pick; on a GPU with torch, each case's
result matches torch through both launchers (the benchmark's own check, run once)."""

import importlib.util

import jax
import jax.numpy as jnp
import pytest

import benchmarks_package
from hlo_inspect import UNTUNED_OK, custom_calls, lower
from triton_required import import_triton

pytestmark = UNTUNED_OK

import_triton()
benchmarks_package.load()
import benchmarks.triton_native as native  # noqa: E402  (after the package is loaded from this tree)


@pytest.fixture(scope="module")
def env():
  return native.environment(with_torch=False)


def test_the_decorators_unwrap_to_their_configs_and_heuristics(env):
  K = env["K"]
  fn, configs, heuristics = native.unwrap(K.matmul_kernel)
  assert fn is K.matmul_kernel.fn and not heuristics
  assert configs[0] == {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8,
                        "num_stages": 3, "num_ctas": 1}
  assert len(configs) == len(K.MATMUL_CONFIGS) == 6
  fn, configs, heuristics = native.unwrap(K.softmax_kernel)
  assert fn is K.softmax_kernel.fn and configs is None and list(heuristics) == ["BLOCK_SIZE"]
  assert heuristics["BLOCK_SIZE"]({"n_cols": 1000}) == 1024


# Integer arguments equal to 1 (the innermost strides) are compiled in and not passed, as Triton's launcher does,
# where jax_mosaic_ffi has Triton-exact specialization (issue 25 item 1); before it, they are passed by value.
ONES_SPECIALIZED = importlib.util.find_spec("jax_mosaic_ffi.triton.compiler.specialize") is not None


def scalars(n: int, ones: int, first: int = -1) -> list[int]:
  """The param_order entries of n scalars, `ones` of them equal to 1, and Triton's two scratch pointers."""
  count = n - (ones if ONES_SPECIALIZED else 0) + 2
  return list(range(first, first - count, -1))


# (case, grid, block, param_order of the lowered call): the first config's tiles without a GPU to time them.
LAUNCHES = [
    ("matmul_4096", [4096 // 128 * (4096 // 256), 1, 1], [256, 1, 1], [0, 1, 2, *scalars(9, 3)]),
    ("attention_causal", [4096 // 128, 4 * 32, 1], [256, 1, 1], [0, 1, 2, -1, 4, 3, *scalars(18, 4, first=-2)]),
    ("softmax", [32768, 1, 1], [256, 1, 1], [1, 0, *scalars(4, 0)]),
]


@pytest.mark.parametrize("name,grid,block,order", LAUNCHES, ids=[c[0] for c in LAUNCHES])
def test_user_style_kernels_lower_with_the_launch_their_decorators_pick(env, isolated_disk_cache, name, grid,
                                                                        block, order):
  case = native.make_case(name, env)
  (call,) = custom_calls(lower(case.ours, *case.avals))
  assert call["target"] == "jax_mosaic_ffi_launch_v1"
  assert (call["operands"], call["results"]) == (len(case.avals), 2 if name.startswith("attention") else 1)
  config = call["config"]
  assert (config["grid"], config["block"], config["param_order"]) == (grid, block, order)
  # The strides are passed by value, two trailing scratch pointers after them (Triton 3.6's calling convention).
  assert config["scalar_sizes"][-2:] == [8, 8]


def test_layer_norm_forward_and_backward_lower_under_jax_grad(env, isolated_disk_cache):
  case = native.make_case("layer_norm", env)
  grads = custom_calls(lower(case.grads, *case.avals))
  names = [c["config"]["kernel_name"] for c in grads]
  assert names == [b"layer_norm_fwd", b"layer_norm_bwd_dx", b"layer_norm_bwd_dwdb"]
  # dx: one program per LN_PROGRAMS share of the rows; dw/db: 64 columns per program.
  assert grads[1]["config"]["grid"] == [native.LN_PROGRAMS, 1, 1] and grads[2]["config"]["grid"] == [128, 1, 1]
  timed = custom_calls(lower(case.ours, *case.avals))
  assert [c["config"]["kernel_name"] for c in timed] == names  # vjp: the same three kernels, nothing else


def test_the_launch_chain_lowers_to_one_call_per_launch(env, isolated_disk_cache):
  np = env["np"]
  aval = jax.ShapeDtypeStruct((1024,), jnp.float32)
  call = native.through_jmf(env["jmf"], env["K"].add_one, aval, avals=(aval,), grid=(1,), scalars=(np.int32(1024),),
                            param_order=("in0", "out0", "scalar0"), constexprs={"BLOCK": 1024})

  def chain(x):
    for _ in range(3):
      x = call(x)
    return x
  calls = custom_calls(lower(chain, aval))
  assert len(calls) == 3 and all(c["config"]["block"] == [128, 1, 1] for c in calls)


@pytest.mark.gpu
def test_each_case_matches_torch_through_both_launchers():
  pytest.importorskip("torch")
  result = native.run(cases=("softmax", "layer_norm", "matmul_4096"), rounds=1)
  assert not result["errors"], result["errors"]
  for name, case in result["cases"].items():
    assert case["us"]["ours"] > 0 and case["us"]["triton"] > 0, name
  assert result["cases"]["layer_norm"]["max_error"]["ours_grad"] <= 2e-2


@pytest.mark.parametrize("name", ["softmax", "attention_causal"])
def test_the_timed_program_is_the_chain_between_two_clock_stamps(env, isolated_disk_cache, name):
  case = native.make_case(name, env)
  calls = custom_calls(lower(native.stamped_chain(case), *case.avals))
  names = [c["config"]["kernel_name"] for c in calls]
  kernel = {"softmax": b"softmax_kernel", "attention_causal": b"attention_fwd"}[name]
  assert names == [b"clock_before", *[kernel] * case.chain, b"clock_after"]
  before, after = calls[0], calls[-1]
  # The first stamp reads the chain's first input (the chain's inputs wait for it through an optimization
  # barrier); the last reads four of the chain's last outputs (it waits for them); each clock is two uint32s.
  assert (before["operands"], before["results"], after["operands"], after["results"]) == (1, 1, 4, 1)
