#!/usr/bin/env bash
# Build meshd's wheel (deploy/wheels/meshd/) and a wheel of every dependency (deploy/wheels/deps/), the folder the
# Dockerfile installs from with `pip install --no-index`: building the image then needs no
# network. Versions are pinned to those installed beside PYTHON (pip freeze), so the image runs
# what the tests ran. Wheels without a binary release on PyPI (fastecdsa) are compiled here, so
# the host must be glibc 2.36 or older than the image's base (Debian bookworm is) and have gcc
# and libgmp-dev.
#
#   deploy/build-wheels.sh            PYTHON: interpreter whose pip builds (default: .venv's, else python3)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
out="$repo/deploy/wheels"
py="${PYTHON:-}"
if [[ -z "$py" ]]; then
    if [[ -x "$repo/.venv/bin/python" ]]; then py="$repo/.venv/bin/python"; else py=python3; fi
fi
"$py" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' || {
    echo "build-wheels: $py is not Python 3.11, the image's Python: its binary wheels would not install" >&2
    exit 1
}

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$py" -m pip freeze --exclude-editable | grep -v -i '^meshd[= @]' >"$tmp/constraints.txt" || true
if ! "$py" -m pip wheel -q --disable-pip-version-check --wheel-dir "$tmp/wheels" \
        --constraint "$tmp/constraints.txt" "$repo" >"$tmp/log" 2>&1; then
    tail -30 "$tmp/log" >&2
    exit 1
fi
# meshd's own wheel apart, so that the image's layer of dependencies stays cached when only
# meshd changes (Docker compares the files' contents).
mkdir -p "$tmp/out/meshd"
mv "$tmp"/wheels/meshd-*.whl "$tmp/out/meshd/"
mv "$tmp/wheels" "$tmp/out/deps"
rm -rf "$out"
mv "$tmp/out" "$out"
echo "build-wheels: $(ls "$out/meshd"), $(ls "$out/deps" | wc -l) dependencies in $out ($(du -sh "$out" | cut -f1))"
