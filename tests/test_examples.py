"""The README's demo runs: on the CPU it compiles and lowers, on a GPU it also runs."""

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
  assert "matches numpy" in finished.stdout or "did not run the kernel" in finished.stdout
