#!/usr/bin/env bash
# Run a command without network access: a new user + network namespace with only the loopback interface up
# (BFCL eval()s model output, so protocol runs must not reach the network). Needs Linux with unprivileged user
# namespaces (util-linux `unshare`); loopback is brought up with `ip` where it exists, else with one ioctl from
# Python (hosts without iproute2). Elsewhere, or with ARTIFACT_ALLOW_NETWORK=1, the command runs unisolated with a
# warning (every run manifest records which it was, and `check` flags such runs).
# ARTIFACT_FORWARD="127.0.0.1:8080 ..." relays exactly these loopback servers of the host into the isolation (the
# namespace's loopback is its own): a run against servers the user started (engine endpoint) reaches them, and
# nothing else (scripts/relay.py; the manifest records them as isolation.forwarded). Only loopback addresses.
#
#   scripts/isolate.sh COMMAND [ARG ...]
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: scripts/isolate.sh COMMAND [ARG ...]" >&2; exit 2; }
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# SIOCGIFFLAGS / SIOCSIFFLAGS on "lo" with IFF_UP set: what `ip link set lo up` does.
lo_up='import fcntl, socket, struct
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
name, flags = struct.unpack("16sH", fcntl.ioctl(s, 0x8913, struct.pack("16sH", b"lo", 0))[:18])
fcntl.ioctl(s, 0x8914, struct.pack("16sH", b"lo", flags | 1))'
py=$(command -v python3 || command -v python || true)

if [ -z "${ARTIFACT_ALLOW_NETWORK:-}" ] && command -v unshare >/dev/null 2>&1 \
   && unshare --user --map-root-user --net true 2>/dev/null; then
  outer=()
  if [ -n "${ARTIFACT_FORWARD:-}" ]; then
    [ -n "$py" ] || { echo "error: relaying ARTIFACT_FORWARD into the isolation needs python3" >&2; exit 2; }
    relay_dir=$(mktemp -d "${TMPDIR:-/tmp}/artifact-relay.XXXXXX")
    outer=("$py" -I "$here/relay.py" outer "$relay_dir" "$ARTIFACT_FORWARD" --)
    set -- "$py" -I "$here/relay.py" inner "$relay_dir" "$ARTIFACT_FORWARD" -- "$@"
  fi
  if command -v ip >/dev/null 2>&1; then
    exec ${outer[@]+"${outer[@]}"} unshare --user --map-root-user --net sh -c 'ip link set lo up && exec "$@"' isolate "$@"
  elif [ -n "$py" ]; then
    exec ${outer[@]+"${outer[@]}"} unshare --user --map-root-user --net \
      sh -c '"$0" -I -c "$1" && shift && exec "$@"' "$py" "$lo_up" "$@"
  fi
fi
echo "warning: running without network isolation (no user namespaces, or ARTIFACT_ALLOW_NETWORK set)" >&2
exec "$@"
