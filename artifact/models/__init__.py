"""Model weights: where a configuration's model comes from, and its sha256 verified before every use.

hub.py      Hugging Face sources (`hf:`): pins, the lock file of hashes recorded on first fetch, the weights folder
derive.py   models made at set-up from pinned inputs (`derived:`): the embedded agent model's recipe, the Qwen series
pypi_parts.py  a GGUF joined from data files of PyPI distributions (`pypi-parts:`), fetched and pinned part by part
gguf_header.py  a GGUF's header (architecture, name, file type, chat template) read without loading tensors
sources/    the pypi-parts specs: every distribution, member and joined file pinned by sha256
train.py    how the agent model's adapter was trained (runs on a GPU machine; the adapter is committed)
recipes/    the recipes and the adapters they pin
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from artifact.config import REPO, Model
from artifact.models import hub as weights
from artifact.models.hub import sha256_file
from artifact.errors import ArtifactError


def locate(model: Model) -> Path:
    """The weights file named by `model.source` ("pypi:<dist>/<path in site-packages>", "path:<file>", "hf:..." (see
    artifact.models.hub), "pypi-parts:<name>" (artifact.models.pypi_parts: fetched by ./run.sh fetch) or
    "derived:<recipe>/<LEVEL>", made on first use (artifact.models.derive))."""
    kind, _, rest = model.source.partition(":")
    if kind == "hf":
        return weights.model_dir(model) / model.files[0].name
    if kind == "pypi-parts":
        from artifact.models import pypi_parts

        pypi_parts.check_pins(model.source, model.sha256)
        return pypi_parts.locate(model.source)
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
                            "engine loads its own weights (give a pypi:, path:, hf:, derived: or pypi-parts: source)")
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


def fetches_itself(model: Model) -> bool:
    """Sources that `./run.sh fetch` downloads through their own module (hf: has artifact.fetch's own path)."""
    from artifact.models import pypi_parts

    return pypi_parts.is_source(model.source)


def base_model(model: Model) -> Model | None:
    """The weights a derived model is made from (its recipe's base), as a model of its own; None otherwise."""
    if not model.source.startswith("derived:"):
        return None
    from artifact.models import derive

    base = derive.load_recipe(derive.parse_source(model.source)[0])["base"]
    return Model(family="", name="", quant="", source=base["source"], sha256=base["sha256"])


def self_fetching_inputs(model: Model) -> list[Model]:
    """The self-fetching sources a model needs: itself, or the base a derived model is made from."""
    if fetches_itself(model):
        return [model]
    base = base_model(model)
    return self_fetching_inputs(base) if base else []


def fetch_model(model: Model, root: Path | None = None) -> Path:
    """Download and verify a self-fetching source (see fetches_itself) into the weights directory."""
    from artifact.models import pypi_parts

    return pypi_parts.fetch(pypi_parts.check_pins(model.source, model.sha256), root)


def source_record(model: Model) -> dict:
    """What every manifest records beyond the configuration's model table: a derived model's recipe
    (`derivation`), a pypi-parts source's distributions, pins, header and chat template (`origin`)."""
    if model.source.startswith("derived:"):
        from artifact.models import derive

        return {"derivation": derive.describe(model.source)}
    from artifact.models import pypi_parts

    if pypi_parts.is_source(model.source):
        return {"origin": pypi_parts.describe(model.source)}
    return {}


@dataclass(frozen=True)
class WeightsFile:
    """One file a model needs, where the weights directory keeps it: what a staging command carries to a machine
    without network (it puts the file at `rel` under that machine's $ARTIFACT_WEIGHTS, which verifies it)."""
    path: Path  # here
    rel: str  # relative to the weights directory
    sha256: str
    size: int


def weights_files(model: Model, root: Path | None = None) -> list[WeightsFile]:
    """The fetched files of a model that live under the weights directory (hf: and pypi-parts: sources; a derived
    model's are its recipe's base's, the products being made where they are used). Empty for sources that live
    elsewhere (pypi: wheels, path: files): a staging command carries those its own way."""
    root = root or weights.weights_root()
    if weights.is_hf(model):
        d = weights.model_dir(model, root)
        return [WeightsFile(d / p.name, str(d.relative_to(root) / p.name), p.sha256, p.size)
                for p in weights.pins(model)]
    from artifact.models import pypi_parts

    if pypi_parts.is_source(model.source):
        spec = pypi_parts.check_pins(model.source, model.sha256)
        path = pypi_parts.target(spec, root)
        return [WeightsFile(path, str(path.relative_to(root)), spec["sha256"], int(spec["bytes"]))]
    base = base_model(model)
    return weights_files(base, root) if base else []
