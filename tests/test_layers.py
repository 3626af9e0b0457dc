"""The artifact's layers (docs/developer.md, "The folder map"): every import of one artifact module by another points down this map
or stays inside its package, no modules import each other in a cycle, and an import inside a function (a lazy import,
kept only for start-up time) points down and says why in a comment on its line or the line above."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "artifact"

# Low to high. A module may import what is on its own row (the same package) or below it.
LAYERS = (
    ("errors", "verdict", "provenance"),  # nothing of the artifact
    ("records",),  # the record schema and store
    ("config",),  # configuration files read and parsed (no plug-in asked)
    ("models",),  # weights: fetched, verified, derived
    ("engines",),  # engine plug-ins
    ("analysis",),  # what records say: tables, statistics, figures
    ("workloads",),  # workload plug-ins (their own tables use analysis)
    ("protocol",),  # arms, runs, sessions
    ("catalog",),  # configurations and plans validated by the plug-ins that run them
    ("report",),  # the HTML report
    ("check",),  # claims against expected/, the beyond-the-paper verdicts
    ("evidence",),  # evidence folders' summaries (records and check outputs, read as files)
    ("fetch",),  # weights and data for a matrix, ahead of the runs
    ("orchestrate",),  # ./run.sh all: Docker, native, Slurm
    ("cli", "__main__"),  # the command line
)
RANK = {pkg: i for i, row in enumerate(LAYERS) for pkg in row}
LAZY_COMMENT = re.compile(r"#.*\blazy\b", re.I)


def _modules() -> dict[str, Path]:
    mods = {}
    for p in ROOT.rglob("*.py"):
        parts = p.relative_to(ROOT.parent).with_suffix("").parts
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return mods


MODS = _modules()


def _resolve(name: str) -> str | None:
    while name and name not in MODS:
        name = name.rpartition(".")[0]
    return name or None


def _package(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _is_entry_point(mod: str) -> bool:
    """`python -m artifact.X` modules: the top of the stack by nature."""
    return mod.endswith(".__main__")


def imports():
    """(importer, imported, line, lazy, source lines) for every import of an artifact module."""
    for mod, path in sorted(MODS.items()):
        text = path.read_text()
        lines = text.splitlines()
        tree = ast.parse(text)
        func_lines = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for sub in ast.walk(node):
                    if isinstance(sub, (ast.Import, ast.ImportFrom)):
                        func_lines.add(sub.lineno)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
                    parts = parts[: len(parts) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODS else base for a in node.names]
            else:
                continue
            for t in targets:
                if t.split(".")[0] != "artifact":
                    continue
                target = _resolve(t)
                if target and target != mod:
                    yield mod, target, node.lineno, node.lineno in func_lines, lines


def test_every_package_has_a_layer():
    missing = sorted({_package(m) for m in MODS if m != "artifact"} - set(RANK))
    assert not missing, f"packages without a layer in tests/test_layers.py LAYERS: {missing}"


def test_no_import_points_up_a_layer():
    up = [
        f"{path_of(a)}:{line}: {a} imports {b} ({_package(a)} is below {_package(b)})"
        for a, b, line, _lazy, _lines in imports()
        if not _is_entry_point(a) and _package(a) != _package(b) and RANK[_package(a)] < RANK[_package(b)]
    ]
    assert not up, "imports from a lower layer to a higher one:\n" + "\n".join(sorted(set(up)))


def _says_why(lines: list[str], line: int) -> bool:
    """A '# lazy: ...' comment on the import's line, or on the line just above the block of imports it is in."""
    i = line - 1
    if LAZY_COMMENT.search(lines[i]):
        return True
    while i > 0 and lines[i - 1].strip().startswith(("from ", "import ")):
        i -= 1
        if LAZY_COMMENT.search(lines[i]):
            return True
    return i > 0 and lines[i - 1].strip().startswith("#") and bool(LAZY_COMMENT.search(lines[i - 1]))


def test_a_lazy_import_points_down_and_says_why():
    bad = []
    for a, b, line, lazy, lines in imports():
        if not lazy:
            continue
        if not _says_why(lines, line):
            bad.append(f"{path_of(a)}:{line}: {a} imports {b} inside a function without a '# lazy: why' comment")
    assert not bad, "imports hidden inside functions:\n" + "\n".join(sorted(set(bad)))


def test_no_modules_import_each_other_in_a_cycle():
    graph: dict[str, set[str]] = {}
    for a, b, *_ in imports():
        graph.setdefault(a, set()).add(b)
    index, low, stack, on, cycles = {}, {}, [], set(), []

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(MODS):
        if v not in index:
            visit(v)
    assert not cycles, "modules that import each other (directly or through others):\n" + "\n".join(
        " <-> ".join(c) for c in cycles
    )


def path_of(mod: str) -> str:
    return str(MODS[mod].relative_to(ROOT.parent))
