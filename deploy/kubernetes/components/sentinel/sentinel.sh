#!/bin/sh
# A Sentinel of the Sentinel overlay (StatefulSet execbox-sentinel, three of them, quorum 2). Its
# state is not kept across restarts: at each start it writes a fresh config into /run/sentinel
# (Sentinel rewrites it as it learns), monitoring the primary the other Sentinels name, else the
# data node that says it is primary (ROLE), else node 0. Sentinels resolve and announce the pods'
# stable DNS names (resolve-hostnames, announce-hostnames), because pod IPs change.
set -eu
service=execbox-sentinel
nodes=execbox-redis-node
master_name=execbox
me="$(hostname).$service"
# Other places only for tests/unit/test_k8s_ha_scripts.py.
conf_dir=${SENTINEL_CONF_DIR:-/run/sentinel}
users=${SENTINEL_USERS_FILE:-/etc/execbox/sentinel-users.acl}

ask() {  # user password host port command...: bounded, errors dropped
  user=$1 password=$2 host=$3 port=$4
  shift 4
  REDISCLI_AUTH="$password" timeout 3 redis-cli --no-auth-warning --user "$user" \
    -h "$host" -p "$port" "$@" 2>/dev/null || true
}
is_name() { case "$1" in "" | *[!a-z0-9.-]*) return 1 ;; esac; }
digest() { printf %s "$1" | sha256sum | cut -c1-64; }

primary=""
for i in 0 1 2; do
  peer="$service-$i.$service"
  [ "$peer" = "$me" ] && continue
  answer=$(ask peer "$PEER_PASSWORD" "$peer" 26379 SENTINEL GET-MASTER-ADDR-BY-NAME "$master_name" | head -n 1)
  if is_name "$answer"; then primary=$answer; break; fi
done
if [ -z "$primary" ]; then
  for i in 0 1; do
    if [ "$(ask sentinel "$SENTINEL_PASSWORD" "$nodes-$i.$nodes" 6379 ROLE | head -n 1)" = master ]; then
      primary="$nodes-$i.$nodes"
      break
    fi
  done
fi
[ -n "$primary" ] || primary="$nodes-0.$nodes"
# Sentinel refuses to monitor a name that does not resolve: wait (at most 2 minutes) for its record.
waited=0
until getent hosts "$primary" >/dev/null; do
  waited=$((waited + 1))
  if [ "$waited" -ge 120 ]; then echo "sentinel: $primary does not resolve after 120 s" >&2; exit 1; fi
  sleep 1
done
echo "sentinel: I am $me; monitoring $primary"

umask 077
{
  echo "port 26379"
  echo "dir $conf_dir"
  # Before `monitor`, which names a host: both settings are read in order.
  echo "sentinel resolve-hostnames yes"
  echo "sentinel announce-hostnames yes"
  echo "sentinel announce-ip $me"
  echo "sentinel monitor $master_name $primary 6379 2"
  echo "sentinel down-after-milliseconds $master_name 5000"
  echo "sentinel failover-timeout $master_name 30000"
  echo "sentinel parallel-syncs $master_name 1"
  echo "sentinel auth-user $master_name sentinel"
  echo "sentinel auth-pass $master_name $SENTINEL_PASSWORD"
  echo "sentinel sentinel-user peer"
  echo "sentinel sentinel-pass $PEER_PASSWORD"
  # Nobody without credentials; Sentinels among themselves as `peer`; execbox's roles and the data
  # nodes' replicator may only ask where the primary and replicas are (sentinel-users.acl).
  echo "user default off resetpass -@all"
  echo "user peer on #$(digest "$PEER_PASSWORD") allchannels +@all"
  cat "$users"
} >"$conf_dir/sentinel.conf"
exec redis-server "$conf_dir/sentinel.conf" --sentinel
