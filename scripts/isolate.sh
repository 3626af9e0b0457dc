#!/usr/bin/env bash
# Run a command without network access: a new user + network namespace with only the loopback interface up
# (BFCL eval()s model output, so protocol runs must not reach the network). Linux with unprivileged user
# namespaces and iproute2; elsewhere, or with ARTIFACT_ALLOW_NETWORK=1, the command runs unisolated with a warning
# (every run manifest records which it was).
#
#   scripts/isolate.sh COMMAND [ARG ...]
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: scripts/isolate.sh COMMAND [ARG ...]" >&2; exit 2; }

if [ -z "${ARTIFACT_ALLOW_NETWORK:-}" ] && command -v unshare >/dev/null 2>&1 && command -v ip >/dev/null 2>&1 \
   && unshare --user --map-root-user --net true 2>/dev/null; then
  exec unshare --user --map-root-user --net sh -c 'ip link set lo up && exec "$@"' isolate "$@"
fi
echo "warning: running without network isolation (unshare/ip unavailable or ARTIFACT_ALLOW_NETWORK set)" >&2
exec "$@"
