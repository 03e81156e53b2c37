#!/usr/bin/env bash
# Makes tests/data/jax0112.jmfpack: a kernel pack recorded under the oldest jax this package supports (0.11.2),
# which tests/test_pack_loading.py loads under the newest (the pack's format is ours, not jax's). It holds the
# CUDA C++ and Triton calls of tests/pack_program.py for sm_90. Rebuild it (from the checkout's root) when their
# compile keys change: a new NVRTC or Triton release in the test venv, a key format, or an edit of those calls:
#   bash tests/data/make_pack_jax0112.sh
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="${JMF_PACK_VENV:-/tmp/jmf-jax0112}"
# A scratch venv with jax 0.11.2 and this checkout installed editable (its own build of the extension).
JMF_VENV="$venv" JMF_JAX=0.11.2 bash -c "source '$repo/scripts/setup_env.sh' triton"
"$venv/bin/python" -c 'import jax; assert jax.__version__ == "0.11.2", jax.__version__'
cd "$repo"
JAX_MOSAIC_FFI_CACHE_DIR=off "$venv/bin/python" -m jax_mosaic_ffi.pack record tests/data/jax0112.jmfpack \
    --arch sm_90 -- "$venv/bin/python" tests/pack_program.py lower cuda,triton
"$venv/bin/python" -m jax_mosaic_ffi.pack list tests/data/jax0112.jmfpack
