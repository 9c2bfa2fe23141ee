# Redis for the stack, from Debian's package (no registry needed). Started with AOF and per-role ACL users.
ARG BASE=local/debian:trixie
FROM ${BASE}
# Every image execbox builds carries this label: rebuilds prune their dangling predecessors,
# `make clean` removes them all. Its own name makes its first step its own: images build side by
# side (scripts/images), and two builds making one same step at once leave two cached copies of
# it, after which a later build may follow the other copy and rebuild everything after it.
LABEL org.execbox.built="1" org.execbox.image="redis"
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends redis-server redis-tools \
 && apt-get clean && rm -rf /var/lib/apt/lists/* \
 && find / -xdev -type f -perm /6000 -exec chmod a-s {} + && rm -f /usr/bin/su /bin/su \
 && mkdir -p /data && chown redis:redis /data \
 && test "$(id -u redis):$(id -g redis)" = 100:101
# The data volume belongs to uid 100 (redis), as it did on Debian 12: a base whose package set gives
# the user another id would leave an existing deployment's data unreadable, so the build refuses it.
USER redis
WORKDIR /data
