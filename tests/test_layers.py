"""The artifact's layers (docs/developer.md, "The folder map"): every import of one artifact module by another points down this map
or stays inside its package (entry points too: a package's `__main__.py` is held to its package's layer), no modules
import each other in a cycle, an import inside a function (a lazy import, kept only for start-up time) points down and
says why in a comment on its line or the line above, and a module over MAX_LINES lines says why it stays one."""

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
    ("evidence", "paper_vs_here"),  # evidence folders' summaries; the paper's values beside them (files read)
    ("fetch",),  # weights and data for a matrix, ahead of the runs
    ("orchestrate",),  # ./run.sh all: Docker, native, Slurm
    ("cli", "__main__"),  # the command line
)
RANK = {pkg: i for i, row in enumerate(LAYERS) for pkg in row}
LAZY_COMMENT = re.compile(r"#.*\blazy\b", re.I)

# A module longer than this says in its docstring why it stays one module: a paragraph that begins "One module:".
MAX_LINES = 450
ONE_MODULE = "One module:"


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


def _imports_of(mod: str, filename: str, text: str):
    """(imported, line, lazy) for every import of an artifact module in one module's source."""
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
                parts = mod.split(".") if filename == "__init__.py" else mod.split(".")[:-1]
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
                yield target, node.lineno, node.lineno in func_lines


def imports():
    """(importer, imported, line, lazy, source lines) for every import of an artifact module, by every module
    (entry points too: a package's `__main__.py` is a module of its package, held to its layer like the others)."""
    for mod, path in sorted(MODS.items()):
        text = path.read_text()
        lines = text.splitlines()
        for target, line, lazy in _imports_of(mod, path.name, text):
            yield mod, target, line, lazy, lines


def _points_up(a: str, b: str) -> bool:
    return _package(a) != _package(b) and RANK[_package(a)] < RANK[_package(b)]


def test_every_package_has_a_layer():
    missing = sorted({_package(m) for m in MODS if m != "artifact"} - set(RANK))
    assert not missing, f"packages without a layer in tests/test_layers.py LAYERS: {missing}"


def test_no_import_points_up_a_layer():
    up = [
        f"{path_of(a)}:{line}: {a} imports {b} ({_package(a)} is below {_package(b)})"
        for a, b, line, _lazy, _lines in imports()
        if _points_up(a, b)
    ]
    assert not up, "imports from a lower layer to a higher one:\n" + "\n".join(sorted(set(up)))


def test_an_entry_point_is_held_to_its_packages_layer():
    """No exemption for `python -m` entry points: every `__main__.py` is in the graph, and one in a lower package
    that imported a higher layer (as `python -m artifact.models` once imported the engines to register their tools)
    fails like any other module. Commands that need higher layers belong to the command line (`artifact/cli.py`)."""
    entry_points = [m for m in MODS if m.endswith(".__main__")]
    assert "artifact.__main__" in entry_points
    assert all(_package(m) in RANK for m in entry_points)
    source = "import artifact.engines\nfrom artifact.catalog import load_config\n"
    targets = [t for t, _line, _lazy in _imports_of("artifact.models.__main__", "__main__.py", source)]
    assert targets == ["artifact.engines", "artifact.catalog"]
    assert all(_points_up("artifact.models.__main__", t) for t in targets)


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


def _says_why_it_is_one(path: Path) -> bool:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    return any(line.startswith(ONE_MODULE) for line in doc.splitlines())


def test_a_module_over_the_limit_says_why_it_stays_one():
    """A module over MAX_LINES lines is split where a part has a name of its own, or its docstring says why it reads
    best as one ("One module: the schema is one contract, read top to bottom"), so that a new big module fails here
    until someone decides which."""
    over = {path_of(m): len(p.read_text().splitlines()) for m, p in MODS.items()}
    over = {rel: n for rel, n in over.items() if n > MAX_LINES}
    root = ROOT.parent
    bad = [
        f"{rel}: {n} lines, and no paragraph of its docstring begins {ONE_MODULE!r} (split it, or say why it stays one)"
        for rel, n in sorted(over.items())
        if not _says_why_it_is_one(root / rel)
    ]
    assert not bad, "\n".join(bad)
