#!/usr/bin/env bash
# Put onnxruntime's C API headers into the Python environment's include/onnxruntime, where
# meshd.engine.q4kernel looks for them to build meshd's 4-bit kernel (onnxruntime's wheel does
# not ship them). They come from Debian 13's libonnxruntime-dev package (onnxruntime 1.21: the C
# API is versioned, and a library as new or newer serves a header's version), fetched through
# this machine's own Debian archive with apt-get, into a private apt state (the machine's apt
# sources and lists are not touched), and unpacked without installing. Nothing to do when the
# header is already there. Needs a Debian-family machine with apt-get; elsewhere install
# libonnxruntime-dev from the distribution or set MESHD_ORT_INCLUDE.
#   PYTHON=.venv/bin/python scripts/ort_header.sh
set -euo pipefail
PYTHON=${PYTHON:-python3}
prefix=$("$PYTHON" -c 'import sys; print(sys.prefix)')
dest="$prefix/include/onnxruntime"
if [ -f "$dest/onnxruntime_c_api.h" ]; then
    exit 0
fi
command -v apt-get >/dev/null || { echo "ort_header: no apt-get here; set MESHD_ORT_INCLUDE" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# the archive this machine already uses for Debian (the first deb822 or one-line source)
archive=$(sed -n 's/^URIs: *\([^ ]*debian\)\/\?$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n 1)
if [ -z "$archive" ]; then
    archive=$(sed -n 's/^deb \(\[[^]]*\] \)\?\([^ ]*debian\)\/\? .*/\2/p' /etc/apt/sources.list 2>/dev/null | head -n 1)
fi
[ -n "$archive" ] || { echo "ort_header: no Debian archive in this machine's apt sources" >&2; exit 1; }
mkdir -p "$work/parts" "$work/lists/partial" "$work/cache/archives/partial"
printf 'Types: deb\nURIs: %s\nSuites: trixie\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
    "$archive" >"$work/parts/trixie.sources"
opts=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$work/parts"
      -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache" -o Debug::NoLocking=1
      -o APT::Sandbox::User=root)
apt-get "${opts[@]}" -qq update
(cd "$work" && apt-get "${opts[@]}" -qq download libonnxruntime-dev)
dpkg-deb -x "$work"/libonnxruntime-dev_*.deb "$work/root"
mkdir -p "$dest"
cp -r "$work/root/usr/include/onnxruntime/." "$dest/"
echo "ort_header: onnxruntime's C API headers in $dest"
