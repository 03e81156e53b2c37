"""What native code prints on the process's stderr during a block, kept for an error message and passed on.

Some compilers say why they failed only there: Triton's MLIR passes print their diagnostics to file
descriptor 2 and raise ``RuntimeError("PassManager::run failed")``. A user in a notebook never sees that
descriptor, so the diagnostics belong in the exception. `captured` points descriptor 2 at a private temporary
file for the block, then writes everything it caught to the real stderr, unchanged, so nothing is lost.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import threading

# The most kept for a message: the end of the output, where a failure's reason is.
MAX_KEPT_CHARS = 16000
# Descriptor 2 is the process's: one block catches it at a time (the same thread may nest blocks).
_lock = threading.RLock()


class Captured:
  """The text caught by `captured`, once its block has ended."""

  text: str = ""


@contextlib.contextmanager
def captured():
  """Catches descriptor 2 during the block (`Captured.text` afterwards: its last `MAX_KEPT_CHARS` characters);
  blocks of other threads wait for it."""
  with _lock:
    with _redirected() as result:
      yield result


@contextlib.contextmanager
def _redirected():
  result = Captured()
  for stream in (sys.stdout, sys.stderr):
    with contextlib.suppress(Exception):
      stream.flush()
  try:
    saved = os.dup(2)
  except OSError:  # no descriptor 2 to redirect: nothing to catch
    yield result
    return
  with tempfile.TemporaryFile() as sink:
    os.dup2(sink.fileno(), 2)
    try:
      yield result
    finally:
      with contextlib.suppress(Exception):
        sys.stderr.flush()
      os.dup2(saved, 2)
      os.close(saved)
      sink.seek(0)
      tail, passing_on = b"", True
      while chunk := sink.read(1 << 20):  # passed on in pieces: a dump of hundreds of MB is never held whole
        try:
          view = memoryview(chunk)
          while passing_on and view:
            view = view[os.write(2, view):]
        except OSError:
          passing_on = False
        tail = (tail + chunk)[-4 * MAX_KEPT_CHARS:]  # UTF-8: at most 4 bytes a character
      result.text = tail.decode(errors="replace")[-MAX_KEPT_CHARS:]
