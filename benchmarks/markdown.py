"""Markdown helpers for the report: numbers, tables, failures. No jax here."""

from __future__ import annotations

import re


def fmt(value, digits: int = 2) -> str:
  """A number with `digits` decimals, or n/a."""
  return "n/a" if value is None else f"{value:.{digits}f}"


def sig(value) -> str:
  """A number with three significant digits (whole numbers from 100 up), or n/a."""
  if value is None:
    return "n/a"
  return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"


def ratio(a, b):
  return a / b if a is not None and b else None


def table(header: list[str], rows: list[list[str]], align: str | None = None) -> str:
  """A Markdown table; `align` has one letter per column, l or r (default: first l, rest r)."""
  align = align or "l" + "r" * (len(header) - 1)
  rule = ["---" if a == "l" else "---:" for a in align]
  return "\n".join(row(cells) for cells in [header, rule, *rows])


def row(cells: list[str]) -> str:
  """One line of a Markdown table."""
  cell = lambda text: str(text).replace("|", "\\|")  # an error message must not split a row
  return "| " + " | ".join(map(cell, cells)) + " |"


# What ends a failure's text: an XLA/absl fatal log line (a process abort, e.g.
# an unknown XLA flag) or a Python exception line; JAX's notes come after them.
_FATAL = re.compile(r"^[FE]\d{4} [\d:.]+\s+\d+ \S+\] ")
_EXCEPTION = re.compile(r"^(?:\w+\.)*\w*(?:Error|Exception|Exit|Interrupt|Expired|Failure)\b:?")


def last_line(text: str) -> str:
  """The line of an error text that says what failed."""
  lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
  chosen = (next((_FATAL.sub("", line) for line in reversed(lines) if _FATAL.match(line)), None) or
            next((line for line in reversed(lines) if _EXCEPTION.match(line)), None) or
            (lines[-1] if lines else "?"))
  return chosen[:300]


def failure(result) -> str | None:
  """Why a run has no numbers (its error or skip reason), or None when it has some."""
  if result is None:
    return "not run"
  if "error" in result:
    how = str(result["error"]).strip().splitlines()[0] if str(result["error"]).strip() else "?"
    return f"run failed ({how}): {last_line(result['error'])}"
  if "skipped" in result:
    return "skipped: " + result["skipped"]
  return None


def launch_failure(launch) -> str | None:
  """The line that stands for a launch-cost run without numbers ("Launch cost: n/a: why"), or None when it has some
  (``us_per_call``)."""
  why = failure(launch)
  if why:
    return f"Launch cost: n/a: {why}"
  if "us_per_call" not in launch:
    return f"Launch cost: n/a: {last_line(launch.get('errors', {}).get('ours', '?'))}"
  return None
