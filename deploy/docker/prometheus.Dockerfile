# The stack's Prometheus, from Debian's package.
ARG BASE=local/debian:trixie
FROM ${BASE}
# Every image execbox builds carries this label: rebuilds prune their dangling predecessors,
# `make clean` removes them all. Its own name makes its first step its own: images build side by
# side (scripts/images), and two builds making one same step at once leave two cached copies of
# it, after which a later build may follow the other copy and rebuild everything after it.
LABEL org.execbox.built="1" org.execbox.image="prometheus"
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends prometheus \
 && apt-get clean && rm -rf /var/lib/apt/lists/* \
 && find / -xdev -type f -perm /6000 -exec chmod a-s {} + && rm -f /usr/bin/su /bin/su \
 && install -d -o prometheus -g prometheus /prometheus \
 && test "$(id -u prometheus):$(id -g prometheus)" = 100:101
# /prometheus is the data volume's mount point: a new volume takes this directory's owner. That owner
# is uid 100, as on Debian 12: the build refuses a base that gives the user another id (an existing
# volume would become unreadable).
USER prometheus
ENTRYPOINT ["/usr/bin/prometheus"]
