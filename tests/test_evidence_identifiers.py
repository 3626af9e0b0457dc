"""What the committed evidence says of the machines it ran on: never a raw hardware identifier (records carry
`host.gpu_uuid_sha256`, `machine_id_sha256`, `boot_id_sha256`: keyed digests; logs inside the archives included),
never the recording machine's own folders on a page check writes, and every manifest's configuration file one of
this checkout, directly or through configs/renamed.toml."""

from __future__ import annotations

import json
import re
import subprocess
import tarfile
from pathlib import Path

import pytest

from artifact.config import REPO, current_config_path, renamed_configs
from artifact.report.shown import shown_path

EVIDENCE = REPO / "evidence"
# a GPU's or MIG instance's UUID as nvidia-smi and the MPS daemon print it, and a serial number line of nvidia-smi -q
RAW_IDS = re.compile(
    rb"(?:GPU|MIG)-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|Serial Number\s*:\s*\d{6,}", re.I
)
ARCHIVES = (".tar.gz", ".tar.xz", ".tgz")


def tracked(folder: Path) -> list[Path]:
    out = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", str(folder)], capture_output=True, check=True)
    return [REPO / p for p in out.stdout.decode().split("\0") if p]


def raw_ids(path: Path) -> list[str]:
    """Where a raw hardware identifier occurs in a file, or in any member of an archive."""
    found = []
    if path.name.endswith(ARCHIVES):
        with tarfile.open(path) as tar:
            for member in tar:
                if member.isfile() and RAW_IDS.search(tar.extractfile(member).read()):
                    found.append(f"{path.relative_to(REPO)}:{member.name}")
    elif RAW_IDS.search(path.read_bytes()):
        found.append(str(path.relative_to(REPO)))
    return found


def test_no_raw_hardware_identifier_in_the_evidence():
    """Every tracked file of evidence/, every member of its archives (session and MPS logs, records) included."""
    bad = [where for path in tracked(EVIDENCE) for where in raw_ids(path)]
    assert not bad, "raw hardware identifiers (digest them as provenance.digest_id does): " + ", ".join(bad)


def test_the_scan_catches_a_raw_uuid(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("Device NVIDIA H200 (uuid GPU-89f3caea-480a-b10a-b6d9-d56b5ee1dfb9) is associated\n")
    archive = tmp_path / "logs.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(log, arcname="mps/server.log")
    assert RAW_IDS.search(log.read_bytes())
    with tarfile.open(archive) as tar:
        assert RAW_IDS.search(tar.extractfile("mps/server.log").read())
    assert not RAW_IDS.search(b"Device NVIDIA H200 (uuid gpu_uuid_sha256:ba62d0070513) is associated")


def manifests() -> list[tuple[str, dict]]:
    out = []
    for archive in sorted(EVIDENCE.glob("*/*.tar.xz")):
        with tarfile.open(archive) as tar:
            for member in tar:
                if member.isfile() and member.name.endswith("/manifest.json"):
                    out.append((f"{archive.relative_to(REPO)}:{member.name}", json.load(tar.extractfile(member))))
    return out


def test_every_manifests_configuration_file_is_one_of_this_checkout():
    """A configuration renamed after a record named it is mapped by configs/renamed.toml to the file that now holds
    it, whose name is the manifest's configuration name."""
    found = manifests()
    assert len(found) > 100
    bad = []
    for where, m in found:
        now = current_config_path(str(m.get("config_path") or ""))
        if now is None or Path(now).stem != m["config"]:
            bad.append(f"{where}: {m.get('config_path')} -> {now} (config {m['config']})")
    assert not bad, "\n".join(bad)


def test_the_rename_table_maps_only_absent_paths_to_present_files():
    for old, new in renamed_configs().items():
        assert not (REPO / old).exists() and (REPO / new).is_file(), (old, new)


@pytest.mark.parametrize(
    "recorded, shown",
    [
        (
            "/srv/r/.venv-cuda/bin/llama-server -m /srv/r/models/derived/x.gguf",
            "…/.venv-cuda/bin/llama-server -m …/models/derived/x.gguf",
        ),
        ("/data/wt/i28/configs/qwen/cpu-q4_k_m.toml", "…/configs/qwen/cpu-q4_k_m.toml"),
        ("--compile-cache /srv/w/cache-bf16-bi --log /dev/null", "--compile-cache …/cache-bf16-bi --log /dev/null"),
        ("results/a/main/logs/server-on.log", "results/a/main/logs/server-on.log"),
    ],
)
def test_a_recorded_path_is_shown_without_the_recording_machines_folders(recorded, shown):
    assert shown_path(recorded) == shown


MACHINE_PATH = re.compile(r"(?<![\w.~-])/(?:work|home|tmp|root|opt|scratch|Users|mnt)/[\w.+-]+/")


def test_no_page_check_wrote_names_the_recording_machines_folders():
    """The committed reports show recorded paths as shown_path cuts them (the records keep them whole)."""
    bad = []
    for report in sorted(EVIDENCE.glob("*/check/report.html")):
        text = report.read_text(encoding="utf-8")
        # model output (the example's trajectories) may name any path; the provenance section is the records'
        provenance = text.split('id="provenance"', 1)[-1]
        bad += [f"{report.relative_to(REPO)}: {m}" for m in MACHINE_PATH.findall(provenance)[:3]]
    assert not bad, "\n".join(bad)
