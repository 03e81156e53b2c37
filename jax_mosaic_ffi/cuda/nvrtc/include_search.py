"""Where NVRTC looked for each header before the folder it found it in: paths a cache hit needs still empty.

A header created later at one of those paths is read instead of the one compiled in: with ``-Ia -Ib`` and
``params.h`` only in ``b``, a ``params.h`` made in ``a`` (or, for the source's own ``#include "params.h"``, in
the working directory) shadows it. So a cache entry lists these paths with the headers read (file_deps records
them absent, to stay absent), and a hit counts only while each is still empty.

NVRTC's search (measured with NVRTC 13.0; tests/test_disk_cache.py checks it):

- ``#include "x"``: the including file's folder first (for the source itself, whose name has no folder, the
  working directory), then each ``-I`` folder in the order given;
- ``#include <x>``: each ``-I`` folder in the order given;
- a header found in folder ``d`` is named ``d/x`` (``d`` as given, ``"a/"`` giving ``"a/x"``).

NVRTC's include trace names the files read and, by nesting, which file included which (program.py); how the
includer wrote its ``#include`` (the name, quotes or brackets) is read from its text. Where that text does not
say (a name built by a macro, an includer that cannot be read), every path either form could have tried is
listed: a superset costs at most a needless compile once such a path appears, never a stale kernel.

``__has_include`` reads nothing, so the trace does not show it, yet its answer changes the code compiled: a
header made at a path the probe searched turns it true, deleting the one it found turns it false. So every
file read is searched for probes (``__has_include``, ``__has_include_next`` and macros defined as one, like
CCCL's ``_CCCL_HAS_INCLUDE``), and for each name the search's paths up to the first file found are listed too:
those before it must stay absent, the one found must stay the same (``probed``). A probe whose name a macro
builds is not followed.
"""

from __future__ import annotations

import os
import re

_LONG = "--include-path"
_DIRECTIVE = re.compile(rb'^[ \t]*#[ \t]*include(?:_next)?[ \t]*([<"])([^>"\n]+)[>"]', re.MULTILINE)
_MAX_TEXT_BYTES = 64 << 20
_PROBES = (b"__has_include", b"__has_include_next")
# "#define _CCCL_HAS_INCLUDE(_X) __has_include(_X)": a macro that is a probe of its argument.
_PROBE_MACRO = re.compile(rb"^[ \t]*#[ \t]*define[ \t]+(\w+)\([ \t]*(\w+)[ \t]*\)[ \t]*"
                          rb"(?:__has_include|__has_include_next)[ \t]*\([ \t]*\2[ \t]*\)", re.MULTILINE)


def search_folders(options) -> list[str]:
  """The ``-I`` folders of NVRTC ``options``, in order, as NVRTC takes them (``-Idir``, ``-I dir``, ``-I`` then
  ``dir``, ``--include-path=dir``)."""
  folders = []
  options = [str(o) for o in options]
  index = 0
  while index < len(options):
    option = options[index]
    if option in ("-I", _LONG) and index + 1 < len(options):
      folders.append(options[index + 1].strip())
      index += 2
      continue
    if option.startswith(_LONG + "="):
      folders.append(option[len(_LONG) + 1:].strip())
    elif option.startswith("-I"):
      folders.append(option[2:].strip())
    index += 1
  return [f for f in folders if f]


def _joined(folder: str, name: str) -> str:
  """A header ``name`` in ``folder`` as NVRTC names it; the working directory is the empty folder."""
  if not folder:
    return name
  return folder + name if folder.endswith("/") else f"{folder}/{name}"


def _name_in(path: str, folder: str) -> str | None:
  """The name ``path`` was included by if NVRTC found it in ``folder``, or None if it cannot have been."""
  if not folder:
    return None if os.path.isabs(path) else path
  prefix = folder if folder.endswith("/") else folder + "/"
  return path[len(prefix):] if path.startswith(prefix) and len(path) > len(prefix) else None


def _directives(text: bytes) -> dict[str, set[str]]:
  """Each name a file's ``#include`` lines give, with how: '"' and/or '<'."""
  found: dict[str, set[str]] = {}
  for quote, name in _DIRECTIVE.findall(text):
    found.setdefault(name.decode(errors="replace"), set()).add(quote.decode())
  return found


def _read(path: str) -> bytes | None:
  try:
    with open(path, "rb") as f:
      return f.read(_MAX_TEXT_BYTES)
  except OSError:
    return None


def read_texts(includes, source: str = "") -> dict[str | None, bytes | None]:
  """The text of ``source`` (key None) and of every file of ``includes`` (None: unreadable), read once for
  `tried_before` and `probed`."""
  texts: dict[str | None, bytes | None] = {None: source.encode()}
  for path, includer in includes:
    for name in (path, includer):
      if name not in texts:
        texts[name] = _read(name)
  return texts


def tried_before(includes, folders, source: str = "", texts=None) -> list[str]:
  """Every path NVRTC's search may have tried, before finding each header of ``includes`` ((path read, path of
  the file that included it, None for ``source`` itself)), with include folders ``folders``; ``texts``: what
  `read_texts` gives, when the caller has it."""
  texts = read_texts(includes, source) if texts is None else texts
  directives: dict[str | None, dict[str, set[str]] | None] = {}
  tried = set()
  for path, includer in includes:
    if includer not in directives:
      text = texts[includer]
      directives[includer] = None if text is None else _directives(text)
    written = directives[includer] or {}
    # Quoted includes start in the includer's folder; the search then goes on through the -I folders.
    order = [os.path.dirname(includer) if includer else "", *folders]
    found = [(at, name) for at, folder in enumerate(order) if (name := _name_in(path, folder)) is not None]
    confirmed = [(at, name) for at, name in found if name in written]
    for at, name in confirmed or found:
      how = written.get(name, {'"', "<"})
      if '"' in how:
        tried.update(_joined(earlier, name) for earlier in order[:at])
      if "<" in how:  # brackets skip the includer's folder (a header found there came by quotes)
        tried.update(_joined(earlier, name) for earlier in order[1:at])
  tried.difference_update(path for path, _ in includes)
  return sorted(tried)


def probed(includes, folders, source: str = "", in_memory=(), texts=None) -> list[str]:
  """Every path whose presence decided a ``__has_include`` in ``source`` or a header of ``includes`` (as for
  `tried_before`): per name probed, the paths its search tries up to and including the first file there.
  Names of ``in_memory`` headers are answered without a search."""
  texts = read_texts(includes, source) if texts is None else texts
  wrappers = set(_PROBES)
  for text in texts.values():
    wrappers.update(name for name, _ in _PROBE_MACRO.findall(text or b""))
  probe = re.compile(rb"(?<![\w])(?:" + b"|".join(re.escape(w) for w in sorted(wrappers)) +
                     rb')[ \t]*\([ \t]*([<"])([^>"\n]+)[>"]')
  paths = set()
  for path, text in texts.items():
    for quote, raw in set(probe.findall(text or b"")):
      name = raw.decode(errors="replace").strip()
      if not name or name in in_memory:
        continue
      if os.path.isabs(name):
        paths.add(name)
        continue
      order = ([os.path.dirname(path) if path else ""] if quote == b'"' else []) + list(folders)
      for folder in order:
        candidate = _joined(folder, name)
        if os.path.isdir(candidate):
          continue  # not a header: the search goes on past it
        paths.add(candidate)
        if os.path.exists(candidate):
          break
  return sorted(paths)
