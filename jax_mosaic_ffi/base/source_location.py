"""The source location of the user's call of a kernel, for messages: "model.py:42 (forward)".

Found by walking the stack to the first frame outside jax, jaxlib and this
package. A sharded call is traced again per shard while XLA compiles, far
from the user's line, so `transforms/sharding.py` pins the site it saw when the call
was first traced.

A call made through another public function than ``mosaic_kernel`` (``triton_call``) is traced inside
`called_as`: its call site then names that function (`CallSite.api`), and so do the messages about the call
(``errors.who``), at its trace and at its lowering alike.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import sys
import warnings

from jax._src import source_info_util

from jax_mosaic_ffi.base.paths import PACKAGE_DIR

# The package's frames are not the user's: for this finder, and for the source info jax attaches to equations.
source_info_util.register_exclusion(PACKAGE_DIR)

_pinned: contextvars.ContextVar[str | None] = contextvars.ContextVar("jax_mosaic_ffi_call_site", default=None)
# The public function the user called, as messages name a call: mosaic_kernel unless `called_as` says otherwise.
DEFAULT_API = "mosaic_kernel"
_api: contextvars.ContextVar[str] = contextvars.ContextVar("jax_mosaic_ffi_api", default=DEFAULT_API)
# Each call site as `current` wrote it -> (file, line, module), so that a warning given later about that call (from
# a lowering, or a host callback with no user's frame on the stack) points at its line; bounded.
_sites: dict[str, tuple[str, int, str]] = {}
_MAX_SITES = 1 << 14


def _user_frame():
  frame = sys._getframe(2)  # noqa: SLF001  (the cheap stack walk: inspect.stack reads every frame's source)
  while frame is not None:
    if source_info_util.is_user_filename(frame.f_code.co_filename):
      return frame
    frame = frame.f_back
  return None


class CallSite(str):
  """A call site as `current` writes it, which also knows the public function called there (``api``): a
  ``triton_call``'s messages name ``triton_call``, wherever the site is read (a lowering, a check)."""

  api = DEFAULT_API

  def __new__(cls, site: str, api: str):
    self = super().__new__(cls, site)
    self.api = api
    return self

  def __reduce__(self):
    return CallSite, (str(self), self.api)


def current() -> str:
  pinned = _pinned.get()
  if pinned is not None:
    return pinned
  frame = _user_frame()
  if frame is None:
    site = "<unknown call site>"
  else:
    site = f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno} ({frame.f_code.co_name})"
    if site not in _sites and len(_sites) < _MAX_SITES:
      _sites[site] = (frame.f_code.co_filename, frame.f_lineno, frame.f_globals.get("__name__", "<unknown>"))
  called = _api.get()
  return site if called == DEFAULT_API else CallSite(site, called)


def api() -> str:
  """The public function the user called for the call being traced: ``mosaic_kernel``, or what `called_as` says."""
  return _api.get()


@contextlib.contextmanager
def called_as(name: str):
  """Within: the calls traced are the user's calls of ``name`` (a public function built on mosaic_kernel's front
  ends, such as ``triton_call``), as their call sites and messages say."""
  token = _api.set(name)
  try:
    yield
  finally:
    _api.reset(token)


def warn(message: str, category: type[Warning]) -> None:
  """Warns at the user's line, past jax's frames as well as ours (``stacklevel`` and ``skip_file_prefixes``
  stop at jax's, when the warning comes from inside a trace), once per line as warnings do."""
  frame = _user_frame()
  if frame is None:
    warnings.warn(message, category, stacklevel=2)
    return
  # No module_globals: for a `python -c` script or the prompt, its loader (BuiltinImporter) raises ImportError
  # when asked for the source line; the line is read from the file, where there is one.
  warnings.warn_explicit(message, category, frame.f_code.co_filename, frame.f_lineno,
                         module=frame.f_globals.get("__name__", "<unknown>"),
                         registry=frame.f_globals.setdefault("__warningregistry__", {}))


def warn_at(message, category: type[Warning], call_site: str) -> None:
  """Warns at the line of ``call_site`` (a kernel call's, as `current` wrote it), or where `warn` would when that
  line is not known."""
  where = _sites.get(call_site)
  if where is None:
    warn(message, category)
    return
  filename, lineno, module = where
  warnings.warn_explicit(message, category, filename, lineno, module=module)


@contextlib.contextmanager
def pinned(site: str):
  token = _pinned.set(site)
  try:
    yield
  finally:
    _pinned.reset(token)
