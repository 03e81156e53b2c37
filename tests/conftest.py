import os

import pytest

# Every GPU test's outputs start as 0xFF bytes (NaN / -1), so an element a
# kernel fails to write cannot pass for a right answer left by an earlier run.
os.environ.setdefault("JAX_MOSAIC_FFI_POISON_OUTPUTS", "1")
# Tests start subprocesses that use the GPU too: do not let XLA take 75% of it.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
# Eight host devices, so collective lowering can be checked over real meshes
# without GPUs. Set before jax initialises its backends.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


def _cuda_device_count() -> int:
  import jax
  try:
    return len(jax.devices("cuda"))
  except RuntimeError:
    return 0


def pytest_collection_modifyitems(config, items):
  count = _cuda_device_count()
  for item in items:
    if "gpu" in item.keywords and count == 0:
      item.add_marker(pytest.mark.skip(reason="needs an NVIDIA GPU"))
    if "multi_gpu" in item.keywords and count < 2:
      item.add_marker(pytest.mark.skip(reason=f"needs 2 or more GPUs, found {count}"))


@pytest.fixture
def rng(request):
  import numpy as np
  # Fresh inputs on every run; the seed is printed on failure to replay it.
  seed = int.from_bytes(os.urandom(4), "little")
  request.node.user_properties.append(("seed", seed))
  print(f"random seed: {seed}")
  return np.random.default_rng(seed)


@pytest.fixture
def isolated_disk_cache(tmp_path, monkeypatch):
  monkeypatch.setenv("JAX_MOSAIC_FFI_CACHE_DIR", str(tmp_path / "kernel-cache"))
  import jax_mosaic_ffi as jmf
  jmf.clear_kernel_cache()
  return tmp_path / "kernel-cache"
