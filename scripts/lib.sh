# Shared by scripts/stack and scripts/services (sourced, with $port set).

# Keep one API key for local use in .run/api-key, issuing a new one when the stored one is
# missing or no longer known (e.g. Redis data was removed). Arguments: the key-issuing command.
ensure_key() {
  local key_file=.run/api-key
  if [ -s "$key_file" ] && curl -fsS -H "Authorization: Bearer $(cat "$key_file")" \
      "http://127.0.0.1:$port/v1/languages" >/dev/null 2>&1; then
    echo "auth: using the API key in $key_file (tenant default)"
    return 0
  fi
  if ! "$@" > "$key_file.new" 2>/dev/null; then
    if curl -fsS "http://127.0.0.1:$port/v1/languages" >/dev/null 2>&1; then
      echo "auth: OFF (EXECBOX_AUTH__ENABLED=false): every request is tenant default; for local development only"
      : > "$key_file"; rm -f "$key_file.new"; return 0
    fi
    echo "auth: could not issue an API key" >&2; rm -f "$key_file.new"; return 1
  fi
  mv "$key_file.new" "$key_file"; chmod 600 "$key_file"
  echo "auth: issued an API key for tenant default into $key_file"
}

print_curl() {
  local header=""
  [ -s .run/api-key ] && header=" -H 'Authorization: Bearer $(cat .run/api-key)'"
  echo
  echo "Run code:"
  echo "  curl -s -X POST 'http://127.0.0.1:$port/v1/executions?wait=30'$header -H 'Content-Type: application/json' -d '{\"language\":\"python\",\"code\":\"print(1)\"}'"
}
