# Redis for the stack, from Debian's package (no registry needed). Started with AOF and a password.
ARG BASE=local/debian:bookworm
FROM ${BASE}
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends redis-server redis-tools \
 && apt-get clean && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /data && chown redis:redis /data
USER redis
WORKDIR /data
