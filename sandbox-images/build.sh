#!/usr/bin/env bash
# Build every sandbox image and run its smoke test under the sandbox's hardening; then record what
# it holds (its metadata's `probe`) in <folder>/versions.json, which GET /v1/languages shows.
# Every folder with a metadata.yaml is one language or variant: its Dockerfile is built (a folder
# without one runs on another folder's image), an executable `prepare` runs first (e.g. to
# download the files the build installs) and a `wheels/` folder is served to the build on
# 127.0.0.1 from $EXECBOX_WHEELS_PORT (default 38517) up, rather than sent as context (build arg WHEELS).
# The images are built at once, each with its own log (/tmp/execbox-build-<folder>.log).
# BASE_IMAGE (or SANDBOX_BASE_IMAGE, for the sandboxes alone) picks the base (e.g. debian:trixie-slim
# with a registry); without it the debootstrap-made local/debian:trixie, which the service images
# share, is built when missing. Idempotent: docker's cache, and an image already checked (same id, same
# hardening, same commands: <folder>/.checked) is not checked again. Says how long each image took.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
base="${SANDBOX_BASE_IMAGE:-${BASE_IMAGE:-local/debian:trixie}}"
if [ -z "${SANDBOX_BASE_IMAGE:-}${BASE_IMAGE:-}" ]; then "$here/../scripts/phase" "base image $base" "$here/base/build.sh" local/debian:trixie; fi
wheels_port="${EXECBOX_WHEELS_PORT:-38517}"  # the first folder's; the next ones count up from it

# Through the launcher, as the worker runs programs (an empty file frame: ten zeros).
sandboxed() {
  local image=$1; shift
  printf '0000000000' | docker run -i --rm --network none --read-only --cap-drop ALL --security-opt no-new-privileges \
    --user 65534:65534 --pids-limit 64 --security-opt "seccomp=$here/../policies/seccomp.json" --memory 1g --memory-swap 1g \
    --tmpfs /tmp:size=64m --tmpfs /workspace:size=16m,uid=65534,gid=65534 \
    "$image" python3 -I -S /opt/execbox/launch.py "$@"
}

# A metadata field, shell-quoted (a list as words): eval "args=($(field smoke metadata.yaml))".
field() {
  "$here/../.venv/bin/python" -c 'import shlex, sys, yaml
value = yaml.safe_load(open(sys.argv[1])).get(sys.argv[2])
print(shlex.join(value) if isinstance(value, list) else shlex.quote(value or ""))' "$2" "$1"
}

# The smoke test, then the probe into <folder>/versions.json; says what failed.
check() {
  local image=$1 dir=$2 meta=$3 name=$4 out
  eval "local smoke=($(field smoke "$meta"))"
  out=$(sandboxed "$image" "${smoke[@]}" 2>&1) || true
  if [ "$out" = "OK" ]; then echo "image $name: smoke test OK"; else echo "image $name: SMOKE TEST FAILED: $out" >&2; return 1; fi
  eval "local probe=($(field probe "$meta"))"
  [ ${#probe[@]} -gt 0 ] || return 0
  if sandboxed "$image" "${probe[@]}" > "$dir/versions.json.new" 2>/dev/null \
      && python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); assert d["runtime"]["version"]' "$dir/versions.json.new"; then
    mv "$dir/versions.json.new" "$dir/versions.json" || return 1
    echo "image $name: $(python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); print(d["runtime"]["name"], d["runtime"]["version"], "and", len(d["packages"]), "packages")' "$dir/versions.json")"
  else
    rm -f "$dir/versions.json.new"; echo "image $name: PROBE FAILED" >&2; return 1
  fi
}

# One folder: prepare, build (when it has a Dockerfile), check. Its wheel server, if any, on a port of its own.
one() {
  local meta=$1 port=$2 dir name started image network server=""
  dir=$(dirname "$meta"); name=$(basename "$dir"); started=$(date +%s.%N)
  trap '[ -z "${server:-}" ] || kill "$server" 2>/dev/null || true' RETURN
  eval "image=$(field image "$meta")"
  if [ -x "$dir/prepare" ]; then "$dir/prepare" || { echo "image $name: PREPARE FAILED" >&2; return 1; }; fi
  if [ -f "$dir/Dockerfile" ]; then
    echo "image $name -> $image: building"
    network=()
    local args=(--build-arg "BASE=$base")
    if [ -d "$dir/wheels" ]; then
      python3 -m http.server --bind 127.0.0.1 --directory "$dir/wheels" "$port" >/dev/null 2>&1 &
      server=$!
      for _ in $(seq 1 50); do curl -fs "http://127.0.0.1:$port/" >/dev/null && break; sleep 0.1; done
      network=(--network host)  # the build reaches the wheel server on the host's loopback
      args+=(--build-arg "WHEELS=http://127.0.0.1:$port/")
    fi
    if ! docker build -q "${network[@]}" "${args[@]}" -f "$dir/Dockerfile" -t "$image" "$here" \
        >/tmp/execbox-build-$name.log 2>&1; then
      tail -30 /tmp/execbox-build-$name.log >&2; echo "image $name: BUILD FAILED" >&2; return 1
    fi
  else
    echo "image $name -> $image: built by another folder"
  fi
  # An image checked before, under the same hardening (the seccomp profile, and the flags and steps
  # of `sandboxed` and `check` themselves) and with the same commands, is not checked again.
  rm -f "$dir/.checked.new"
  local id hardening checked took
  if ! id=$(docker image inspect -f '{{.Id}}' "$image") \
      || ! hardening=$( { declare -f sandboxed check; cat "$here/../policies/seccomp.json" "$meta"; } | sha256sum); then
    echo "image $name: cannot read the image or its hardening" >&2; return 1
  fi
  checked="$id ${hardening:0:16}"
  if [ -f "$dir/versions.json" ] && [ "$(cat "$dir/.checked" 2>/dev/null)" = "$checked" ]; then
    echo "image $name: unchanged since its smoke test and probe"
  else
    rm -f "$dir/.checked"
    check "$image" "$dir" "$meta" "$name" && echo "$checked" > "$dir/.checked.new" && mv "$dir/.checked.new" "$dir/.checked" \
      || return 1
  fi
  took=$(awk -v a="$started" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  echo "image $name: ready in $took s"
  [ -z "${EXECBOX_PHASES:-}" ] || printf '%*s%-*s %8s s\n' $((2 * ${EXECBOX_PHASE_DEPTH:-0})) '' $((40 - 2 * ${EXECBOX_PHASE_DEPTH:-0})) "sandbox image $name" "$took" >> "$EXECBOX_PHASES"
}

# The folders that build an image, all at once (their downloads, package installs and layer writes
# overlap: 2 cores are not the limit of one build), then those that run on another folder's image.
status=0
pids=()
port=$wheels_port
for meta in "$here"/*/metadata.yaml; do
  [ -f "$(dirname "$meta")/Dockerfile" ] || continue
  one "$meta" "$port" & pids+=($!)
  [ ! -x "$(dirname "$meta")/prepare" ] || port=$((port + 1))  # a port per folder that may serve wheels
done
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
for meta in "$here"/*/metadata.yaml; do
  [ -f "$(dirname "$meta")/Dockerfile" ] && continue
  one "$meta" "$port" || status=1
done
"$here/../scripts/prune-images"  # the images these replaced
exit $status
