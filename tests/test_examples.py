"""The demo and the README's examples run: on the CPU through the fallbacks, on a GPU the kernels too."""

import os
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


RUN_README = '''
    import json, re, sys, textwrap
    import numpy as np
    text = open(sys.argv[1]).read()
    blocks = lambda part: [textwrap.dedent(b) for b in re.findall(r"```python\\n(.*?)```", part, re.S)]
    example = text.split("## Example")[1].split("\\n## ")[0]
    transformations = text.split("## Transformations")[1].split("\\n## ")[0]
    namespace = {}
    for block in blocks(example) + blocks(transformations):
      exec(compile(block, "README.md", "exec"), namespace)
    x = np.asarray(namespace["x"])
    print(json.dumps({
        "y": bool(np.array_equal(np.asarray(namespace["y"]), 3 * x + 1)),
        "y_cpu": bool(np.array_equal(np.asarray(namespace["y_cpu"]), 3 * x + 1)),
        "grads": bool(np.allclose(namespace["dx"], 12 * x, rtol=1e-6) and
                      np.allclose(namespace["dy"], 6 * x, rtol=1e-6)),
        "jvp": bool(np.array_equal(np.asarray(namespace["t"]), np.full_like(x, 2))),
        "sharded": bool(np.array_equal(np.asarray(namespace["ys"]), 3 * x)),
        "exported": namespace["exported"].platforms == ("cuda",),
        "symbolic": bool(np.array_equal(np.asarray(namespace["z"]), 3 * x[:1000])) and
                    str(namespace["exported_any_size"].out_avals[0]) == "float32[m]",
    }))
'''


def test_the_readme_examples_run(tmp_path):
  """The Example and the Transformations sections, in order, in one namespace: on the CPU through the fallbacks."""
  readme = os.path.join(os.path.dirname(conftest.EXAMPLES), "README.md")
  result = fresh_process.run(RUN_README, readme, cwd=tmp_path,
                             env={"JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / "cache")}).result
  assert result == dict.fromkeys(("y", "y_cpu", "grads", "jvp", "sharded", "exported", "symbolic"), True)


RUN_README_LOWERING = '''
    import json, re, sys, textwrap
    text = open(sys.argv[1]).read()
    example = text.split("## Example")[1].split("\\n## ")[0]
    namespace = {}
    for block in re.findall(r"```python\\n(.*?)```", example, re.S):
      exec(compile(textwrap.dedent(block), "README.md", "exec"), namespace)
    print(json.dumps({"custom_call": namespace["custom_call"][:2000]}))
'''


def test_the_readme_shows_the_lowered_custom_call_without_a_gpu(tmp_path):
  """The README's snippet that lowers for CUDA and reads the custom call, run as written (here, without a GPU)."""
  readme = os.path.join(os.path.dirname(conftest.EXAMPLES), "README.md")
  result = fresh_process.run(RUN_README_LOWERING, readme, cwd=tmp_path,
                             env={"JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / "cache")}).result
  call = result["custom_call"]
  assert call.lstrip().startswith("%0 = stablehlo.custom_call @jax_mosaic_ffi_launch_v1(%arg0, %arg1)")
  for attribute in ("block = array<i32: 256, 1, 1>", "grid = array<i32: 4096, 1, 1>", 'kernel_name = "axpy"'):
    assert attribute in call
