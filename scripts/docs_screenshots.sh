#!/usr/bin/env bash
# Screenshots of the built docs site (scripts/docs.sh), to look at it as a reader does: headless Chromium
# (Debian: apt-get install chromium) renders each page at a laptop's width, and the full height of the page.
#
#   bash scripts/docs_screenshots.sh OUT_DIR [PAGE...]
#
# PAGEs are paths inside build/docs/html (default: the index, a guide, the reference and one reference page);
# each becomes OUT_DIR/<page with / as ->.png. JMF_DOCS_OUT is the built site's folder, as for scripts/docs.sh;
# JMF_SCREENSHOT_WIDTH and JMF_SCREENSHOT_HEIGHT set the window (default 1440 x 2000); JMF_SCREENSHOT_DARK=1
# renders the dark theme.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[ $# -ge 1 ] || { echo "usage: $0 OUT_DIR [PAGE...]" >&2; exit 2; }
out="$1"; shift
site="${JMF_DOCS_OUT:-$repo/build/docs}/html"
[ -f "$site/index.html" ] || { echo "error: no built site in $site: run bash scripts/docs.sh first" >&2; exit 1; }
browser="$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)"
[ -n "$browser" ] || { echo "error: no chromium on PATH (Debian: apt-get install chromium)" >&2; exit 1; }
pages=("$@")
[ ${#pages[@]} -gt 0 ] || pages=(index.html guides/getting_started.html reference/index.html
                                  reference/generated/jax_mosaic_ffi.mosaic_kernel.html glossary.html)
mkdir -p "$out"
profile="$(mktemp -d)"
trap 'rm -rf "$profile"' EXIT
flags=()
[ "${JMF_SCREENSHOT_DARK:-0}" = 1 ] && flags+=(--force-dark-mode --blink-settings=preferredColorScheme=0)
for page in "${pages[@]}"; do
  [ -f "$site/$page" ] || { echo "error: no page $page in $site" >&2; exit 1; }
  png="$out/$(echo "${page%.html}" | tr / -).png"
  rm -f "$png"  # a screenshot of an earlier run must not pass for this one  # --no-sandbox: Chromium refuses to run as root otherwise; the pages are our own build, read from disk.
  "$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir="$profile" \
    --window-size="${JMF_SCREENSHOT_WIDTH:-1440},${JMF_SCREENSHOT_HEIGHT:-2000}" "${flags[@]}" \
    --screenshot="$png" "file://$site/$page" >"$profile/chromium.log" 2>&1
  if [ ! -s "$png" ]; then
    echo "error: chromium wrote no screenshot of $page; it said:" >&2
    tail -20 "$profile/chromium.log" >&2
    exit 1
  fi
  echo "$png"
done
