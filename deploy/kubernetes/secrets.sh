#!/usr/bin/env bash
# Make the Secrets the manifests use, once per cluster (idempotent: existing Secrets are kept):
#   execbox-redis-acl            the Redis users file (execbox.core.redis_roles; password digests only)
#   execbox-redis-<role>         one password per role: api, worker, egress, admin, scaler (username too)
#   execbox-egress-key           the egress proxy's private key (mount it into the proxy only)
# and print the egress public key for the admin's EXECBOX_EGRESS__PUBLIC_KEY. Options:
#   --sentinel          for overlays/sentinel and many-hosts: the users file also holds `replicator`
#                       (the replica's link) and `sentinel` (Sentinel's commands on the data nodes),
#                       and execbox-redis-internal holds their passwords, the Sentinels' `peer`
#                       password and the Sentinels' users file (each role: only where the primary is)
#   --s3 external       for overlays/s3: execbox-s3 (access-key, secret-key) from the environment's
#                       EXECBOX_S3_ACCESS_KEY and EXECBOX_S3_SECRET_KEY
#   --s3 seaweedfs      for overlays/seaweedfs and many-hosts: a new key pair in execbox-s3, and the
#                       same pair as the S3 gateway's one identity in execbox-seaweedfs-s3 (s3.json)
# Needs kubectl and the execbox CLI (`pip install execbox` or the repository's .venv/bin/execbox).
set -euo pipefail
ns=${NAMESPACE:-execbox}
execbox=${EXECBOX:-execbox}
sentinel=false
s3=""
while [ $# -gt 0 ]; do
  case "$1" in
    --sentinel) sentinel=true ;;
    --s3) s3=${2:-}; shift ;;
    *) echo "usage: $0 [--sentinel] [--s3 external|seaweedfs]" >&2; exit 2 ;;
  esac
  shift
done
case "$s3" in "" | external | seaweedfs) ;; *) echo "secrets: --s3 takes external or seaweedfs, not '$s3'" >&2; exit 2 ;; esac
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
umask 077
secret() { head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n'; }
digest() { printf %s "$1" | sha256sum | cut -c1-64; }
exists() { kubectl -n "$ns" get secret "$1" >/dev/null 2>&1; }

if exists execbox-redis-acl; then
  echo "secrets: execbox-redis-acl exists; delete the execbox-redis-* Secrets to rotate every role" >&2
  if $sentinel && ! exists execbox-redis-internal; then
    echo "secrets: execbox-redis-acl was made without --sentinel (it lacks the replicator and sentinel users):" \
      "delete the execbox-redis-* Secrets and run this again with --sentinel" >&2
    exit 1
  fi
else
  for role in api worker egress admin scaler; do
    password=$(secret)
    echo "REDIS_$(echo "$role" | tr '[:lower:]' '[:upper:]')_PASSWORD=$password" >> "$work/passwords.env"
    kubectl -n "$ns" create secret generic "execbox-redis-$role" \
      --from-literal=username="$role" --from-literal=password="$password"
  done
  "$execbox" redis-acl --prefix "${EXECBOX_REDIS__KEY_PREFIX:-execbox}" --passwords "$work/passwords.env" > "$work/users.acl"
  if $sentinel; then
    replicator=$(secret) sentinel_pw=$(secret) peer=$(secret)
    # Where the primary and replicas are, and nothing else: what a client (and a data node at start) asks a Sentinel.
    query="-@all +ping +client|setname +sentinel|get-master-addr-by-name +sentinel|masters +sentinel|master"
    query="$query +sentinel|slaves +sentinel|replicas +sentinel|sentinels"
    while read -r _ role _ hash _; do
      [[ "$hash" == \#* ]] || continue
      echo "user $role on $hash $query"
    done < <(grep '^user ' "$work/users.acl") > "$work/sentinel-users.acl"
    echo "user replicator on #$(digest "$replicator") $query" >> "$work/sentinel-users.acl"
    {
      # As scripts/redis-ha: the replica's link (+role: a data node asks the other which it is, at
      # start) and the commands Redis's Sentinel documentation lists for monitoring and fail-over.
      echo "user replicator on #$(digest "$replicator") -@all +psync +replconf +ping +role"
      echo "user sentinel on #$(digest "$sentinel_pw") allchannels -@all +multi +exec +slaveof +replicaof +ping" \
        "+subscribe +config|rewrite +role +publish +info +client|setname +client|kill +script|kill"
    } >> "$work/users.acl"
    kubectl -n "$ns" create secret generic execbox-redis-internal --from-literal=replicator="$replicator" \
      --from-literal=sentinel="$sentinel_pw" --from-literal=peer="$peer" \
      --from-file=sentinel-users.acl="$work/sentinel-users.acl"
  fi
  kubectl -n "$ns" create secret generic execbox-redis-acl --from-file=users.acl="$work/users.acl"
fi

if [ -n "$s3" ] && exists execbox-s3; then
  echo "secrets: execbox-s3 exists; delete it (and execbox-seaweedfs-s3) to change the S3 keys" >&2
elif [ "$s3" = external ]; then
  : "${EXECBOX_S3_ACCESS_KEY:?set EXECBOX_S3_ACCESS_KEY (and EXECBOX_S3_SECRET_KEY) to your bucket's keys}"
  : "${EXECBOX_S3_SECRET_KEY:?set EXECBOX_S3_SECRET_KEY to your bucket's secret key}"
  kubectl -n "$ns" create secret generic execbox-s3 --from-literal=access-key="$EXECBOX_S3_ACCESS_KEY" \
    --from-file=secret-key=<(printf %s "$EXECBOX_S3_SECRET_KEY")
elif [ "$s3" = seaweedfs ]; then
  access=$(head -c 10 /dev/urandom | od -An -tx1 | tr -d ' \n')
  key=$(head -c 20 /dev/urandom | od -An -tx1 | tr -d ' \n')
  printf '{"identities": [{"name": "execbox", "credentials": [{"accessKey": "%s", "secretKey": "%s"}], "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}\n' \
    "$access" "$key" > "$work/s3.json"
  kubectl -n "$ns" create secret generic execbox-seaweedfs-s3 --from-file=s3.json="$work/s3.json"
  kubectl -n "$ns" create secret generic execbox-s3 --from-literal=access-key="$access" \
    --from-file=secret-key=<(printf %s "$key")
fi

if ! exists execbox-egress-key; then
  "$execbox" egress-key "$work/egress.key" >/dev/null
  kubectl -n "$ns" create secret generic execbox-egress-key --from-file=egress.key="$work/egress.key"
fi
kubectl -n "$ns" get secret execbox-egress-key -o jsonpath='{.data.egress\.key}' | base64 -d > "$work/current.key"
echo "EXECBOX_EGRESS__PUBLIC_KEY=$("$execbox" egress-key "$work/current.key")"
