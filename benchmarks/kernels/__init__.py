"""The kernel corpus: each kernel written once, imported wherever it runs.

The benchmarks import these as `benchmarks.kernels.<name>`, the tests through tests/benchmarks_package.py
(`benchmarks_package.kernels("triton_user")`), so a kernel that both run is one definition.

  triton_user.py       Triton kernels as Triton users write them (tutorial style: strides as arguments,
                       @triton.autotune / @triton.heuristics): grouped matmul, flash attention, softmax, layer norm
  gluon_user.py        Gluon kernels as Triton's Gluon tutorials write them: the Hopper wgmma + TMA GEMMs of 05-wgmma
                       and 07-persistence (an @aggregate MMA as a constexpr), small kernels for the launch cost
  tiled_matmul.py      the CUDA C++ tiled matmul (tiled_matmul.cu) as one autotuning config's mosaic_kernel call
  cuda_corpus.py       real-world CUDA C++ kernels (corpus/*.cu, as llm.c, Apex, vLLM... write them), each with its
                       launch recipe, inputs and reference: tests/test_real_kernels.py runs them, benchmarks/corpus.py
                       times them against XLA
  fused_mlp.cu         a realistic CUDA C++ kernel for the compile-cost benchmark
  hopper_gemm.cu       a wgmma GEMM with TMA descriptors for the GEMM benchmark

Modules import jax inside functions: `python -m benchmarks` imports the package in a parent process that must not
start a GPU backend (cuda_corpus.py, whose cases are jax values, is imported by the tests and the corpus
benchmark's child alone).
"""
