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
import builtins
import re
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

#: where the core may name an outward module in a string or import a computed name: the
#: registration tables and the loaders of their entry points, as path -> top-level names
#: (an assignment's target or a function); a module left by a move (a key of
#: trace_gym.compat.DEPRECATED_ALIASES) may also name its new home
REGISTRATION_TABLES: dict[str, tuple[str, ...]] = {
    "trace_gym/cli.py": ("COMMANDS", "BENCHMARKS", "_load"),  # the CLI's command routing
    "trace_gym/registration.py": ("BUILTIN_ENVS", "check_env_id"),  # env registration
    "trace_gym/predict/__init__.py": ("PREDICTORS", "predictor_class"),  # predictor registry
    "trace_gym/alloc/__init__.py": ("ALLOCATORS", "make_allocator"),  # allocator registry
    "trace_gym/plugins.py": ("load",),  # a user's "module:Class" or an installed entry point
    "trace_gym/compat.py": ("DEPRECATED_ALIASES", "_forward"),  # the deprecated aliases
    "trace_gym/wrap.py": ("make_inner",),  # a user's "module:Factory" env spec
    "trace_gym/distributed/engine.py": ("resolve",),  # a user's "module:function" hook
    "trace_gym/optional.py": ("require",),  # optional third-party packages
}

#: a string that names an outward module or one of its attributes ("pkg.mod" or "pkg.mod:attr")
OUTWARD_STRING = re.compile(r"trace_gym\.(?:envs|agents|trainers|bench)(?:\.\w+)*(?::[\w.]+)?")
#: the calls that import a module named at run time
DYNAMIC_IMPORTS = ("import_module", "__import__")

#: the project's base error: every exception class derives from it (trace_gym/errors.py)
BASE_ERROR = "TraceGymError"
#: exception classes that may not derive from it, path:Class -> why
FOREIGN_EXCEPTIONS: dict[str, str] = {
    # runs inside the math sandbox, which imports nothing from trace_gym; a BaseException
    # so that the sandboxed code's own `except Exception` cannot swallow the CPU limit
    "envs/math/_sandbox_worker.py:CpuLimit": "sandbox-side, BaseException by design",
    # the answer grammar also runs inside the sandbox (``python -s _judge.py``)
    "envs/math/_judge.py:ParseError": "sandbox-side, imports nothing from trace_gym",
}

#: longest function allowed, in lines from `def` to its last line
MAX_FUNCTION_LINES = 60
#: the folders whose functions are held to it
LENGTH_ROOTS = ("trace_gym", "envs", "agents", "trainers", "bench", "corpora", "scripts")


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


def package_of(module: str, modules: dict[str, Path]) -> str:
    """`module` collapsed to its package one level under its root (trace_gym.sim.model ->
    trace_gym.sim, trace_gym.envs.math.env -> trace_gym.envs.math); a module directly in a
    root (trace_gym.runner) and a root itself stand for themselves."""
    root = max((r for r in ROOTS.values() if _in(module, r)), key=len)
    if module == root:
        return module
    first = f"{root}.{module[len(root) + 1 :].split('.')[0]}"
    return first if modules[first].name == "__init__.py" else module


def package_cycle_violations(modules: dict[str, Path], edges: list[Edge]) -> list[str]:
    """Each import cycle between packages (modules collapsed by `package_of`)."""
    collapsed = [
        Edge(package_of(e.importer, modules), package_of(e.imported, modules), e.where)
        for e in edges
    ]
    return cycle_violations([e for e in collapsed if e.importer != e.imported])


def _names_bound(stmt: ast.stmt) -> set[str]:
    """The names a top-level statement defines (a function, a class, an assignment's targets)."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {stmt.name}
    targets = stmt.targets if isinstance(stmt, ast.Assign) else []
    if isinstance(stmt, ast.AnnAssign):
        targets = [stmt.target]
    return {t.id for t in targets if isinstance(t, ast.Name)}


def _outward_references(stmt: ast.stmt) -> list[tuple[int, str]]:
    """(line, what) for each outward module string and each dynamic import in `stmt`.

    Bare string statements (docstrings) name nothing; an f-string counts when its literal
    start already names an outward package.
    """
    prose = {
        id(n.value)
        for n in ast.walk(stmt)
        if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)
    }
    out = []
    for node in ast.walk(stmt):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
            if OUTWARD_STRING.fullmatch(node.value):
                out.append((node.lineno, f"names {node.value!r}"))
        elif isinstance(node, ast.JoinedStr) and node.values:
            head = node.values[0]
            if isinstance(head, ast.Constant) and OUTWARD_STRING.match(str(head.value)):
                out.append((node.lineno, f"names f'{head.value}...'"))
        elif isinstance(node, ast.Call):
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", None)
            if name in DYNAMIC_IMPORTS:
                out.append((node.lineno, f"calls {name}(...)"))
    return out


def outward_string_violations(modules: dict[str, Path], aliases: frozenset[str]) -> list[str]:
    """Each string in the core that names an outward module, and each import of a name
    computed at run time, outside `REGISTRATION_TABLES` and the alias stubs (`aliases`)."""
    out = []
    for module, path in sorted(modules.items()):
        if not path.is_relative_to(ROOT / "trace_gym") or module in aliases:
            continue
        rel = path.relative_to(ROOT).as_posix()
        allowed = set(REGISTRATION_TABLES.get(rel, ()))
        for stmt in ast.parse(path.read_text(), filename=str(path)).body:
            if _names_bound(stmt) & allowed:
                continue
            found = sorted(_outward_references(stmt))
            out += [f"{rel}:{line} {what}" for line, what in found]
    return out


def deprecated_aliases() -> frozenset[str]:
    """The old module paths left as warning stubs (trace_gym.compat.DEPRECATED_ALIASES)."""
    from trace_gym.compat import DEPRECATED_ALIASES

    return frozenset(DEPRECATED_ALIASES)


def private_imports(modules: dict[str, Path]) -> list[str]:
    """Each ``from m import _name`` of a project module `m` where ``_name`` is a helper,
    not a private submodule of `m` (``from pkg import _judge`` inside pkg is fine)."""
    out = []
    for module, path in sorted(modules.items()):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom):
                continue
            for alias, target in zip(
                node.names, _targets(node, module, path.name == "__init__.py"), strict=True
            ):
                name = alias.name
                private = name.startswith("_") and not name.startswith("__")
                source = target.rpartition(".")[0]
                if private and source in modules and target not in modules:
                    out.append(
                        f"{path.relative_to(ROOT)}:{node.lineno} imports {name} from {source}"
                    )
    return out


def _class_bases(roots: tuple[str, ...]) -> dict[str, tuple[str, set[str]]]:
    """Every class of the roots: path:Class -> (Class, the simple names of its bases)."""
    out = {}
    for folder in roots:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, ast.ClassDef):
                    bases = {
                        b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "")
                        for b in node.bases
                    }
                    out[f"{path.relative_to(ROOT)}:{node.name}"] = (node.name, bases)
    return out


def foreign_exceptions(roots: tuple[str, ...] = tuple(ROOTS)) -> list[str]:
    """Each exception class (a subclass of a built-in exception, seen through the project's
    own classes by simple name) that does not derive from `BASE_ERROR`."""
    classes = _class_bases(roots)
    by_name: dict[str, set[str]] = {}
    for name, bases in classes.values():
        by_name.setdefault(name, set()).update(bases)

    def reaches(name: str, goal, seen: frozenset[str] = frozenset()) -> bool:
        if goal(name):
            return True
        return any(reaches(b, goal, seen | {name}) for b in by_name.get(name, ()) if b not in seen)

    def builtin_exception(name: str) -> bool:
        obj = getattr(builtins, name, None)
        return isinstance(obj, type) and issubclass(obj, BaseException)

    return [
        where
        for where, (name, _) in sorted(classes.items())
        if reaches(name, builtin_exception)
        and not reaches(name, lambda n: n == BASE_ERROR)
        and where not in FOREIGN_EXCEPTIONS
    ]


def attribute_docstrings(roots: tuple[str, ...] = tuple(ROOTS)) -> list[str]:
    """Each string statement right after an assignment (a field documented by a docstring;
    the project's style is a ``#:`` comment above the field), as path:line."""
    out = []
    for folder in roots:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                body = getattr(node, "body", None)
                body = body if isinstance(body, list) else []
                for a, b in zip(body, body[1:], strict=False):
                    doc = isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant)
                    if doc and isinstance(a, (ast.Assign, ast.AnnAssign)):
                        out.append(f"{path.relative_to(ROOT)}:{b.lineno}")
    return out


def plain_parsers(roots: tuple[str, ...] = tuple(ROOTS)) -> list[str]:
    """Each ``argparse.ArgumentParser(...)`` built in the roots outside `trace_gym.cli.Parser`
    (every command's parser is a `Parser`, whose usage errors the CLI reports), path:line."""
    out = []
    for folder in roots:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                fn = node.func if isinstance(node, ast.Call) else None
                name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", None)
                if name == "ArgumentParser":
                    out.append(f"{path.relative_to(ROOT)}:{node.lineno}")
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


def test_core_names_no_outward_module_outside_the_registration_tables():
    modules, _ = import_graph()
    bad = outward_string_violations(modules, deprecated_aliases())
    assert not bad, _report(
        "outward module strings or dynamic imports in the core (register the entry point "
        "in a table of REGISTRATION_TABLES, or import downward)",
        bad,
    )


def test_the_registration_tables_exist():
    for rel, names in REGISTRATION_TABLES.items():
        bound = set().union(*map(_names_bound, ast.parse((ROOT / rel).read_text()).body))
        assert set(names) <= bound, f"{rel}: no top-level {sorted(set(names) - bound)}"


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


def test_no_package_cycles():
    modules, edges = import_graph()
    bad = package_cycle_violations(modules, edges)
    assert not bad, _report("cycles between packages", bad)


def test_no_private_helper_is_imported_across_modules():
    modules, _ = import_graph()
    bad = private_imports(modules)
    assert not bad, _report("private helpers imported from another module (make them public)", bad)


def test_every_exception_derives_from_the_base_error():
    bad = foreign_exceptions()
    assert not bad, _report(
        f"exception classes not under {BASE_ERROR} (re-parent them, or list the reason in "
        "FOREIGN_EXCEPTIONS)",
        bad,
    )
    assert set(FOREIGN_EXCEPTIONS) <= set(_class_bases(tuple(ROOTS)))  # the list cannot rot


def test_fields_are_documented_with_comments():
    bad = attribute_docstrings()
    assert not bad, _report("attribute docstrings (write a `#:` comment above the field)", bad)


def test_every_command_parser_is_the_cli_parser():
    bad = plain_parsers()
    assert not bad, _report(
        "argparse.ArgumentParser built directly (use trace_gym.cli.Parser)", bad
    )


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
            "trace_gym/alloc/policies.py": (
                "def make():\n    from trace_gym.agents.tiny import model\n"
                "from . import _shared\nfrom ._shared import _helper, __version__\n"
            ),
            "trace_gym/alloc/_shared.py": "",
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
        ("trace_gym.alloc.policies", "trace_gym.alloc._shared"),
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
    # a private submodule of its own package may be imported; a private helper may not
    assert private_imports(modules) == [
        "trace_gym/alloc/policies.py:4 imports _helper from trace_gym.alloc._shared"
    ]
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


def test_checker_finds_outward_strings_outside_the_registration_tables(tmp_path, monkeypatch):
    _write(
        tmp_path,
        {
            "trace_gym/__init__.py": "",
            "trace_gym/hooks.py": (
                '"""Docs may name trace_gym.agents.tiny:model."""\n'
                "import importlib\n"
                'HOOK = "trace_gym.agents.tiny:model"\n'
                "def load(name):\n"
                '    return importlib.import_module(f"trace_gym.envs.{name}.env")\n'
                'OK = ("trace_gym.sim.env:SimEnv", "pip install trace-gym[agents]")\n'
            ),
            "trace_gym/cli.py": (
                'COMMANDS = {"demo": "trace_gym.bench.demo:main"}\nOTHER = "trace_gym.trainers"\n'
            ),
            "trace_gym/old.py": '__getattr__ = moved(__name__, "trace_gym.bench.old")\n',
        },
    )
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    modules = module_files()
    hits = [
        "trace_gym/cli.py:2 names 'trace_gym.trainers'",
        "trace_gym/hooks.py:3 names 'trace_gym.agents.tiny:model'",
        "trace_gym/hooks.py:5 calls import_module(...)",
        "trace_gym/hooks.py:5 names f'trace_gym.envs....'",
    ]
    assert outward_string_violations(modules, frozenset({"trace_gym.old"})) == hits
    # a stub left by a move may name its new home only while it is a listed alias
    assert outward_string_violations(modules, frozenset()) == [
        *hits,
        "trace_gym/old.py:1 names 'trace_gym.bench.old'",
    ]


def test_checker_finds_package_cycles_that_no_module_cycle_shows(tmp_path, monkeypatch):
    _write(
        tmp_path,
        {
            "trace_gym/__init__.py": "",
            "trace_gym/errors.py": "",
            "trace_gym/sim/__init__.py": "from trace_gym import errors\n",
            "trace_gym/sim/model.py": "",
            "trace_gym/sim/quality.py": "def q():\n    from trace_gym.predict import make\n",
            "trace_gym/predict/__init__.py": "from trace_gym.predict.oracle import make\n",
            "trace_gym/predict/oracle.py": "def make():\n    from trace_gym.sim.model import v\n",
            "envs/__init__.py": "",
            "envs/math/__init__.py": "from trace_gym.envs.math import env\n",
            "envs/math/env.py": "import trace_gym.sim\n",
        },
    )
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    modules, edges = import_graph()
    assert cycle_violations(edges) == []
    assert package_of("trace_gym.sim.model", modules) == "trace_gym.sim"
    assert package_of("trace_gym.envs.math.env", modules) == "trace_gym.envs.math"
    assert package_of("trace_gym.errors", modules) == "trace_gym.errors"
    assert package_of("trace_gym.envs", modules) == "trace_gym.envs"
    assert package_cycle_violations(modules, edges) == [
        "trace_gym.predict <-> trace_gym.sim:\n"
        "    trace_gym.predict -> trace_gym.sim (trace_gym/predict/oracle.py:2)\n"
        "    trace_gym.sim -> trace_gym.predict (trace_gym/sim/quality.py:2)"
    ]


def test_checker_finds_exceptions_outside_the_base_error(tmp_path, monkeypatch):
    _write(
        tmp_path,
        {
            "trace_gym/errors.py": (
                "class TraceGymError(Exception): ...\n"
                "class ConfigError(TraceGymError, ValueError): ...\n"
            ),
            "envs/a.py": (
                "import errors\n"
                "class Mine(ConfigError): ...\n"
                "class Qualified(errors.TraceGymError): ...\n"
                "class Stray(ValueError): ...\n"
                "class Deep(Stray): ...\n"
                "class NotAnError(dict): ...\n"
            ),
        },
    )
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    assert foreign_exceptions(("trace_gym", "envs")) == ["envs/a.py:Deep", "envs/a.py:Stray"]


def test_checker_finds_attribute_docstrings(tmp_path, monkeypatch):
    _write(
        tmp_path,
        {
            "envs/a.py": (
                '"""Module doc."""\n'
                "X = 1\n"
                '"""x"""\n'
                "class C:\n"
                '    """Class doc."""\n'
                "    #: fine\n"
                "    y: int = 0\n"
                "    z: int = 0\n"
                '    """not fine"""\n'
            ),
        },
    )
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    assert attribute_docstrings(("envs",)) == ["envs/a.py:3", "envs/a.py:9"]


def test_checker_finds_plain_argument_parsers(tmp_path, monkeypatch):
    _write(
        tmp_path,
        {
            "bench/a.py": (
                "import argparse\nfrom argparse import ArgumentParser\n"
                "from trace_gym.cli import Parser\n"
                "a = argparse.ArgumentParser()\nb = ArgumentParser()\nc = Parser()\n"
            )
        },
    )
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    assert plain_parsers(("bench",)) == ["bench/a.py:4", "bench/a.py:5"]
