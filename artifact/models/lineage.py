"""Which model a weights digest is a level of: the lineage that makes quantization levels one series (RQ3's
series, the quantization mechanism's F16 reference), read from the artifact's own pins, never from a name a run's
manifest carries.

    of_digests(digests)   the lineage of weights with these sha256 (one digest; for hf: sources every file's, in
                          order), or None where the pins cannot decide

  recipe <name>            the digest is a product of recipe <name> (artifact/models/recipes/<name>.json pins every
                           product: its levels are made from one base and one adapter). A product named base-* is
                           an intermediate (the base's own weights, dequantized): the base's, not a level of the
                           derived model, so it is looked up among the configurations instead.
  config <family> / <name> the digest is pinned (model.sha256, or every file of model.files for hf:) by the
                           configurations under configs/, and they all name one model: the levels the artifact's
                           authors pinned as one model's.
  None                     no recipe or configuration pins the digest, or configurations pin it for two models.

The pins are this checkout's files (as the recipe pins `check.facts.model_problem` holds a derived model to), so a
results directory cannot change them; the names in them are the catalog's, read only through a digest.
"""

from __future__ import annotations

import functools
import json

from artifact.config import CONFIG_DIR, PLANS_FILE, config_tables
from artifact.errors import ArtifactError
from artifact.models.derive import RECIPES

INTERMEDIATE = "base-"  # a recipe's products named so are its base's weights, not a level of the derived model


@functools.lru_cache(maxsize=1)
def _recipe_products() -> tuple[tuple[str, str, str], ...]:
    """(recipe name, level, sha256) of every level a recipe pins (its base-* intermediates left out)."""
    out = []
    for path in sorted(RECIPES.glob("*.json")):
        try:
            recipe = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # a broken recipe pins nothing (derive says why where it is used)
        products = recipe.get("products") if isinstance(recipe, dict) else None
        for level, sha in (products or {}).items():
            if isinstance(sha, str) and sha and not level.startswith(INTERMEDIATE):
                out.append((str(recipe.get("name") or path.stem), level, sha))
    return tuple(out)


def _pinned(model: dict) -> tuple[str, ...]:
    """The digests a configuration's [model] table pins: its sha256, else every file's (hf:), in order; () where it
    pins none (a server's weights, or an hf: file whose sha256 is left to the lock file)."""
    if isinstance(model.get("sha256"), str) and model["sha256"]:
        return (model["sha256"],)
    files = model.get("files")
    shas = tuple(f.get("sha256") for f in files if isinstance(f, dict)) if isinstance(files, list) else ()
    return shas if shas and all(isinstance(s, str) and s for s in shas) else ()


@functools.lru_cache(maxsize=1)
def _config_pins() -> tuple[tuple[tuple[str, ...], dict], ...]:
    """(digests, [model] table) of every configuration under configs/ that pins its weights."""
    out = []
    for path in sorted(CONFIG_DIR.rglob("*.toml")):
        if path == PLANS_FILE:
            continue
        try:
            model = config_tables(path).get("model")
        except ArtifactError:
            continue
        if isinstance(model, dict) and (digests := _pinned(model)):
            out.append((digests, model))
    return tuple(out)


def _agreed(pairs) -> dict:
    """key -> value over (key, value) pairs; None where two pairs give one key different values."""
    out: dict = {}
    for key, value in pairs:
        out[key] = value if out.get(key, value) == value else None
    return out


@functools.lru_cache(maxsize=1)
def _recipes() -> dict[tuple[str, ...], str]:
    """(digest,) -> "recipe <name>", for every level a recipe pins."""
    return {(sha,): f"recipe {name}" for name, _, sha in _recipe_products()}


@functools.lru_cache(maxsize=1)
def _configs() -> dict[tuple[str, ...], str | None]:
    """digests -> "config <family> / <name>" of the configurations that pin them (None where two name different
    models)."""
    return _agreed((d, f"config {m.get('family')} / {m.get('name')}") for d, m in _config_pins())


def of_digests(digests: tuple[str, ...]) -> str | None:
    """The lineage of weights with these digests (see the module's doc), or None where the pins cannot decide."""
    if not digests:
        return None
    return _recipes().get(digests) or _configs().get(digests)


def _level(name: str) -> str:
    """A level's quantization label: the part after "-as-" of a kernel twin's level (its weights' format)."""
    return name.rsplit("-as-", 1)[-1].upper()


@functools.lru_cache(maxsize=1)
def _levels() -> dict[tuple[str, ...], str | None]:
    """digests -> the quantization level the artifact's pins give them: a recipe's product name (it decides over a
    configuration's label), else the `quant` of every configuration that pins them (None where two disagree)."""
    configs = _agreed((d, _level(m["quant"])) for d, m in _config_pins() if isinstance(m.get("quant"), str))
    return {**configs, **{(sha,): _level(level) for _, level, sha in _recipe_products()}}


def level_of(digests: tuple[str, ...]) -> str | None:
    """The quantization level (upper case) the artifact's pins give weights with these digests, or None where no pin,
    or two disagreeing pins, decide: a run's `model.quant` is held to it at admission (`check.facts.model_problem`),
    so RQ3's trend and the quantization analyses place a run by its weights, not by its label."""
    return _levels().get(digests) if digests else None


def pinned_levels(digests: tuple[str, ...]) -> list[str]:
    """Every level (upper case) a recipe or a configuration of this checkout pins weights with these digests at, in
    order: one where the pins agree (`level_of`), several where they do not."""
    found = [_level(level) for _, level, sha in _recipe_products() if (sha,) == digests]
    found += [_level(m["quant"]) for d, m in _config_pins() if d == digests and isinstance(m.get("quant"), str)]
    return sorted(set(found))


@functools.lru_cache(maxsize=1)
def _config_models() -> dict[tuple[str, ...], tuple[str, str] | None]:
    """digests -> (family, name) of the configurations that pin them (None where two name different models)."""
    return _agreed((d, (str(m.get("family") or ""), str(m.get("name") or ""))) for d, m in _config_pins())


def pinned_model(digests: tuple[str, ...]) -> tuple[str, str] | None:
    """(family, name) of the model this checkout's configurations pin these weights as (the paper's configurations:
    configs/paper/), or None where none, or two that disagree, do: which of the paper's configurations a run is,
    read from its weights, never from the name its manifest carries."""
    return _config_models().get(digests) if digests else None
