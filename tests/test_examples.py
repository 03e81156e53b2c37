"""The demo runs: on the CPU through the fallbacks, on a GPU the kernel too. (The README's and the docs' code blocks:
tests/test_docs_examples.py.)"""

import re

import fresh_process
import conftest

RUN_DEMO = '''
    import runpy, sys
    runpy.run_path(sys.argv[1], run_name="__main__")
'''


def test_demo_runs(tmp_path):
  finished = fresh_process.run(RUN_DEMO, f"{conftest.EXAMPLES}/demo.py", cwd=tmp_path,
                               env={"JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / "cache")})
  assert "lowered for CUDA" in finished.stdout
  assert "ran the jax.numpy fallback on the CPU: matches numpy" in finished.stdout
  # Where jax has a GPU the demo must have run the kernel on it, not stopped early.
  if conftest._cuda_devices()[0]:
    assert re.search(r"^ran on .+: matches numpy \(and the fallback\)", finished.stdout, re.M), finished.stdout
  else:
    assert "did not run the kernel" in finished.stdout and "\nran on " not in finished.stdout
    # Said once, by the demo's last line: not also by the package's NoGpuWarning.
    assert "NoGpuWarning" not in finished.stderr, finished.stderr
