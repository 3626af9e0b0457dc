"""Prerequisites of `./run.sh all`, each failing with one actionable line: the Docker daemon, the host's GPUs, and
the NVIDIA container runtime (probed for real: a container that asks for the GPU)."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

from artifact.errors import ArtifactError

NVIDIA_TOOLKIT = (
    "install the NVIDIA Container Toolkit (https://docs.nvidia.com/datacenter/cloud-native/"
    "container-toolkit/latest/install-guide.html), then `sudo nvidia-ctk runtime configure "
    "--runtime=docker && sudo systemctl restart docker`; or run the CPU variant with --cpu"
)


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    memory_mib: int
    driver: str

    @property
    def memory_gib(self) -> float:
        return self.memory_mib / 1024


def docker_client():
    """A client of a reachable Docker daemon."""
    try:
        import docker
    except ImportError:
        raise ArtifactError("the Python package 'docker' is missing: run ./run.sh setup") from None
    try:
        client = docker.from_env(timeout=600)
        client.ping()
    except Exception as exc:  # DockerException: socket missing, permission denied, daemon down
        reason = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
        raise ArtifactError(
            f"cannot reach the Docker daemon ({reason}): start it (`sudo systemctl start docker`) "
            "and make sure your user may use it (the `docker` group), or set DOCKER_HOST"
        ) from None
    return client


def parse_nvidia_smi(text: str) -> list[Gpu]:
    gpus = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 4 and parts[0].isdigit():
            mem = parts[2].split()[0]
            gpus.append(Gpu(int(parts[0]), parts[1], int(mem) if mem.isdigit() else 0, parts[3]))
    return gpus


def host_gpus() -> list[Gpu]:
    if not shutil.which("nvidia-smi"):
        raise ArtifactError(
            "no NVIDIA driver found (nvidia-smi is not on PATH): install the driver (>= 560 for "
            "CUDA 12.6), or run the CPU variant with --cpu"
        )
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,name,memory.total,driver_version", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
    except (subprocess.SubprocessError, OSError) as exc:
        raise ArtifactError(f"nvidia-smi failed ({type(exc).__name__}): check the NVIDIA driver") from None
    gpus = parse_nvidia_smi(out)
    if not gpus:
        raise ArtifactError("nvidia-smi lists no GPU: check the NVIDIA driver, or run the CPU variant with --cpu")
    return gpus


def select_gpus(gpus: list[Gpu], wanted: str | None) -> list[Gpu]:
    if not wanted:
        return gpus
    try:
        ids = [int(x) for x in wanted.split(",") if x.strip()]
    except ValueError:
        raise ArtifactError(f"--gpus {wanted!r}: expected GPU indices such as 0,2") from None
    known = {g.index: g for g in gpus}
    bad = [i for i in ids if i not in known]
    if bad or not ids:
        raise ArtifactError(
            f"--gpus {wanted}: no GPU {bad[0] if bad else ''} on this host "
            f"(nvidia-smi lists {', '.join(str(g.index) for g in gpus)})"
        )
    return [known[i] for i in dict.fromkeys(ids)]


def gpu_request(device_ids: list[str]):
    import docker

    return [docker.types.DeviceRequest(device_ids=device_ids, capabilities=[["gpu"]])]


def is_gpu_runtime_error(exc: Exception) -> bool:
    text = str(getattr(exc, "explanation", "") or exc)
    return (
        "could not select device driver" in text
        or "nvidia-container-cli" in text
        or "unknown or invalid runtime name: nvidia" in text
    )


def gpu_runtime_error(exc: Exception) -> ArtifactError:
    text = str(getattr(exc, "explanation", "") or exc).splitlines()[0][:160]
    return ArtifactError(f"Docker cannot give a container a GPU ({text}): {NVIDIA_TOOLKIT}")


def probe_gpu_runtime(client, image: str, device_id: str) -> None:
    """Start a container that asks for one GPU; the NVIDIA runtime missing is one actionable line. The container is
    removed whatever happens (a failed start leaves it in state 'created')."""
    import docker

    container = None
    try:
        container = client.containers.create(
            image, entrypoint=["true"], network_mode="none", device_requests=gpu_request([device_id])
        )
        container.start()
        container.wait(timeout=120)
    except docker.errors.APIError as exc:
        if is_gpu_runtime_error(exc):
            raise gpu_runtime_error(exc) from None
        raise ArtifactError(f"a GPU test container failed to start: {str(exc.explanation or exc)[:200]}") from None
    finally:
        if container is not None:
            try:
                container.remove(force=True)
            except docker.errors.APIError:
                pass
