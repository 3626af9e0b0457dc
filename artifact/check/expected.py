"""The paper's reported values (expected/paper.toml), validated.

`load_expected()` returns {key: entry}; each entry is the [[value]] table with the
defaults filled in (reported = True, approximate = False). `load_document()` also
returns [meta], the [[config]] list and the [claim.ID] tables (what a claim reads of the paper). Any schema problem raises ArtifactError
with a one-line message naming the file and the key.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from artifact.errors import ArtifactError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 only
    import tomli as tomllib

DEFAULT_PATH = Path(__file__).resolve().parents[2] / "expected" / "paper.toml"

UNITS = {"fraction", "count", "index", "z", "p_value", "percentage_points", "ratio", "MiB"}
COMPARISONS = {
    "off_rerun",
    "on_rerun",
    "on_rerun_cram0",
    "on_vs_off",
    "on_vs_off_within_run",
    "cold_vs_warm",
    "cold_rerun",
    "warm_rerun",
}
NUMBER = (int, float)
META_FIELDS = {
    "title": str,
    "summary_title": str,
    "transcribed_from": str,
    "gpu": str,
    "os": str,
    "cuda": str,
    "llama_cpp_build": str,
    "llama_cpp_commit": str,
    "vllm": str,
    "torch": str,
    "transformers": str,
    "episodes": int,
    "seed": int,
    "decoding": str,
    "batch_size": int,
    "kv_cache_precision": str,
    "workload": str,
    "configurations": int,
}
CONFIG_REQUIRED = {"id": str, "engine": str, "quant": str, "engine_stated": bool}
CONFIG_OPTIONAL = {"model": str, "note": str}
CLAIM_OPTIONAL = {"server_family": str, "context": list}
VALUE_REQUIRED = {"key": str, "unit": str, "source": str, "quote": str}
VALUE_OPTIONAL = {
    "value": NUMBER,
    "reported": bool,
    "config": str,
    "quant": str,
    "comparison": str,
    "k": int,
    "n": int,
    "approximate": bool,
    "note": str,
}


def _check_table(path: Path, where: str, table: Any, required: dict[str, Any], optional: dict[str, Any]) -> None:
    if not isinstance(table, dict):
        raise ArtifactError(f"{path}: {where}: expected a table")
    for name in table:
        if name not in required and name not in optional:
            raise ArtifactError(f"{path}: {where}: unknown field '{name}'")
    for name in required:
        if name not in table:
            raise ArtifactError(f"{path}: {where}: missing field '{name}'")
    for name, val in table.items():
        kind = required.get(name) or optional[name]
        # bool is an int subclass: never accept it for a number or a count
        if (isinstance(val, bool) and kind is not bool) or not isinstance(val, kind):
            raise ArtifactError(f"{path}: {where}: field '{name}' has the wrong type ({type(val).__name__})")


def _check_value(path: Path, entry: dict[str, Any], config_ids: set[str]) -> dict[str, Any]:
    where = f"value '{entry.get('key', '?')}'"
    _check_table(path, where, entry, VALUE_REQUIRED, VALUE_OPTIONAL)
    out = {"reported": True, "approximate": False, **entry}
    if out["reported"] and "value" not in out:
        raise ArtifactError(f"{path}: {where}: missing field 'value' (or set reported = false)")
    if not out["reported"] and "value" in out:
        raise ArtifactError(f"{path}: {where}: has a 'value' but reported = false")
    if out["unit"] not in UNITS:
        raise ArtifactError(f"{path}: {where}: unknown unit '{out['unit']}'")
    if "comparison" in out and out["comparison"] not in COMPARISONS:
        raise ArtifactError(f"{path}: {where}: unknown comparison '{out['comparison']}'")
    cfg = out.get("config")
    if cfg is not None and cfg not in config_ids and not any(c.startswith(cfg + "/") for c in config_ids):
        raise ArtifactError(f"{path}: {where}: config '{cfg}' is not a [[config]] id or a prefix of one")
    if "k" in out and not 0 <= out["k"] <= out.get("n", out["k"]):
        raise ArtifactError(f"{path}: {where}: needs 0 <= k <= n")
    return out


def load_document(path: str | Path | None = None) -> dict[str, Any]:
    """Read and validate the file; return {"meta": {...}, "config": [...], "value": {key: entry}}."""
    path = Path(path) if path is not None else DEFAULT_PATH
    try:
        with path.open("rb") as fh:
            doc = tomllib.load(fh)
    except OSError as exc:
        raise ArtifactError(f"{path}: cannot read expected values ({exc.strerror})") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ArtifactError(f"{path}: invalid TOML: {exc}") from exc

    _check_table(path, "top level", doc, {"meta": dict, "config": list, "value": list}, {"claim": dict})
    _check_table(path, "[meta]", doc["meta"], META_FIELDS, {})
    config_ids: set[str] = set()
    for cfg in doc["config"]:
        _check_table(path, f"config '{cfg.get('id', '?')}'", cfg, CONFIG_REQUIRED, CONFIG_OPTIONAL)
        if cfg["id"] in config_ids:
            raise ArtifactError(f"{path}: config '{cfg['id']}': duplicate id")
        config_ids.add(cfg["id"])
    if len(config_ids) != doc["meta"]["configurations"]:
        raise ArtifactError(
            f"{path}: [meta]: configurations = {doc['meta']['configurations']} but {len(config_ids)} [[config]] tables"
        )
    values: dict[str, dict[str, Any]] = {}
    for entry in doc["value"]:
        checked = _check_value(path, entry, config_ids)
        if checked["key"] in values:
            raise ArtifactError(f"{path}: value '{checked['key']}': duplicate key")
        values[checked["key"]] = checked
    claims = doc.get("claim", {})
    for cid, table in claims.items():
        _check_table(path, f"[claim.{cid}]", table, {}, CLAIM_OPTIONAL)
        for key in table.get("context", []):
            if key not in values:
                raise ArtifactError(f"{path}: [claim.{cid}]: context '{key}' is not a [[value]] key")
    return {"meta": doc["meta"], "config": doc["config"], "value": values, "claim": claims}


def load_expected(path: str | Path | None = None) -> dict[str, dict[str, Any]]:
    """The [[value]] entries of expected/paper.toml (or ``path``), keyed by `key`."""
    values: dict[str, dict[str, Any]] = load_document(path)["value"]
    return values
