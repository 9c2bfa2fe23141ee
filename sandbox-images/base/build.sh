#!/usr/bin/env bash
# Make a Debian base image without a registry: debootstrap a minimal root filesystem of the
# image's tag as suite (local/debian:trixie) and import it. Idempotent: does
# nothing when the image already exists.
set -euo pipefail
name="${1:-local/debian:trixie}"
if docker image inspect "$name" >/dev/null 2>&1; then
  echo "base image $name: present"
  exit 0
fi
command -v debootstrap >/dev/null || { echo "debootstrap missing: apt-get install -y debootstrap" >&2; exit 1; }
work=$(mktemp -d /var/tmp/execbox-rootfs.XXXXXX)
trap 'rm -rf "$work"' EXIT
suite="${name##*:}"
echo "base image $name: debootstrap $suite into $work (a few minutes)"
debootstrap --variant=minbase "$suite" "$work/rootfs" "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" >"$work/log" 2>&1 \
  || { tail -20 "$work/log" >&2; echo "debootstrap failed" >&2; exit 1; }
# The label: `make clean` removes what execbox built (scripts/prune-images).
tar -C "$work/rootfs" -c . | docker import --change 'LABEL org.execbox.built="1"' - "$name" >/dev/null
echo "base image $name: built"
