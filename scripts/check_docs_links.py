"""Checks the internal links of the built docs site: every relative href and src of every HTML page names a file
of the site, and every #anchor an id in its page.

    python scripts/check_docs_links.py build/docs/html

Sphinx (with -W) already refuses cross-references it cannot resolve; this checks what it does not: the HTML as
written, raw links in Markdown, the theme's own links, images. Links with a scheme (https:, mailto:) are external
and left alone (CI has no network). Exits 1 listing each broken link with the page it is on.
"""

from __future__ import annotations

import html.parser
import os
import sys
import urllib.parse


class _Page(html.parser.HTMLParser):
  """The ids a page defines and the links it makes."""

  def __init__(self):
    super().__init__(convert_charrefs=True)
    self.ids: set[str] = set()
    self.links: list[str] = []

  def handle_starttag(self, tag, attrs):
    attrs = dict(attrs)
    for name in ("id", "name") if tag == "a" else ("id",):
      if attrs.get(name):
        self.ids.add(attrs[name])
    for name in ("href", "src"):
      if attrs.get(name) and not (tag == "link" and attrs.get("rel") in ("canonical", "preconnect")):
        self.links.append(attrs[name])


def _parse(path: str) -> _Page:
  page = _Page()
  with open(path, encoding="utf-8") as f:
    page.feed(f.read())
  return page


def broken_links(site: str) -> list[str]:
  """Every internal link of the site at ``site`` that names a missing file or anchor, as 'page: link (why)'."""
  site = os.path.realpath(site)
  pages: dict[str, _Page] = {}
  for folder, _, files in os.walk(site):
    for name in files:
      if name.endswith(".html"):
        path = os.path.join(folder, name)
        pages[path] = _parse(path)
  if not pages:
    return [f"{site}: no HTML pages (was the site built?)"]
  broken = []
  for path, page in sorted(pages.items()):
    where = os.path.relpath(path, site)
    for link in page.links:
      parts = urllib.parse.urlsplit(link)
      if parts.scheme or parts.netloc or link.startswith("//"):
        continue  # external
      target = path if not parts.path else os.path.normpath(
          os.path.join(os.path.dirname(path), urllib.parse.unquote(parts.path)))
      if os.path.isdir(target):
        target = os.path.join(target, "index.html")
      if not (target == site or target.startswith(site + os.sep)):
        broken.append(f"{where}: {link} (outside the site)")
      elif not os.path.isfile(target):
        broken.append(f"{where}: {link} (no such file)")
      elif parts.fragment and target.endswith(".html"):
        ids = pages[target].ids if target in pages else _parse(target).ids
        if urllib.parse.unquote(parts.fragment) not in ids:
          broken.append(f"{where}: {link} (no anchor #{parts.fragment} in {os.path.relpath(target, site)})")
  return broken


def main(argv: list[str]) -> int:
  if len(argv) != 2:
    print(__doc__.strip(), file=sys.stderr)
    return 2
  broken = broken_links(argv[1])
  for line in broken:
    print(f"broken link: {line}", file=sys.stderr)
  if broken:
    print(f"error: {len(broken)} broken internal link(s) in {argv[1]}", file=sys.stderr)
    return 1
  print(f"links: every internal link and anchor of {argv[1]} resolves")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
