# Shared by scripts/stack, scripts/services (sourced, with $port set), scripts/redis-ha and
# scripts/cluster.

# A new random secret (48 hex digits), and the SHA-256 a Redis ACL line holds for a password.
secret() { head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n'; }
digest() { printf %s "$1" | sha256sum | cut -c1-64; }

# Keep one API key for local use in .run/api-key, issuing a new one when the stored one is
# missing or no longer known (e.g. Redis data was removed). Arguments: the key-issuing command.
ensure_key() {
  local key_file=.run/api-key
  if [ -s "$key_file" ] && curl -fsS -H "Authorization: Bearer $(cat "$key_file")" \
      "http://127.0.0.1:$port/v1/languages" >/dev/null 2>&1; then
    echo "auth: using the API key in $key_file (tenant default)"
    return 0
  fi
  if curl -fsS "http://127.0.0.1:$port/v1/languages" >/dev/null 2>&1; then
    echo "auth: OFF (EXECBOX_AUTH__ENABLED=false): every request is tenant default; for local development only"
    : > "$key_file"; return 0
  fi
  # The issuing command is a one-off container right after start-up, when the host is busiest:
  # tried three times, and its own error shown if every try fails.
  local try
  for try in 1 2 3; do
    if "$@" > "$key_file.new" 2> "$key_file.err"; then break; fi
    if [ "$try" = 3 ]; then
      echo "auth: could not issue an API key:" >&2; cat "$key_file.err" >&2
      rm -f "$key_file.new" "$key_file.err"; return 1
    fi
    echo "auth: issuing an API key failed (try $try of 3); trying again" >&2
    sleep 2
  done
  rm -f "$key_file.err"
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

# The deployment's Redis roles and the egress proxy's key, kept across runs (idempotent):
# .run/stack.env gains a REDIS_<ROLE>_PASSWORD per role and EGRESS_PUBLIC_KEY; .run/redis-users.acl
# is rendered from it (digests only); .run/egress.key is the proxy's private key (mode 0400).
ensure_roles() {
  local env_file=.run/stack.env role
  [ -f "$env_file" ] || { : > "$env_file"; chmod 600 "$env_file"; }
  for role in API WORKER EGRESS ADMIN SCALER; do
    grep -q "^REDIS_${role}_PASSWORD=" "$env_file" \
      || echo "REDIS_${role}_PASSWORD=$(secret)" >> "$env_file"
  done
  .venv/bin/execbox redis-acl --prefix "${EXECBOX_REDIS__KEY_PREFIX:-execbox}" --passwords "$env_file" \
    > .run/redis-users.acl
  chmod 644 .run/redis-users.acl
  local public
  public=$(.venv/bin/execbox egress-key .run/egress.key)
  sed -i '/^EGRESS_PUBLIC_KEY=/d; /^REDIS_PASSWORD=/d' "$env_file"
  echo "EGRESS_PUBLIC_KEY=$public" >> "$env_file"
}

# A DSN for one role against Redis at host:port (reads .run/stack.env).
role_url() {  # role host:port
  local upper password
  upper=$(echo "$1" | tr '[:lower:]' '[:upper:]')
  password=$(sed -n "s/^REDIS_${upper}_PASSWORD=//p" .run/stack.env)
  echo "redis://$1:$password@$2/0"
}

# A test's throwaway processes (scripts/seaweedfs --kill, scripts/redis-ha --kill): SIGKILL every
# part named by ROOT/<part>.pid at once, wait (10 s at most each) until it is gone, remove ROOT.
# A graceful stop waits out each part's own shutdown (SeaweedFS's filer alone takes ~17 s), which
# only data worth keeping needs. Refuses a ROOT without ports.env: a directory not made by us.
kill_parts() {  # root parts...
  local root=$1 part pid pids=(); shift
  [ -d "$root" ] || return 0
  [ -f "$root/ports.env" ] || { echo "kill_parts: $root was not made by execbox's scripts; left as it is" >&2; return 1; }
  for part in "$@"; do
    [ -f "$root/$part.pid" ] || continue
    pid=$(cat "$root/$part.pid")
    kill -KILL "$pid" 2>/dev/null && pids+=("$pid")
  done
  for pid in "${pids[@]}"; do
    local deadline=$((SECONDS + 10))
    while kill -0 "$pid" 2>/dev/null; do
      [ "$SECONDS" -lt "$deadline" ] || { echo "kill_parts: pid $pid outlived SIGKILL for 10 s" >&2; return 1; }
      sleep 0.05
    done
  done
  rm -rf -- "$root"
}
