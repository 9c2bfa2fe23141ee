#!/usr/bin/env bash
# Make the Secrets the manifests use, once per cluster (idempotent: existing Secrets are kept):
#   execbox-redis-acl            the Redis users file (execbox.core.redis_roles; password digests only)
#   execbox-redis-<role>         one password per role: api, worker, egress, admin, scaler (username too)
#   execbox-egress-key           the egress proxy's private key (mount it into the proxy only)
# and print the egress public key for the admin's EXECBOX_EGRESS__PUBLIC_KEY.
# Needs kubectl and the execbox CLI (`pip install execbox` or the repository's .venv/bin/execbox).
set -euo pipefail
ns=${NAMESPACE:-execbox}
execbox=${EXECBOX:-execbox}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
if kubectl -n "$ns" get secret execbox-redis-acl >/dev/null 2>&1; then
  echo "secrets: execbox-redis-acl exists; delete the execbox-redis-* Secrets to rotate every role" >&2
else
  for role in api worker egress admin scaler; do
    password=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
    echo "REDIS_$(echo "$role" | tr '[:lower:]' '[:upper:]')_PASSWORD=$password" >> "$work/passwords.env"
    kubectl -n "$ns" create secret generic "execbox-redis-$role" \
      --from-literal=username="$role" --from-literal=password="$password"
  done
  "$execbox" redis-acl --prefix "${EXECBOX_REDIS__KEY_PREFIX:-execbox}" --passwords "$work/passwords.env" > "$work/users.acl"
  kubectl -n "$ns" create secret generic execbox-redis-acl --from-file=users.acl="$work/users.acl"
fi
if ! kubectl -n "$ns" get secret execbox-egress-key >/dev/null 2>&1; then
  "$execbox" egress-key "$work/egress.key" >/dev/null
  kubectl -n "$ns" create secret generic execbox-egress-key --from-file=egress.key="$work/egress.key"
fi
kubectl -n "$ns" get secret execbox-egress-key -o jsonpath='{.data.egress\.key}' | base64 -d > "$work/current.key"
echo "EXECBOX_EGRESS__PUBLIC_KEY=$("$execbox" egress-key "$work/current.key")"
