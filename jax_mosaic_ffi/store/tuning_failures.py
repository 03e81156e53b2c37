"""Which autotuning failures will happen again, and so may be remembered.

A config that does not compile, or asks the GPU for more than it has (too much shared memory, too many
threads for its registers, a cluster or cooperative grid too large), fails the same way every time: its
failure is kept with its timing record, so it is not built and launched again. Anything else may pass next
time (out of memory while other work ran, a busy GPU, a flaky peer): such a failure is reported in the table
but never stored, and a stored one (from an older version, or a tuning file) is timed again.

An error is kept as text whose prefix says which: ``compile:`` and ``resources:`` will repeat; ``launch:``
and ``compile (out of memory):`` may not.
"""

from __future__ import annotations

_LASTING = ("compile:", "resources:")

# What the runtime (csrc/runtime/call_site.cc, call_site_launch.cc, kernel_cache.cc) and the CUDA driver say
# when a launch asks for more than the GPU gives; tests/test_autotune.py checks that the runtime still says so.
RESOURCE_MARKERS = (
    "use a smaller block",                          # more threads than the kernel's registers allow
    "lower smem_bytes",                             # more shared memory than a block may have
    "does not allow clusters of more than 8",       # a non-portable cluster on a GPU without them
    "CUDA_ERROR_OUT_OF_RESOURCES",                  # registers x threads over the SM's
    "CUDA_ERROR_INVALID_CLUSTER_SIZE",
    "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE",
)
_OUT_OF_MEMORY_MARKERS = ("RESOURCE_EXHAUSTED", "CUDA_ERROR_OUT_OF_MEMORY", "out of memory", "Out of memory")


def launch_failure(text: str) -> str:
  """The prefix for a config that failed to run, from the whole error text."""
  return "resources" if any(marker in text for marker in RESOURCE_MARKERS) else "launch"


def compile_failure(text: str) -> str:
  """The prefix for a config whose program failed to build: out of memory may not happen again."""
  return "compile (out of memory)" if any(marker in text for marker in _OUT_OF_MEMORY_MARKERS) else "compile"


def lasting(error: str | None) -> bool:
  """Whether a recorded failure will happen again (and so is kept and trusted)."""
  return error is not None and error.startswith(_LASTING)


def error_text(e: BaseException) -> str:
  """The exception's first two lines (a compiler's "could not compile ...:" and its first reason), bounded."""
  lines = [line.strip() for line in f"{type(e).__name__}: {e}".splitlines() if line.strip()]
  return " ".join(lines[:2])[:300] or type(e).__name__
