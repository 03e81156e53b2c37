"""What a CuTe DSL compile that failed says of the user's lines: the line of the launcher (or of a function it
called) where the error was raised, from the error's traceback, and each line of the user's file the DSL's message
names by path (an MLIR location, its own code frame), shown. Only on the error path, in the process that compiled
(a bounded compile's child: the traceback is there); what cannot be found is left out.
"""

from __future__ import annotations

import os

from jax_mosaic_ffi.base import source_origin
from jax_mosaic_ffi.cute.compiler import dsl

_MAX_NAMED = 5


def excerpts(error: BaseException, log: str) -> list[str]:
  """The lines of "source lines named above" for the DSL's ``error`` (its text: ``log``)."""
  cutlass = dsl.modules()[0]
  # The DSL's packages (cutlass, its MLIR bindings) sit side by side: none of their frames is the user's line.
  dsl_folder = os.path.dirname(os.path.dirname(os.path.abspath(cutlass.__file__)))
  places: list[source_origin.Place] = []
  for place in (source_origin.raised_at(error, outside=(dsl_folder,)), *source_origin.places_in(log)):
    if place is not None and place not in places and len(places) < _MAX_NAMED:
      places.append(place)
  return [line for place in places for line in place.excerpt()]
