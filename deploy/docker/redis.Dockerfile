# Redis for the stack, from Debian's package (no registry needed). Started with AOF and per-role ACL users.
ARG BASE=local/debian:bookworm
FROM ${BASE}
# Every image execbox builds carries this label: rebuilds prune their dangling predecessors,
# `make clean` removes them all.
LABEL org.execbox.built="1"
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends redis-server redis-tools \
 && apt-get clean && rm -rf /var/lib/apt/lists/* \
 && find / -xdev -type f -perm /6000 -exec chmod a-s {} + && rm -f /usr/bin/su /bin/su \
 && mkdir -p /data && chown redis:redis /data
USER redis
WORKDIR /data
