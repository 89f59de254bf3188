"""The architecture rules of docs/development.md, checked on the source: who may import whom, how long a function may be.

import-linter's graph builder (grimp) walks the folder of the ``trace_gym`` package and
does not see the subpackages that setuptools maps from other folders (``package-dir``:
``envs/`` -> ``trace_gym.envs`` ...), so this file builds the import graph itself from
the AST of every module under the five roots. Every ``import`` counts: at the top of a
module, under ``if TYPE_CHECKING:``, inside a function. Entry points written as
``"module:attr"`` strings are not imports (that is how the core reaches outward).

Each check lists every violation with its file and line, so one run shows all of them.
"""

from __future__ import annotations

import ast
from collections import deque
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: source folder -> the package it installs as (pyproject's [tool.setuptools.package-dir])
ROOTS: dict[str, str] = {
    "trace_gym": "trace_gym",
    "envs": "trace_gym.envs",
    "agents": "trace_gym.agents",
    "trainers": "trace_gym.trainers",
    "corpora": "trace_gym.corpora",
    "bench": "trace_gym.bench",
}

#: the packages the core (everything from the trace_gym/ folder) must never import
OUTWARD = ("trace_gym.envs", "trace_gym.agents", "trace_gym.trainers", "trace_gym.bench")

#: the application layer: it stands above every other root, and only it (and the tests)
#: may import it
APPLICATION = "trace_gym.bench"

#: one step's layers, top first: a module may import those below its layer, never above
#: (a layer that has no module yet, like trace_gym.plan before it is written, is checked
#: as soon as it exists)
STEP_LAYERS = ("trace_gym.runner", "trace_gym.plan", "trace_gym.alloc", "trace_gym.scheduling")

#: longest function allowed, in lines from `def` to its last line
MAX_FUNCTION_LINES = 60
#: the folders whose functions are held to it
LENGTH_ROOTS = ("trace_gym", "envs", "agents", "trainers", "bench")


@dataclass(frozen=True)
class Edge:
    """`importer` imports `imported` at `where` (path:line)."""

    importer: str
    imported: str
    where: str


def module_files() -> dict[str, Path]:
    """Dotted module name -> source file, for every module under the roots."""
    out: dict[str, Path] = {}
    for folder, package in ROOTS.items():
        base = ROOT / folder
        for path in sorted(base.rglob("*.py")):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([package, *parts])] = path
    return out


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The most specific known module that `name` (a module or a module attribute) lives in."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_pkg: bool) -> list[str]:
    """Dotted names one import statement loads (``from a import b`` may load a.b)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level:
        base = module.split(".") if is_pkg else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        prefix = ".".join(base + ([node.module] if node.module else []))
    else:
        prefix = node.module or ""
    return [f"{prefix}.{a.name}" for a in node.names]


def import_graph() -> tuple[dict[str, Path], list[Edge]]:
    """Every module and every import edge between the project's own modules."""
    modules = module_files()
    edges: list[Edge] = []
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for name in _targets(node, module, is_pkg):
                target = _resolve(name, modules)
                if target is not None and target != module:
                    edges.append(Edge(module, target, f"{path.relative_to(ROOT)}:{node.lineno}"))
    return modules, edges


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _adjacency(edges: list[Edge]) -> dict[str, dict[str, Edge]]:
    adj: dict[str, dict[str, Edge]] = {}
    for e in edges:
        adj.setdefault(e.importer, {}).setdefault(e.imported, e)
    return adj


def _path(adj: dict[str, dict[str, Edge]], start: str, goal) -> list[Edge] | None:
    """Shortest chain of imports from `start` to a module for which `goal` holds."""
    back: dict[str, Edge | None] = {start: None}
    todo = deque([start])
    while todo:
        here = todo.popleft()
        for there, edge in adj.get(here, {}).items():
            if there in back:
                continue
            back[there] = edge
            if goal(there):
                chain = []
                while (step := back[there]) is not None:
                    chain.append(step)
                    there = step.importer
                return chain[::-1]
            todo.append(there)
    return None


def _chain(chain: list[Edge]) -> str:
    return " -> ".join([chain[0].importer] + [f"{e.imported} ({e.where})" for e in chain])


def strongly_connected(adj: dict[str, dict[str, Edge]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one module (the cycles)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in adj.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(adj):
        if v not in index:
            visit(v)
    return out


def core_violations(modules: dict[str, Path], edges: list[Edge]) -> list[str]:
    """Each place where the core reaches envs/agents/trainers: the chain from the first
    module outside the core folder back to the core module that leaves it (one line per exit)."""
    adj = _adjacency(edges)
    core = {m for m, p in modules.items() if p.is_relative_to(ROOT / "trace_gym")}
    out: set[str] = set()
    for m in sorted(core):
        chain = _path(adj, m, lambda t: any(_in(t, o) for o in OUTWARD))
        if chain is not None:
            exit_ = max(i for i, e in enumerate(chain) if e.importer in core)
            out.add(_chain(chain[exit_:]))
    return sorted(out)


def cycle_violations(edges: list[Edge]) -> list[str]:
    """Each import cycle: its modules and the imports that close it."""
    adj = _adjacency(edges)
    out = []
    for comp in strongly_connected(adj):
        members = set(comp)
        inner = sorted(
            {e for e in edges if e.importer in members and e.imported in members},
            key=lambda e: (e.importer, e.imported, e.where),
        )
        lines = "\n    ".join(f"{e.importer} -> {e.imported} ({e.where})" for e in inner)
        out.append(f"{' <-> '.join(comp)}:\n    {lines}")
    return out


def layer_of(module: str) -> int | None:
    for i, layer in enumerate(STEP_LAYERS):
        if _in(module, layer):
            return i
    return None


def layer_violations(edges: list[Edge]) -> list[str]:
    """Each module of a lower step layer that reaches a higher one, directly or through others."""
    adj = _adjacency(edges)
    out = []
    for m in sorted(adj):
        mine = layer_of(m)
        if mine is None:
            continue
        chain = _path(adj, m, lambda t, mine=mine: layer_of(t) is not None and layer_of(t) < mine)
        if chain is not None:
            out.append(_chain(chain))
    return out


def long_functions(
    roots: tuple[str, ...] = LENGTH_ROOTS, limit: int = MAX_FUNCTION_LINES
) -> list[str]:
    """Each function (or method) longer than `limit` lines, as path:line name (n lines)."""
    out = []
    for folder in roots:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    n = node.end_lineno - node.lineno + 1
                    if n > limit:
                        out.append(
                            f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({n} lines)"
                        )
    return out


def _report(title: str, items: list[str]) -> str:
    return f"{len(items)} {title}:\n  " + "\n  ".join(items)


# ---------------------------------------------------------------------- the rules
def test_the_graph_sees_every_root():
    modules, edges = import_graph()
    for package in ROOTS.values():
        assert package in modules, package
    for package in OUTWARD:  # and the edges into them (agents use envs, trainers use agents)
        assert any(_in(e.imported, package) for e in edges), package


def test_core_never_imports_envs_agents_trainers():
    modules, edges = import_graph()
    bad = core_violations(modules, edges)
    assert not bad, _report("core modules reach outward (use a 'module:attr' entry point)", bad)


def test_nothing_below_the_application_layer_imports_it():
    modules, edges = import_graph()
    bad = [
        f"{e.importer} -> {e.imported} ({e.where})"
        for e in edges
        if _in(e.imported, APPLICATION) and not _in(e.importer, APPLICATION)
    ]
    assert not bad, _report(f"modules outside {APPLICATION} import it", bad)


def test_no_import_cycles():
    _, edges = import_graph()
    bad = cycle_violations(edges)
    assert not bad, _report("import cycles (incl. TYPE_CHECKING and function-level imports)", bad)


def test_step_layers_import_downward_only():
    _, edges = import_graph()
    bad = layer_violations(edges)
    assert not bad, _report(f"imports up the step layers {' -> '.join(STEP_LAYERS)}", bad)


def test_no_function_over_60_lines():
    bad = long_functions()
    assert not bad, _report(f"functions over {MAX_FUNCTION_LINES} lines", bad)


# ---------------------------------------------------------------------- the checker itself
def _write(tmp: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / rel).write_text(text)


def test_checker_finds_lazy_typechecking_and_relative_imports(tmp_path, monkeypatch):
    _write(
        tmp_path,
        {
            "trace_gym/__init__.py": "",
            "trace_gym/runner.py": "from trace_gym import scheduling\n",
            "trace_gym/scheduling.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .runner import Runner\n"
            ),
            "trace_gym/alloc/__init__.py": "from .policies import make\n",
            "trace_gym/alloc/policies.py": "def make():\n    from trace_gym.agents.tiny import model\n",
            "trace_gym/plan.py": "import trace_gym.runner\n",
            "agents/__init__.py": "",
            "agents/tiny.py": "import trace_gym.alloc\nmodel = 1\n",
            "envs/__init__.py": "",
            "trainers/__init__.py": "",
            "trace_gym/tree.py": "from trace_gym import corpora\n",
            "corpora/__init__.py": "import trace_gym.envs\n",
        },
    )
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    modules, edges = import_graph()
    assert {(e.importer, e.imported) for e in edges} == {
        ("trace_gym.runner", "trace_gym.scheduling"),
        ("trace_gym.scheduling", "trace_gym.runner"),
        ("trace_gym.alloc", "trace_gym.alloc.policies"),
        ("trace_gym.alloc.policies", "trace_gym.agents.tiny"),
        ("trace_gym.plan", "trace_gym.runner"),
        ("trace_gym.agents.tiny", "trace_gym.alloc"),
        ("trace_gym.tree", "trace_gym.corpora"),
        ("trace_gym.corpora", "trace_gym.envs"),
    }
    scheduling_edge = next(e for e in edges if e.importer == "trace_gym.scheduling")
    assert scheduling_edge.where == "trace_gym/scheduling.py:3"
    # one line per exit from the core, whoever reaches it; a chain through corpora counts
    assert core_violations(modules, edges) == [
        "trace_gym.alloc.policies -> trace_gym.agents.tiny (trace_gym/alloc/policies.py:2)",
        "trace_gym.tree -> trace_gym.corpora (trace_gym/tree.py:1)"
        " -> trace_gym.envs (corpora/__init__.py:1)",
    ]
    cycles = cycle_violations(edges)
    assert len(cycles) == 2
    assert any(c.startswith("trace_gym.runner <-> trace_gym.scheduling:") for c in cycles)
    assert any(
        "trace_gym.agents.tiny <-> trace_gym.alloc <-> trace_gym.alloc.policies" in c
        for c in cycles
    )
    layers = layer_violations(edges)
    assert "trace_gym.plan -> trace_gym.runner (trace_gym/plan.py:1)" in layers
    assert "trace_gym.scheduling -> trace_gym.runner (trace_gym/scheduling.py:3)" in layers
    assert not any(v.startswith("trace_gym.runner ") for v in layers)


def test_checker_measures_function_length(tmp_path, monkeypatch):
    body = "".join(f"    x{i} = {i}\n" for i in range(59))  # a 60-line function: allowed
    method = "".join(f"        x{i} = {i}\n" for i in range(60))  # a 61-line method: not
    _write(
        tmp_path,
        {"trace_gym/a.py": f"def ok():\n{body}\n\nclass C:\n    def long(self):\n{method}"},
    )
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    assert long_functions(("trace_gym",)) == ["trace_gym/a.py:64 long (61 lines)"]
