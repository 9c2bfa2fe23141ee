#!/bin/sh
# Shared image hardening, run as the last build step of every sandbox image:
# no setuid/setgid programs, no su/sudo, a fixed unprivileged user, the launcher in place.
set -eu
find / -xdev -type f -perm /6000 -exec chmod a-s {} + 2>/dev/null || true
rm -f /bin/su /usr/bin/su /usr/bin/sudo /usr/sbin/sudo
mkdir -p /workspace /opt/execbox
chown 65534:65534 /workspace
rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb /root/.cache
