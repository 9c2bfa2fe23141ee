#!/bin/sh
# A data node of the Sentinel overlay (StatefulSet execbox-redis-node). It writes its config into
# /run/redis, a memory emptyDir (Sentinel rewrites that file at each fail-over), and starts as the
# replica of the current primary, or as the primary. The primary is what a Sentinel names, else a
# data node that says it is one (ROLE), else node 0 on a first start; never the node's own memory
# of being primary, since a node back after a fail-over would then serve stale data until a
# Sentinel demotes it. Names, not pod IPs, everywhere: a pod's IP changes when it moves.
set -eu
service=execbox-redis-node
master_name=execbox
me="$(hostname).$service"
conf_dir=${REDIS_CONF_DIR:-/run/redis}  # another place only for tests/unit/test_k8s_ha_scripts.py

ask() {  # host port command...: as the replicator role, bounded, errors dropped
  host=$1 port=$2
  shift 2
  REDISCLI_AUTH="$REPLICATOR_PASSWORD" timeout 3 redis-cli --no-auth-warning --user replicator \
    -h "$host" -p "$port" "$@" 2>/dev/null || true
}
is_name() { case "$1" in "" | *[!a-z0-9.-]*) return 1 ;; esac; }

primary=""
for i in 0 1 2; do
  answer=$(ask "execbox-sentinel-$i.execbox-sentinel" 26379 SENTINEL GET-MASTER-ADDR-BY-NAME "$master_name" | head -n 1)
  if is_name "$answer"; then primary=$answer; break; fi
done
if [ -z "$primary" ]; then
  for i in 0 1; do
    node="$service-$i.$service"
    [ "$node" = "$me" ] && continue
    if [ "$(ask "$node" 6379 ROLE | head -n 1)" = master ]; then primary=$node; break; fi
  done
fi
[ -n "$primary" ] || primary="$service-0.$service"
echo "redis-node: I am $me; the primary is $primary"

umask 077
{
  echo "port 6379"
  echo "bind 0.0.0.0"
  echo "dir /data"
  echo "aclfile /etc/execbox/users.acl"
  # As the single-node Redis: every write on disk before it is acknowledged, no eviction.
  echo "appendonly yes"
  echo "appendfsync always"
  echo 'save ""'
  echo "maxmemory 768mb"
  echo "maxmemory-policy noeviction"
  echo "masteruser replicator"
  echo "masterauth $REPLICATOR_PASSWORD"
  echo "replica-announce-ip $me"
  echo "repl-diskless-sync-delay 0"
  if [ "$primary" != "$me" ]; then echo "replicaof $primary 6379"; fi
} >"$conf_dir/redis.conf"
exec redis-server "$conf_dir/redis.conf"
