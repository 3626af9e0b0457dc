"""The committed evidence as result sets for tests: an evidence folder's records (and its runs' server logs)
unpacked as `./run.sh check evidence/NAME` unpacks them, to be checked as they are (the control) or tampered with."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

from artifact.cli import EVIDENCE_ARCHIVES, EVIDENCE_LOGS, server_log_member, unpack_evidence
from artifact.config import REPO
from artifact.provenance import fingerprint


def unpack(name: str, dest: Path) -> Path:
    """evidence/NAME's runs unpacked under `dest` (with their server logs); the folder that holds them."""
    folder = REPO / "evidence" / name
    dest.mkdir(parents=True, exist_ok=True)
    for archive in sorted(folder.glob(EVIDENCE_ARCHIVES)):
        unpack_evidence(archive, str(dest))
    tops = {p.name for p in dest.iterdir()}
    for archive in sorted(folder.glob(EVIDENCE_LOGS)):
        unpack_evidence(archive, str(dest), server_log_member(tops))
    return dest / "results" if (dest / "results").is_dir() else dest


def runs(results: Path) -> dict[str, Path]:
    """'<arm>-run<k>' (or '<config>/<plan>/<arm>-run<k>' where two share that name) -> the run's directory."""
    found = sorted(p.parent for p in results.rglob("manifest.json"))
    names = [p.name for p in found]
    return {(p.name if names.count(p.name) == 1 else str(p.relative_to(results))): p for p in found}


def edit_manifest(run_dir: Path, change, refingerprint: bool = False) -> None:
    """Change a run's manifest in place (`change(manifest)`); `refingerprint`: its pairing fingerprint made again from
    its (changed) pairing inputs, as a careful editor would."""
    path = run_dir / "manifest.json"
    m = json.loads(path.read_text())
    change(m)
    if refingerprint:
        m["pairing_fingerprint"] = fingerprint(m["pairing_inputs"])
    path.write_text(json.dumps(m, indent=2, sort_keys=True) + "\n")


def edit_requests(run_dir: Path, change) -> None:
    """Change a run's request records in place (`change(list of records)`), written back one JSON object a line."""
    path = run_dir / "requests.jsonl"
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    change(recs)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs))


def repack(results: Path, folder: Path) -> Path:
    """An evidence folder holding `results` as its records.tar.xz (the shape `check evidence/NAME` reads)."""
    folder.mkdir(parents=True, exist_ok=True)
    with tarfile.open(folder / "records.tar.xz", "w:xz") as tar:
        tar.add(results, arcname="results")
    return folder
