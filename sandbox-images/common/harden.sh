#!/bin/sh
# Shared image hardening, run as the last build step of every sandbox image:
# no setuid/setgid programs, no su/sudo, a fixed unprivileged user, the launcher in place.
set -eu
find / -xdev -type f -perm /6000 -exec chmod a-s {} + 2>/dev/null || true
rm -f /bin/su /usr/bin/su /usr/bin/sudo /usr/sbin/sudo
mkdir -p /workspace /opt/execbox
chown 65534:65534 /workspace
# E2B's SDK (and scripts written for it) take /home/user for the sandbox's home: it is the workspace.
mkdir -p /home && ln -sfn /workspace /home/user
# The launcher runs from an execute-only copy of python3: the kernel marks a process started from
# an unreadable binary non-dumpable, so the sandboxed program cannot ptrace it or read its memory
# (where the per-run nonce of its end-of-run marker lives).
cp "$(readlink -f /usr/bin/python3)" /usr/bin/python3-launcher
chown 0:0 /usr/bin/python3-launcher
chmod 0111 /usr/bin/python3-launcher
rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb /root/.cache
