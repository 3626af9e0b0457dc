"""Relay named host loopback ports into the protocol's network isolation (scripts/isolate.sh; standard library only).

A run is isolated in a network namespace of its own, whose loopback is not the host's: a server the user started on
the host's 127.0.0.1:8080 cannot be reached from inside. With ARTIFACT_FORWARD="127.0.0.1:8080 ...", isolate.sh runs

    relay.py outer DIR ADDRS -- unshare ... relay.py inner DIR ADDRS -- COMMAND ...

`outer` (on the host's network) accepts on a Unix socket per address in DIR (a private folder: file system paths
reach across network namespaces) and connects each connection to that host:port; `inner` (inside the isolation)
listens on the same host:port of the isolation's loopback, relays each connection to its Unix socket, and runs
COMMAND with ARTIFACT_FORWARDED set to the addresses (the run's manifest records them, isolation.forwarded). Each
exits when its child does, with its exit code. Only loopback addresses are accepted: nothing else of the network
becomes reachable.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import signal
import subprocess
import sys
import threading


def parse(addrs: str) -> list[tuple[str, int]]:
    out = []
    for addr in addrs.split():
        host, _, port = addr.rpartition(":")
        host = host.strip("[]")
        try:
            if not ipaddress.ip_address(host).is_loopback or not 0 < int(port) < 65536:
                raise ValueError
        except ValueError:
            sys.exit(f"relay: {addr!r} is not a loopback host:port; only loopback servers are relayed")
        out.append((host, int(port)))
    return out


def sock_path(folder: str, host: str, port: int) -> str:
    return os.path.join(folder, f"{host.replace(':', '_')}_{port}.sock")


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        try:
            writer.close()
        except OSError:
            pass


def handler(connect):
    async def handle(reader, writer):
        try:
            r2, w2 = await connect()
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, w2), pipe(r2, writer))

    return handle


async def serve(mode: str, folder: str, addrs: list[tuple[str, int]], ready: threading.Event, errors: list) -> None:
    try:
        servers = await listen(mode, folder, addrs)
    except OSError as exc:
        errors.append(exc)
        ready.set()
        return
    ready.set()
    await asyncio.gather(*(s.serve_forever() for s in servers))


async def listen(mode: str, folder: str, addrs: list[tuple[str, int]]) -> list:
    servers = []
    for host, port in addrs:
        path = sock_path(folder, host, port)
        if mode == "outer":
            servers.append(
                await asyncio.start_unix_server(
                    handler(lambda h=host, p=port: asyncio.open_connection(h, p)), path=path
                )
            )
        else:
            servers.append(
                await asyncio.start_server(
                    handler(lambda s=path: asyncio.open_unix_connection(s)), host=host, port=port
                )
            )
    return servers


def main(argv: list[str]) -> int:
    if len(argv) < 5 or argv[0] not in ("outer", "inner") or argv[3] != "--":
        sys.exit("usage: relay.py outer|inner DIR 'HOST:PORT ...' -- COMMAND [ARG ...]")
    mode, folder, command = argv[0], argv[1], argv[4:]
    try:
        addrs = parse(argv[2])
    except SystemExit:
        if mode == "outer":
            cleanup(folder, [])
        raise
    ready, errors = threading.Event(), []
    loop = asyncio.new_event_loop()
    thread = threading.Thread(
        target=lambda: loop.run_until_complete(serve(mode, folder, addrs, ready, errors)), daemon=True
    )
    thread.start()
    if not ready.wait(30) or errors:
        sys.exit(f"relay: cannot listen for {argv[2]} ({errors[0] if errors else 'timeout'})")
    env = dict(os.environ)
    if mode == "inner":
        env["ARTIFACT_FORWARDED"] = " ".join(f"{h}:{p}" for h, p in addrs)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the child (same process group); we wait for it
    child = subprocess.Popen(command, env=env)
    signal.signal(signal.SIGTERM, lambda *_: child.send_signal(signal.SIGTERM))
    code = child.wait()
    if mode == "outer":
        cleanup(folder, addrs)
    return code if code >= 0 else 128 - code


def cleanup(folder: str, addrs: list[tuple[str, int]]) -> None:
    """The outer relay's sockets and their folder (isolate.sh made it for this run)."""
    for host, port in addrs:
        try:
            os.unlink(sock_path(folder, host, port))
        except OSError:
            pass
    try:
        os.rmdir(folder)
    except OSError:
        pass


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
