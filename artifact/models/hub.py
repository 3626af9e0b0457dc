"""Hugging Face weights (`model.source = "hf:<owner>/<repo>"`): where they live, what they must hash to.

Files live under the weights directory (`$ARTIFACT_WEIGHTS`, default `<repo>/weights`) as
`<owner>/<repo>/<revision>/<file>`; `./run.sh all` mounts that directory read-only into every container. Each file is
pinned by the configuration (`model.files`: size and sha256) or, where no public hash exists (the vLLM safetensors),
by the lock file `configs/weights.lock.json`, which the first fetch writes with the sha256 of the downloaded bytes.
Nothing is used before its pin is checked.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from artifact.config import CONFIG_DIR, REPO, Model
from artifact.errors import ArtifactError

LOCK_FILE = CONFIG_DIR / "weights.lock.json"


def lock_path() -> Path:
    """The lock file (ARTIFACT_WEIGHTS_LOCK overrides it, e.g. for tests)."""
    return Path(os.environ.get("ARTIFACT_WEIGHTS_LOCK") or LOCK_FILE)


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def weights_root() -> Path:
    return Path(os.environ.get("ARTIFACT_WEIGHTS") or REPO / "weights")


def is_hf(model: Model) -> bool:
    return model.source.startswith("hf:")


def repo_id(model: Model) -> str:
    return model.source[3:]


def model_dir(model: Model, root: Path | None = None) -> Path:
    return (root or weights_root()) / repo_id(model) / model.revision


def lock_key(model: Model) -> str:
    return f"{repo_id(model)}@{model.revision}"


def read_lock(path: Path | None = None) -> dict:
    path = path or lock_path()
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"{path}: unreadable lock file ({exc}); restore it from git or delete it") from None
    if not isinstance(data, dict):
        raise ArtifactError(f"{path}: expected a JSON object")
    return data


def write_lock(data: dict, path: Path | None = None) -> None:
    path = path or lock_path()
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)


@dataclass(frozen=True)
class Pin:
    name: str
    size: int  # 0 = unknown
    sha256: str  # "" = not pinned yet (first fetch records it)
    origin: str  # "config", "lock" or "none"


def pins(model: Model, lock: dict | None = None) -> list[Pin]:
    """Every file of the model with its pin: the configuration's, else the lock file's."""
    locked = (read_lock() if lock is None else lock).get(lock_key(model), {})
    out = []
    for f in model.files:
        entry = locked.get(f.name, {})
        if f.sha256:
            out.append(Pin(f.name, f.size, f.sha256, "config"))
        elif entry.get("sha256"):
            out.append(Pin(f.name, f.size or int(entry.get("size", 0)), entry["sha256"], "lock"))
        else:
            out.append(Pin(f.name, f.size, "", "none"))
    return out


def check_file(path: Path, pin: Pin) -> str | None:
    """None if `path` matches its pin, else what is wrong (one line)."""
    if not path.is_file():
        return f"{path} is missing"
    size = path.stat().st_size
    if pin.size and size != pin.size:
        return f"{path} has {size} bytes, the pin says {pin.size}"
    digest = sha256_file(path)
    if digest != pin.sha256:
        return f"{path} has sha256 {digest[:16]}…, the pin ({pin.origin}) says {pin.sha256[:16]}…"
    return None


def verified_hf_weights(model: Model) -> Path:
    """Check every file of an hf: model against its pin; returns what the engine loads (the first file; for a
    multi-file checkpoint such as safetensors, the engine takes its directory)."""
    for pin in pins(model):
        if not pin.sha256:
            raise ArtifactError(f"{lock_key(model)}/{pin.name} has no recorded sha256 yet: run ./run.sh fetch first")
        problem = check_file(model_dir(model) / pin.name, pin)
        if problem:
            raise ArtifactError(f"{problem}: run ./run.sh fetch (it downloads missing files and verifies them)")
    return model_dir(model) / model.files[0].name
