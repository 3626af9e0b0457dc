"""Every manifest's `host` tells machines apart without naming them: the machine-id, this boot's id and each GPU's
UUID, digested (HMAC-SHA256 keyed with the artifact's name, 12 hex digits), never raw; and `compare` says when two
runs' machines differ. The identifiers are real files here; the GPUs come from a FAKE nvidia-smi (no GPU here)."""

import json
import os
from pathlib import Path

from artifact import provenance
from artifact.analysis.compare import provenance_differences
from synthetic_runs import write_bfcl_run

UUIDS = ["GPU-6f1c2a4e-0d3b-4b1e-9a57-2c1f0e8d7b61", "GPU-b3e5d9c0-7a21-4f6e-8d43-91ae5c0f2d18"]


def fake_nvidia_smi(bin_dir: Path, uuids: list[str]) -> str:
    """A FAKE nvidia-smi answering provenance's query (name, driver, memory, compute capability, uuid)."""
    bin_dir.mkdir()
    rows = "\n".join(f"NVIDIA H200, 580.159.04, 143771 MiB, 9.0, {u}" for u in uuids)
    (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\ncat <<'EOF'\n{rows}\nEOF\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    return f"{bin_dir}:{os.environ['PATH']}"


def identities(tmp_path: Path, monkeypatch, machine: str, boot: str, uuids: list[str], name: str) -> dict:
    (tmp_path / f"{name}-machine-id").write_text(machine + "\n")
    (tmp_path / f"{name}-boot-id").write_text(boot + "\n")
    monkeypatch.setattr(
        provenance, "MACHINE_ID_FILES", (str(tmp_path / "absent"), str(tmp_path / f"{name}-machine-id"))
    )
    monkeypatch.setattr(provenance, "BOOT_ID_FILE", str(tmp_path / f"{name}-boot-id"))
    monkeypatch.setenv("PATH", fake_nvidia_smi(tmp_path / f"{name}-bin", uuids))
    return provenance.host()


def test_host_digests_tell_machines_apart_and_never_hold_the_raw_identifiers(tmp_path, monkeypatch):
    a = identities(
        tmp_path, monkeypatch, "0f3c9e1b6a2d4c8e9b7a5f3e1d2c4b6a", "5d0a8c4e-1b2f-4a6d-9e3c-7f8b0a1c2d3e", UUIDS, "a"
    )
    b = identities(
        tmp_path,
        monkeypatch,
        "0f3c9e1b6a2d4c8e9b7a5f3e1d2c4b6a",
        "c1e2d3f4-a5b6-4c7d-8e9f-0a1b2c3d4e5f",
        UUIDS[::-1],
        "b",
    )
    for h in (a, b):
        for key in ("machine_id_sha256", "boot_id_sha256"):
            assert len(h[key]) == 12 and int(h[key], 16) >= 0
        assert len(h["gpu_uuid_sha256"]) == 2 and all(len(d) == 12 for d in h["gpu_uuid_sha256"])
        assert h["gpus"][0] == {
            "name": "NVIDIA H200",
            "driver": "580.159.04",
            "memory": "143771 MiB",
            "compute_capability": "9.0",
        }  # as before: the uuid is not in `gpus`
        text = json.dumps(h)
        assert not any(raw in text for raw in UUIDS + ["0f3c9e1b6a2d4c8e9b7a5f3e1d2c4b6a", "5d0a8c4e", "c1e2d3f4"])
    # the same image (machine-id), another boot, the same GPUs in another order
    assert a["machine_id_sha256"] == b["machine_id_sha256"] and a["boot_id_sha256"] != b["boot_id_sha256"]
    assert a["gpu_uuid_sha256"] == b["gpu_uuid_sha256"][::-1] and len(set(a["gpu_uuid_sha256"])) == 2
    assert a["gpu_uuid_sha256"][0] == provenance.digest_id(UUIDS[0]) != provenance.digest_id(UUIDS[1])
    # no machine-id file, no nvidia-smi: recorded as unknown, not invented
    monkeypatch.setattr(provenance, "MACHINE_ID_FILES", (str(tmp_path / "absent"),))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    h = provenance.host()
    assert h["machine_id_sha256"] is None and h["gpu_uuid_sha256"] == [] and h["gpus"] == []


def test_host_records_how_the_gpu_was_shared_as_the_orchestrator_said(monkeypatch):
    monkeypatch.delenv("ARTIFACT_GPU_SHARING", raising=False)
    assert provenance.host()["gpu_sharing"] is None  # not started by `all --native`
    share = {"mode": "CUDA MPS", "jobs_per_gpu": 6, "slot": "gpu0.3", "gpus": ["0"]}
    monkeypatch.setenv("ARTIFACT_GPU_SHARING", json.dumps(share))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    h = provenance.host()
    assert h["gpu_sharing"] == share and h["cuda_visible_devices"] == "0"
    monkeypatch.setenv("ARTIFACT_GPU_SHARING", "{not json")
    assert provenance.host()["gpu_sharing"] == {"error": "ARTIFACT_GPU_SHARING is not JSON"}


def test_compare_says_when_the_machines_or_the_sharing_differ(tmp_path):
    base = {
        "cpu": "Test CPU",
        "cpu_count": 2,
        "gpus": [],
        "os": "Linux-test",
        "python": "3.11",
        "hostname_sha256": "5bce98f73f3e",
    }
    one = {
        **base,
        "machine_id_sha256": "aaaaaaaaaaaa",
        "boot_id_sha256": "bbbbbbbbbbbb",
        "gpu_uuid_sha256": ["c" * 12],
        "gpu_sharing": {"mode": "CUDA MPS", "jobs_per_gpu": 6, "slot": "gpu0.1"},
    }
    two = {**one, "boot_id_sha256": "dddddddddddd", "gpu_sharing": {"mode": "one job per GPU", "jobs_per_gpu": 1}}
    runs = [
        write_bfcl_run(tmp_path / name, "off", 1, {"e0": [[1, 2]]}, manifest={"host": h})
        for name, h in (("a", one), ("b", two), ("old", base))
    ]
    diff = provenance_differences(runs[0], runs[1])
    assert "boot (digest): 'bbbbbbbbbbbb' vs 'dddddddddddd'" in diff
    assert "GPU sharing: CUDA MPS/6 vs one job per GPU/1" in diff
    assert not any("machine-id" in d or "GPU UUID" in d for d in diff)  # the same image and GPU
    # a record from before these fields (the committed evidence): nothing claimed either way
    assert not any("digest" in d or "sharing" in d for d in provenance_differences(runs[0], runs[2]))
