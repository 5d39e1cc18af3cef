#!/usr/bin/env bash
# Wheels of twine and of every dependency, for hosts that reach no package index:
#   scripts/build-wheelhouse.sh DIR     then on each host: install-*.sh --wheelhouse DIR
# The wheels are for this machine's Python (major.minor) and platform: build on the same
# Debian release as the hosts. Cached: skipped when DIR already holds this tree's wheel set; after
# a code change only twine's wheel is built again, without the package index when it can be.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
out=${1:?usage: build-wheelhouse.sh DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
python=${PYTHON:-python3}
key=$( (cd "$src" && git ls-files -z agent controlplane pyproject.toml 2>/dev/null | xargs -0 sha256sum 2>/dev/null \
        || find agent controlplane pyproject.toml -name '*.py' -o -name '*.toml' | sort | xargs sha256sum) | sha256sum | cut -c1-16)
# the fleet page's charting library (uPlot, from npm), for hosts that reach no npm registry: the
# installers copy it to /usr/share/twine/ui/uplot
dist=$src/ui/node_modules/uplot/dist
[ -f "$dist/uPlot.iife.min.js" ] || (cd "$src/ui" && npm ci --no-audit --no-fund >/dev/null)
mkdir -p "$out/ui-assets"
cp "$dist/uPlot.iife.min.js" "$dist/uPlot.min.css" "$out/ui-assets/"
if [ -e "$out/.built-$key" ]; then
  echo "build-wheelhouse: $out is up to date"
  exit 0
fi
rm -f "$out"/twine-*.whl "$out"/.built-*
log=$(mktemp)
# Offline first, from the wheels already here: after a code change only twine's own wheel is new
# (setuptools, kept here, builds it). Else (a first build, a new dependency) from the package index.
if ! "$python" -m pip wheel -q --no-index --find-links "$out" --wheel-dir "$out" "$src" >"$log" 2>&1; then
  # and what pyproject.toml's [build-system] requires (setuptools), kept for the offline builds
  read -ra build_reqs < <("$python" -c 'import sys, tomllib; print(" ".join(tomllib.load(open(sys.argv[1], "rb"))["build-system"]["requires"]))' "$src/pyproject.toml")
  "$python" -m pip wheel -q --wheel-dir "$out" "$src" "${build_reqs[@]}" >"$log" 2>&1 \
    || { cat "$log" >&2; rm -f "$log"; exit 1; }
fi
rm -f "$log"
rm -rf "$src/build"
touch "$out/.built-$key"
echo "build-wheelhouse: $(ls "$out"/*.whl | wc -l) wheels in $out"
