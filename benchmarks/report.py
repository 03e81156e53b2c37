"""The report: docs/benchmarks.md (and figures) from the results, and the
same again from a saved JSON, on any machine (no jax, no GPU):

    python -m benchmarks.report results.json [--doc PATH] [--splice]

``--splice`` replaces only the sections of the benchmarks in the JSON (a run
of some of them, as a GPU call's budget allows), each saying which run it
came from, and keeps the rest of the page as the full run wrote it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback

from benchmarks import REPO, goals, machine, suite
from benchmarks.markdown import last_line, row, table

DOC = os.path.join(REPO, "docs", "benchmarks.md")


def render(results: dict, figures: dict[str, str] | None = None) -> str:
  """The whole page; `figures` maps a benchmark's NAME to an image path relative to the page."""
  figures = figures or {}
  parts = [_header(results), "## Goals\n\n" + goals.section(results)]
  measured = results.get("results", {})
  modules = suite.discover()
  for module in modules:
    if module.NAME in measured:
      parts.append(_section(module, measured[module.NAME], figures.get(module.NAME)))
  for name in sorted(set(measured) - {m.NAME for m in modules}):
    parts.append(f"## {name}\n\nNo module renders these results any more; they are in the JSON.")
  if results.get("runs"):
    parts.append(_runs(results["runs"]))
  return "\n\n".join(parts) + "\n"


def _header(results: dict) -> str:
  note = f"\n\n*{results['note']}*" if results.get("note") else ""
  return ("# Benchmarks\n\n"
          f"Written by `python -m benchmarks` on {results.get('date', '?')}: "
          f"{machine.summary(results.get('machine', {}))}.\n"
          "Every comparison is a ratio of numbers measured in the same run, and in the same process where a "
          "table says so. The raw results are JSON (`--out`); `python -m benchmarks.report results.json` "
          f"writes this page again from them.{note}")


def _section(module, results: dict, image: str | None) -> str:
  try:
    blocks = module.tables(results)
  except Exception:  # one renderer's bug must not cost the rest of the page
    blocks = [f"Could not render these results: {last_line(traceback.format_exc())}"]
  text = f"## {module.TITLE}\n\n" + "\n\n".join(blocks)
  return text + (f"\n\n![{module.TITLE}]({image})" if image else "")


def _runs(runs: dict) -> str:
  rows = [[name, f"{run['seconds']:.1f}", run["outcome"]] for name, run in runs.items()]
  total = sum(run["seconds"] for run in runs.values())
  return (f"## Runs\n\nOne process each; {total:.0f} s in all.\n\n" +
          table(["run", "seconds", "outcome"], rows, "lrl"))


def write(results: dict, doc: str = DOC, *, figures: bool = True, splice: bool = False) -> str:
  """Writes the page (and the figures beside it); returns its text. ``splice``: into the page already at
  `doc`, replacing only the sections of the benchmarks in `results` (`spliced`)."""
  directory = os.path.dirname(os.path.abspath(doc))
  os.makedirs(directory, exist_ok=True)
  images = {}
  for module in suite.discover() if figures else ():
    name = getattr(module, "FIGURE", None)
    if name and module.NAME in results.get("results", {}):
      try:
        if module.figure(results["results"][module.NAME], os.path.join(directory, name)):
          images[module.NAME] = name
      except Exception as e:  # the tables matter more than the picture
        print(f"figure {name}: {e}", file=sys.stderr)
  if splice and os.path.exists(doc):  # no page yet: the whole one
    with open(doc) as f:
      text = spliced(f.read(), results, images)
  else:
    text = render(results, images)
  with open(doc, "w") as f:
    f.write(text)
  return text


def spliced(page: str, results: dict, figures: dict[str, str] | None = None) -> str:
  """`page` with the section of each benchmark in `results` replaced by one rendered from them, saying which
  run it came from (a section the page lacks goes before its Runs), and with their goals' and runs' rows.
  The header, the other goals, runs and sections stay as the run that wrote the page left them."""
  figures = figures or {}
  measured = results.get("results", {})
  origin = (f"*This section alone is from a later run of its benchmark, on {results.get('date', '?')}: "
            f"{machine.summary(results.get('machine', {}))}. The header above names the run of the rest.*")
  for module in suite.discover():
    if module.NAME not in measured:
      continue
    title, _, body = _section(module, measured[module.NAME], figures.get(module.NAME)).partition("\n\n")
    section = f"{title}\n\n{origin}\n\n{body}"
    start = page.find(f"\n{title}\n")
    if start < 0:
      runs = page.find("\n## Runs\n")
      if runs < 0:
        page = f"{page.rstrip()}\n\n{section}"
      else:
        page = f"{page[:runs + 1]}{section}\n\n{page[runs + 1:]}"
      continue
    end = page.find("\n## ", start + 1)
    page = f"{page[:start + 1]}{section}\n{page[end:] if end >= 0 else ''}"
  # The goals and runs of these benchmarks are this run's too: a row the page has is replaced, a new one added.
  later = f"later run, {results.get('date', '?')}"
  goal_rows, notes = goals.rows(results, {f"{name}/{run}" for name, runs in measured.items() for run in runs})
  page = _put_rows(page, "Goals", [[*cells[:-1], f"{cells[-1]} ({later})"] for cells in goal_rows],
                   notes=notes, stale_notes=[f"- {cells[0]}: " for cells in goal_rows])
  page = _put_rows(page, "Runs", [[name, f"{run['seconds']:.1f}", f"{run['outcome']} ({later})"]
                                  for name, run in results.get("runs", {}).items()])
  return page.rstrip("\n") + "\n"


def _put_rows(page: str, heading: str, rows: list[list[str]], notes=(), stale_notes=()) -> str:
  """`page` with `rows` in the table of its section `heading`, each replacing the row of the same first cell or
  added at the table's end; its list items starting with one of `stale_notes` give way to `notes`."""
  start = page.find(f"\n## {heading}\n")
  if start < 0 or not (rows or notes):
    return page
  end = page.find("\n## ", start + 1)
  end = len(page) if end < 0 else end
  lines = [line for line in page[start:end].rstrip("\n").split("\n") if not line.startswith(tuple(stale_notes))]
  body = [i for i, line in enumerate(lines) if line.startswith("| ")][2:]  # past the header and the rule
  if not body:
    return page
  for cells in rows:
    key = row(cells[:1]) + " "
    same = next((i for i in body if lines[i].startswith(key)), None)
    if same is None:
      same = body[-1] + 1
      lines.insert(same, "")
      body.append(same)
    lines[same] = row(cells)
  if notes:
    lines += ([] if lines[-1].startswith("- ") else [""]) + list(notes)
  tail = page[end:]
  return page[:start] + "\n".join(lines) + ("\n\n" if tail else "\n") + tail.lstrip("\n")


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(prog="python -m benchmarks.report", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("results", help="a JSON file written by python -m benchmarks --out DIR")
  parser.add_argument("--doc", default=DOC, help="where to write the Markdown (default: %(default)s)")
  parser.add_argument("--no-figures", action="store_true", help="write no images (and link none)")
  parser.add_argument("--splice", action="store_true",
                      help="replace only these benchmarks' sections of the page at --doc, keeping the rest")
  args = parser.parse_args(argv)
  with open(args.results) as f:
    results = json.load(f)
  print(write(results, args.doc, figures=not args.no_figures, splice=args.splice))


if __name__ == "__main__":
  main()
