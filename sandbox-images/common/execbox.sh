# execbox helper for bash, on PATH: `source execbox.sh`, then
#   execbox_emit NAME JSON            declare an output value (JSON text), returned under `outputs`
#   execbox_fail MESSAGE [JSON]       stop with check.failed, MESSAGE and details (a JSON object)
#   "$EXECBOX_OUTPUT_DIR"             files written here come back as artifacts
#   jq . "$EXECBOX_INPUTS_FILE"       the request's JSON `inputs` (absent when it had none)
#   execbox_outcome_unknown REASON    stop: whether the effect happened is unknown (outcome.unknown)
#   "$EXECBOX_IDEMPOTENCY_KEY"        the key to forward (same on every attempt), when the call has one
# Values travel in the result file the service reads after the run, never through stdout.

_execbox_update() {  # jq filter and its arguments, applied to the result file
  local result="${EXECBOX_RESULT_FILE:-/workspace/out/.execbox/result.json}"
  mkdir -p "$(dirname "$result")"
  [ -s "$result" ] || echo '{"outputs": {}, "check": null}' > "$result"
  jq "$@" "$result" > "$result.partial" && mv "$result.partial" "$result"
}

execbox_emit() {
  echo "$2" | jq -e . > /dev/null 2>&1 || { echo "execbox_emit: $1: value is not JSON" >&2; return 2; }
  _execbox_update --arg name "$1" --argjson value "$2" '.outputs[$name] = $value'
}

execbox_fail() {
  local details="${2:-{\}}"
  _execbox_update --arg message "$1" --argjson details "$details" '.check = {message: $message, details: $details}'
  exit 1
}

execbox_outcome_unknown() {
  _execbox_update --arg message "$1" '.check = {message: $message, details: {}, outcome_unknown: true}'
  exit 1
}
