#!/usr/bin/env bash
# Build every sandbox image and run its smoke test under the sandbox's hardening.
# BASE_IMAGE picks the base (e.g. debian:bookworm-slim with a registry); without it the
# debootstrap-made local/debian:bookworm is built when missing. Idempotent (docker's cache).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
base="${BASE_IMAGE:-local/debian:bookworm}"
if [ -z "${BASE_IMAGE:-}" ]; then "$here/base/build.sh" "$base"; fi
status=0
for meta in "$here"/*/metadata.yaml; do
  dir=$(dirname "$meta"); lang=$(basename "$dir")
  image=$(sed -n 's/^image: *//p' "$meta")
  smoke=$(sed -n 's/^smoke: *\[\(.*\)\]/\1/p' "$meta" | tr -d ',')
  echo "image $lang -> $image: building"
  if ! docker build -q --build-arg "BASE=$base" -f "$dir/Dockerfile" -t "$image" "$here" >/tmp/execbox-build-$lang.log 2>&1; then
    tail -30 /tmp/execbox-build-$lang.log >&2; echo "image $lang: BUILD FAILED" >&2; status=1; continue
  fi
  # shellcheck disable=SC2086
  # Through the launcher, as the worker runs programs (an empty file frame: ten zeros).
  out=$(printf '0000000000' | docker run -i --rm --network none --read-only --cap-drop ALL --security-opt no-new-privileges \
        --user 65534:65534 --pids-limit 64 --security-opt "seccomp=$here/../policies/seccomp.json" --memory 512m --memory-swap 512m --tmpfs /tmp:size=64m \
        --tmpfs /workspace:size=16m,uid=65534,gid=65534 \
        "$image" python3 -I -S /opt/execbox/launch.py $smoke 2>&1) || true
  if [ "$out" = "OK" ]; then echo "image $lang: smoke test OK"; else echo "image $lang: SMOKE TEST FAILED: $out" >&2; status=1; fi
done
"$here/../scripts/prune-images"  # the images these replaced
exit $status
