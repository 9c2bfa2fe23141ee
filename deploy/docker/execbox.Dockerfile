# The execbox service image (API, worker, egress proxy, docker-proxy). BASE is any Debian 13 image:
# debian:trixie-slim with a registry, the debootstrap-made local/debian:trixie (the sandboxes' base)
# without. Its Python is Debian's CPython 3.13; scripts/service-image fetches the wheels for it.
ARG BASE=local/debian:trixie
FROM ${BASE}
# Every image execbox builds carries this label: rebuilds prune their dangling predecessors,
# `make clean` removes them all. Its own name makes its first step its own: images build side by
# side (scripts/images), and two builds making one same step at once leave two cached copies of
# it, after which a later build may follow the other copy and rebuild everything after it.
LABEL org.execbox.built="1" org.execbox.image="execbox"
ENV DEBIAN_FRONTEND=noninteractive PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
 && apt-get clean && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/venv \
 && useradd --system --uid 10001 --no-create-home execbox
# The wheels come from the host (scripts/service-image), so the image build needs no index and no
# TLS set-up of its own.
COPY deploy/docker/wheels /wheels
RUN /opt/venv/bin/pip install --no-cache-dir --no-index --find-links /wheels 'execbox[otel]' && rm -rf /wheels
COPY policies /app/policies
COPY sandbox-images /app/sandbox-images
ENV PATH=/opt/venv/bin:$PATH \
    EXECBOX_POLICIES_DIR=/app/policies \
    EXECBOX_IMAGES_DIR=/app/sandbox-images \
    EXECBOX_ARTIFACTS_DIR=/var/lib/execbox/artifacts
# The artifacts volume starts out owned by the (non-root) worker; no setuid/setgid binary is left
# (su, mount, passwd, ...), so nothing in a service container can regain privileges.
RUN mkdir -p /var/lib/execbox/artifacts /run/execbox-docker \
 && chown 10001:10001 /var/lib/execbox/artifacts /run/execbox-docker \
 && find / -xdev -type f -perm /6000 -exec chmod a-s {} + \
 && rm -f /usr/bin/su /bin/su
USER 10001:10001
WORKDIR /app
CMD ["execbox", "api", "--host", "0.0.0.0", "--port", "8000"]
