#!/usr/bin/env bash
# Make a Debian bookworm base image with Python 3.11 and venv, without any image registry:
# debootstrap a minimal root file system from Debian's package mirror and `docker import` it.
# Idempotent: does nothing when the tag already exists (pass --force to rebuild).
#
#   deploy/make-base-image.sh [--force] [TAG]        (default TAG: meshd-base:bookworm)
#
# Then build meshd's image on it: docker build --build-arg BASE_IMAGE=TAG ... (docs/compose.md).
# Where a registry is reachable, skip this and use the Dockerfile's default, python:3.11-slim.
# Needs root, debootstrap and a running Docker daemon. MIRROR overrides the Debian mirror.
set -euo pipefail

force=0
if [[ "${1:-}" == "--force" ]]; then force=1; shift; fi
tag="${1:-meshd-base:bookworm}"
mirror="${MIRROR:-http://deb.debian.org/debian}"
suite="${SUITE:-bookworm}"

if [[ $force == 0 ]] && docker image inspect "$tag" >/dev/null 2>&1; then
    echo "make-base-image: $tag exists (use --force to rebuild)"
    exit 0
fi
command -v debootstrap >/dev/null || { echo "make-base-image: debootstrap is not installed" >&2; exit 1; }

root="$(mktemp -d /var/tmp/meshd-base.XXXXXX)"
trap 'rm -rf --one-file-system "$root"' EXIT

echo "make-base-image: debootstrap $suite from $mirror into $root (a few minutes)"
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    "$suite" "$root" "$mirror" >"$root.log" 2>&1 || {
    tail -20 "$root.log" >&2; rm -f "$root.log"; exit 1; }
rm -f "$root.log"

# What a container does not need: package caches and lists, docs, man pages, locales.
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* \
       "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* \
       "$root"/var/log/*.log "$root"/var/cache/debconf/*-old
find "$root"/usr/share/locale -mindepth 1 -maxdepth 1 ! -name 'C.*' -exec rm -rf {} + 2>/dev/null || true
# The apt sources debootstrap wrote name the mirror; a container may apt-get from it.
echo "deb $mirror $suite main" >"$root/etc/apt/sources.list"

tar --numeric-owner -C "$root" -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["/bin/bash"]' \
    --message "debootstrap --variant=minbase $suite + python3, python3-venv" \
    - "$tag" >/dev/null
docker run --rm "$tag" python3 -c 'import sys, venv; assert sys.version_info[:2] >= (3, 11), sys.version'
echo "make-base-image: $tag ready ($(docker image inspect -f '{{.Size}}' "$tag" | awk '{printf "%.0f MB", $1/1e6}'))"
