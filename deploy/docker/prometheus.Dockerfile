# The stack's Prometheus, from Debian's package.
ARG BASE=local/debian:bookworm
FROM ${BASE}
# Every image execbox builds carries this label: rebuilds prune their dangling predecessors,
# `make clean` removes them all.
LABEL org.execbox.built="1"
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends prometheus \
 && apt-get clean && rm -rf /var/lib/apt/lists/* \
 && find / -xdev -type f -perm /6000 -exec chmod a-s {} + && rm -f /usr/bin/su /bin/su \
 && install -d -o prometheus -g prometheus /prometheus
# /prometheus is the data volume's mount point: a new volume takes this directory's owner.
USER prometheus
ENTRYPOINT ["/usr/bin/prometheus"]
