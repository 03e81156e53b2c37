# Sourced by scripts/gpu_check.sh: packages carried to the GPU machine in parts (scripts/carry_pack.sh).
#   carried_stash REPO STASH     moves the parts found in REPO/.carry/ (NAME.part-NN, NAME.sha256) into STASH,
#                                which outlives the call (the next call replaces the tree's carried folders)
#   carried_path STASH NAME...   unpacks each bundle once (all parts there, checksum right) and prints the
#                                path entries it adds (the folder, plus what its .pth files add), ':'-joined
#   carried_install VENV [PATHS]   puts PATHS (carried_path's output) on VENV's path as an installation does, in a
#                                .pth file of its site-packages, not on PYTHONPATH (the CuTe DSL's runtime library
#                                is loaded from installed folders only: jax_mosaic_ffi/cute/compiler/package.py); with no
#                                PATHS it removes that file (before a build: the build takes the machine's jaxlib).
#                                site reads .pth files in name order: 00- puts them before the machine's packages,
#                                which setup_env.sh's _jmf_parent_site.pth adds
#   carried_tools STASH [PATHS]  prints a folder for the front of PATH holding links to the programs a front end
#                                looks for on PATH when its own lookup through the packages misses them (cuTile's
#                                tileiras: its lookup goes through the nvidia.cu13 namespace package, which a
#                                machine whose nvidia/ is a regular package hides; PATH is where cuTile looks next);
#                                nothing where PATHS carry none
# Needs JMF_PYTHON (a Python to honour the .pth files with).
carried_stash() {
  local repo=$1 stash=$2 f
  compgen -G "$repo/.carry/*.part-*" >/dev/null || return 0
  mkdir -p "$stash"
  for f in "$repo"/.carry/*.part-* "$repo"/.carry/*.sha256; do
    [ -f "$f" ] || continue
    cmp -s "$f" "$stash/${f##*/}" || { cp "$f" "$stash/" && echo "== stashed ${f##*/}"; }
  done
}

carried_path() {
  local stash=$1 name site want added path="" parts_here
  shift
  for name in "$@"; do
    parts_here=("$stash/$name".part-*)
    if [ ! -f "$stash/$name.sha256" ] || [ ! -e "${parts_here[0]}" ]; then
      echo "error: no carried bundle $name in $stash: carry .carry/$name.part-NN and .carry/$name.sha256" \
           "(scripts/carry_pack.sh makes them), one part per call, back to back" >&2
      return 1
    fi
    site="$stash/$name.site"
    want="$(cat "$stash/$name.sha256")"
    if [ "$(cat "$site/.jmf-carried-stamp" 2>/dev/null)" != "$want" ]; then
      if [ "$(cat "${parts_here[@]}" | sha256sum | cut -d' ' -f1)" != "$want" ]; then
        echo "error: the ${#parts_here[@]} parts of $name here (${parts_here[*]##*/}) do not make the bundle" \
             ".carry/$name.sha256 describes: a part is missing (a machine that went cold keeps none of them)" \
             "or comes from another pack: carry them again, back to back" >&2
        return 1
      fi
      echo "== unpacking the carried bundle $name into $site" >&2
      rm -rf "$site" && mkdir -p "$site"
      cat "${parts_here[@]}" | xz -d | tar -C "$site" -xf - || { echo "error: unpacking $name failed" >&2; return 1; }
      echo "$want" > "$site/.jmf-carried-stamp"
    fi
    # The CuTe DSL puts its packages on the path through a .pth file, which PYTHONPATH alone would skip.
    added="$("$JMF_PYTHON" -S -c 'import site, sys; before = list(sys.path); site.addsitedir(sys.argv[1])
print(":".join(p for p in sys.path if p not in before))' "$site")" || return 1
    path="$path${path:+:}$added"
  done
  echo "$path"
}

carried_install() {
  local venv=$1 paths=${2:-} site
  [ -x "$venv/bin/python" ] || { [ -z "$paths" ] && return 0; echo "error: no venv at $venv" >&2; return 1; }
  site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" || return 1
  if [ -z "$paths" ]; then
    rm -f "$site/00-jmf-carried.pth"
  else
    tr ':' '\n' <<<"$paths" > "$site/00-jmf-carried.pth"
  fi
}

carried_tools() {
  local stash=$1 paths=${2:-} entry tool found=""
  local -a entries
  IFS=: read -r -a entries <<<"$paths"
  rm -rf "$stash/tools"
  for entry in "${entries[@]}"; do
    for tool in tileiras tileirdisasm; do
      [ -x "$entry/nvidia/cu13/bin/$tool" ] || continue
      mkdir -p "$stash/tools" && ln -sf "$entry/nvidia/cu13/bin/$tool" "$stash/tools/$tool" && found=1
    done
  done
  [ -z "$found" ] || echo "$stash/tools"
}
