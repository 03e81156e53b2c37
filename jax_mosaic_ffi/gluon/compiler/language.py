"""Gluon as Triton's compiler takes it: `GLUON`, the `Language` our Triton compile is given for ``@gluon.jit``.

The compile is Triton's own (triton/compiler/compile.py), from Gluon's source object (``GluonASTSource``: the
module gets its target, warps and CTAs before codegen, as Gluon checks layouts while it builds them, and Triton
runs Gluon's stages, not Triton's optimizing ones). Its ``hash()``, Triton's cache key and so ours, is the Triton
wing's, read whole (`triton.compiler.keys.KeyedSource`): a class passed as a constexpr (``MMAImpl=WGMMA``) by
every method the kernel may call through it. A failure's advice names what usually fails in Gluon: a layout that does
not fit ``num_warps`` or the block, or a name of Gluon's that the installed Triton calls otherwise.
"""

from __future__ import annotations

import functools
import re

from jax_mosaic_ffi.triton.compiler import bounds
from jax_mosaic_ffi.triton.compiler import keys
from jax_mosaic_ffi.triton.compiler.languages import Language

# Gluon's names that moved between the Triton releases we support (3.6 to 3.9): a kernel written for one release
# fails in another with AttributeError naming one of them. name -> (the release that brought it, what before).
_BROUGHT = {
    "async_load": ((3, 8), "tma.async_copy_global_to_shared"),
    "async_store": ((3, 8), "tma.async_copy_shared_to_global"),
    "allocate_mbarrier": ((3, 7), "gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())"),
    "barrier": ((3, 7), "gl.thread_barrier"),
}
# name -> (the release that removed it, what from then on). Triton 3.9 keeps tma.async_copy_global_to_shared and
# async_copy_shared_to_global as stubs whose own error says what to call instead.
_REMOVED = {"thread_barrier": ((3, 7), "gl.barrier")}
_MISSING = re.compile(r"has no attribute '(\w+)'")


def _triton_version() -> tuple[int, int]:
  import triton  # noqa: PLC0415  (optional dependency: Triton)
  major, minor = (int("".join(c for c in part if c.isdigit()) or 0) for part in triton.__version__.split(".")[:2])
  return major, minor


def _text(release: tuple[int, int]) -> str:
  return f"Triton {release[0]}.{release[1]}"


def advice(error: BaseException) -> str:
  """What a failed Gluon compile advises: the installed Triton's name for a moved one, else the usual causes."""
  installed = _triton_version()
  found = _MISSING.search(str(error))
  name = found.group(1) if found else None
  if name in _BROUGHT and installed < _BROUGHT[name][0]:
    release, before = _BROUGHT[name]
    return (f"Gluon's API changes between Triton releases: {name} came in {_text(release)}, and the installed "
            f"{_text(installed)} calls it {before}. Write the kernel for {_text(installed)}, or install the Triton "
            "it was written for")
  if name in _REMOVED and installed >= _REMOVED[name][0]:
    release, after = _REMOVED[name]
    return (f"Gluon's API changes between Triton releases: {_text(release)} replaced {name} with {after}. Write "
            f"the kernel for the installed {_text(installed)}, or install the Triton it was written for")
  if "has been removed" in str(error):
    return (f"Gluon's API changes between Triton releases: the installed {_text(installed)} removed a name the "
            "kernel calls (the message says what replaced it). Write the kernel for it, or install the Triton it "
            "was written for")
  return ("this config fails in Gluon's compile, most often where a layout does not fit the launch: the product of "
          "a layout's warps_per_cta must be num_warps (pass num_warps= to gluon_kernel, a config or triton_call, "
          "which a num_warps parameter receives too), and a block must fit its layout; num_stages changes nothing in "
          "a Gluon kernel. Under autotuning the config is skipped")


@functools.cache
def _source_class():
  """Gluon's source, keyed whole (`keys.KeyedSource`), its tensors bounded (`bounds.BoundedSource`: its
  make_ir checks Gluon's module, layouts and all)."""
  try:
    from triton.experimental.gluon import GluonASTSource  # noqa: PLC0415  (optional dependency: Triton >= 3.9)
  except ImportError:  # Triton 3.6 to 3.8 keep it in the module of Gluon's runtime
    from triton.experimental.gluon._runtime import GluonASTSource  # noqa: PLC0415  (optional dependency: Triton)

  class KeyedGluonSource(keys.KeyedSource, bounds.BoundedSource, GluonASTSource):
    pass

  return KeyedGluonSource


def _source(fn, signature, constexprs, attrs):
  return _source_class()(fn, signature, constexprs, attrs)


GLUON = Language(name="Gluon", maker="gluon_kernel", source=_source, stages=("glir", "ttgir", "llir", "ptx"),
                 advice=advice)
