"""The Triton releases this wing is written and tested against, and `require_triton`, which imports Triton where a
kernel first needs it and refuses another release by name.

Triton's compile API, its specialization code and its kernels' calling convention change between minor releases,
so others are refused rather than half-working. 3.6 to 3.9 share what we use: ASTSource / compile /
get_cache_key, the argument binder and JITFunction._pack_args, and the parameters an entry takes (the
non-constexpr ones, then a global and a profile scratch pointer).
"""

from __future__ import annotations

# [min, max)
SUPPORTED_TRITON = ((3, 6), (3, 10))
SUPPORTED_TEXT = ("Triton >= 3.6, < 3.10 (tested: 3.6.0 to 3.9.0 compiling and lowering on CPU, "
                  "3.6.0 on an H200)")


def _version_tuple(version: str) -> tuple[int, ...]:
  parts = []
  for piece in version.split("+")[0].split(".")[:3]:
    digits = "".join(c for c in piece if c.isdigit()) or "0"
    parts.append(int(digits))
  return tuple(parts)


class TritonUnavailable(ImportError):
  """Triton is not installed, or not a supported version.

  Raised by `triton_kernel` and `triton_call`; the message names the supported range (``>=3.6,<3.10``).
  ``pip install 'jax_mosaic_ffi[triton]'`` installs a supported Triton.
  """


def require_triton():
  """The triton module, or TritonUnavailable saying what to install."""
  try:
    import triton  # noqa: PLC0415  (optional dependency: Triton)
  except ImportError as e:
    raise TritonUnavailable(
        f"jmf.triton_kernel needs Triton ({SUPPORTED_TEXT}): pip install 'jax_mosaic_ffi[triton]' ({e})") from None
  check_version(triton.__version__)
  return triton


def check_version(version: str) -> None:
  low, high = SUPPORTED_TRITON
  if not low <= _version_tuple(version)[:2] < high:
    raise TritonUnavailable(
        f"jmf.triton_kernel supports {SUPPORTED_TEXT}; Triton {version} is installed. Its compiler API and the "
        f"parameters its kernels take change between releases: pip install 'jax_mosaic_ffi[triton]' for a "
        f"supported one")
