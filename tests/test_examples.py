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
    }))
'''


def test_the_readme_examples_run(tmp_path):
  """The Example and the Transformations sections, in order, in one namespace: on the CPU through the fallbacks."""
  readme = os.path.join(os.path.dirname(conftest.EXAMPLES), "README.md")
  result = fresh_process.run(RUN_README, readme, cwd=tmp_path,
                             env={"JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / "cache")}).result
  assert result == dict.fromkeys(("y", "y_cpu", "grads", "jvp", "sharded", "exported"), True)
