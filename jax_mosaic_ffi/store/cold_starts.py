"""Cold starts you can see: one record on the ``jax_mosaic_ffi`` logger per compile or cache answer.

Each names the kernel, its front end and targets, where the entry came from (memory, a kernel pack, the disk cache,
a peer process of the job, or compiled here) and how long the answer took. A compile and an answer from a pack,
the disk or a peer are INFO; a memory hit, and everything of Triton's specializations, DEBUG::

    import logging
    logging.basicConfig()
    logging.getLogger("jax_mosaic_ffi").setLevel(logging.INFO)   # DEBUG: memory hits too

Each record also carries its fields as attributes (``jmf_kernel``, ``jmf_front_end``, ``jmf_source``,
``jmf_seconds``) for a handler that filters or aggregates them. Autotuning's decisions go to the same logger
(transforms/autotune_report.py). The caching guide's "Reading a slow first step" says how to read them.
"""

from __future__ import annotations

import logging
import time

from jax_mosaic_ffi.store.entries import Observer

LOGGER = logging.getLogger("jax_mosaic_ffi")

_SAID = {"memory": "in memory", "pack": "from a kernel pack", "disk": "from the disk cache",
         "peer": "from a peer process of the job", "made": "compiled"}


class ColdStarts(Observer):
  """The log as the store's observer: compiles and Triton's specializations (the kinds whose entries a front end
  describes); timings and decisions are autotuning's report's."""

  def watches(self, ask) -> bool:
    return ask.about is not None and ask.codec.kind in ("compile", "specialization") and LOGGER.isEnabledFor(
        logging.INFO)

  def served(self, ask, found) -> None:
    self._log(ask, found.source)

  def made(self, ask, found, unkept) -> None:
    self._log(ask, "made", f" (kept nowhere: {unkept})" if unkept else "")

  @staticmethod
  def _log(ask, source: str, more: str = "") -> None:
    level = logging.INFO if ask.codec.kind == "compile" and source != "memory" else logging.DEBUG
    if not LOGGER.isEnabledFor(level):
      return
    seconds = time.perf_counter() - ask.started
    about = ask.about()
    kernel, front_end = str(about.get("kernel", "?")), str(about.get("front_end", "?"))
    targets = ", ".join(map(str, about.get("targets") or ())) or "?"
    LOGGER.log(level, "%s '%s' for %s: %s in %.3f s%s", front_end, kernel, targets, _SAID[source], seconds, more,
               extra={"jmf_kernel": kernel, "jmf_front_end": front_end, "jmf_source": source,
                      "jmf_seconds": seconds})


LOG = ColdStarts()
