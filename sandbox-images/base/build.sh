#!/usr/bin/env bash
# Make the Debian bookworm base image without a registry: debootstrap a minimal root
# filesystem and import it. Idempotent: does nothing when the image already exists.
set -euo pipefail
name="${1:-local/debian:bookworm}"
if docker image inspect "$name" >/dev/null 2>&1; then
  echo "base image $name: present"
  exit 0
fi
command -v debootstrap >/dev/null || { echo "debootstrap missing: apt-get install -y debootstrap" >&2; exit 1; }
work=$(mktemp -d /var/tmp/execbox-rootfs.XXXXXX)
trap 'rm -rf "$work"' EXIT
echo "base image $name: debootstrap bookworm into $work (a few minutes)"
debootstrap --variant=minbase bookworm "$work/rootfs" "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" >"$work/log" 2>&1 \
  || { tail -20 "$work/log" >&2; echo "debootstrap failed" >&2; exit 1; }
tar -C "$work/rootfs" -c . | docker import - "$name" >/dev/null
echo "base image $name: built"
