"""The layering rules, checked on the source (AST, no import-linter).

    L0 core    recsvc (the bare package), recsvc.mechanisms*, recsvc.multiselection*, recsvc.rng,
               recsvc.stats, recsvc.checks
    L1 shared  recsvc.artifact*, recsvc.model*, recsvc.staging, recsvc.engines, recsvc.policy, recsvc.device,
               recsvc.ledger* (the privacy-budget ledger)
    L2 parts   service (recsvc.service*, recsvc.v1*), data_prep*, eval*
    L3 app     recsvc.app*

A module may import its own layer or a lower one; at L2 only its own part, so only recsvc.app
wires parts together. Every import counts: module level, inside functions, under
``if TYPE_CHECKING:``, relative, and ``importlib.import_module``/``__import__`` of a literal
string; a dynamic import of a computed name cannot be checked and is itself a violation.
The project's module graph has no cycles. Third-party imports must come from what the layer's
install provides (pyproject.toml: the base dependencies plus the part's extra); L1 may import a
part's extra (dask for the Dask engine) only inside a function, so the base install can load it.
The ledger is declared apart: it uses the serve extra's database and export packages
(:data:`LEDGER_FROM_SERVE`) only inside a function, except in its PostgreSQL store
(recsvc.ledger.postgres*, which imports psycopg at module level and is itself imported lazily);
its testing module may import pytest. It never imports the service or its stubs, not even lazily.
"""

from __future__ import annotations

import ast
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOTS = ("recsvc", "data_prep", "eval")
GENERATED = "recsvc.v1."  # protoc output: part of the service, its own imports are not ours

# (layer, part) by module-name prefix; the longest matching prefix wins.
LAYERS: dict[str, tuple[int, str]] = {
    "recsvc": (0, "core"),
    "recsvc.mechanisms": (0, "core"),
    "recsvc.multiselection": (0, "core"),  # the 1-D multi-selection theory: device noise, server response
    "recsvc.rng": (0, "core"),
    "recsvc.stats": (0, "core"),
    "recsvc.checks": (0, "core"),
    "recsvc.settings": (0, "core"),  # settings declared once: flag, check, config (stdlib only)
    "recsvc.artifact": (1, "shared"),
    "recsvc.model": (1, "shared"),
    "recsvc.staging": (1, "shared"),
    "recsvc.engines": (1, "shared"),
    "recsvc.policy": (1, "shared"),
    "recsvc.device": (1, "shared"),  # the multi-selection device: embedding, noise, local re-rank
    "recsvc.ledger": (1, "ledger"),
    "recsvc.ledger.postgres": (1, "ledger.postgres"),  # the only part of the ledger that loads psycopg eagerly
    "recsvc.ledger.testing": (1, "ledger.testing"),  # conformance suite (pytest) and throwaway PostgreSQL
    "recsvc.service": (2, "service"),
    "recsvc.service.catalog": (2, "service"),  # the catalog, its version (compact encoding), server-side SANSA
    "recsvc.service.shutdown": (2, "service"),  # stop signals and the drain watchdog (stdlib only)
    "recsvc.v1": (2, "service"),
    "data_prep": (2, "data_prep"),
    "eval": (2, "eval"),
    "recsvc.app": (3, "app"),
}
EXACT_ONLY = {"recsvc"}  # the bare package, not every recsvc.* module

# Distribution name → the top-level module it provides.
IMPORT_NAME = {
    "grpcio": "grpc",
    "grpcio-health-checking": "grpc_health",
    "grpcio-reflection": "grpc_reflection",
    "protobuf": "google",
    "prometheus-client": "prometheus_client",
    "scikit-sparse": "sksparse",
    "scikit-learn": "sklearn",
    "psycopg-pool": "psycopg_pool",
}
CORE_THIRD_PARTY = {"numpy", "scipy", "numba", "randomgen"}
PART_EXTRA = {"service": "serve", "data_prep": "prep", "eval": "eval"}
LAZY_ONLY_IN_SHARED = {"dask", "distributed"}  # the Dask engine: imported when it is used
# The serve extra's packages the ledger uses: PostgreSQL (psycopg, its pool) and the Parquet export.
LEDGER_FROM_SERVE = {"psycopg", "psycopg_pool", "pyarrow"}
LEDGER_POSTGRES = {"psycopg", "psycopg_pool"}  # module level in recsvc.ledger.postgres* only
TEST_RUNNER = {"pytest"}  # recsvc.ledger.testing's conformance suite (the dev extra)


@dataclass(frozen=True)
class Import:
    importer: str
    target: str  # a project module (the deepest one named), or a top-level third-party name
    path: str
    line: int
    lazy: bool  # inside a function: not run when the importer is imported


@dataclass(frozen=True)
class Tree:
    modules: dict[str, Path]  # every project module, generated stubs included
    imports: list[Import]
    problems: list[str]  # dynamic imports that cannot be checked

    def edges(self) -> list[Import]:
        return [i for i in self.imports if i.target in self.modules]


def module_name(root: Path, file: Path) -> str:
    parts = list(file.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> tuple[int, str] | None:
    for prefix in sorted(LAYERS, key=len, reverse=True):
        if module == prefix or (module.startswith(prefix + ".") and prefix not in EXACT_ONLY):
            return LAYERS[prefix]
    return None


def _package(module: str, file: Path) -> str:
    return module if file.name == "__init__.py" else module.rpartition(".")[0]


def _resolve(name: str, modules: dict[str, Path]) -> str:
    """The deepest project module that ``name`` names (``recsvc.x.Thing`` → ``recsvc.x``)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name


def _targets(node: ast.AST, module: str, file: Path, modules: dict[str, Path]) -> Iterator[str]:
    """What one import statement names: the full dotted names, relative ones resolved."""
    if isinstance(node, ast.Import):
        yield from (a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            pkg = _package(module, file).split(".")
            pkg = pkg[: len(pkg) - (node.level - 1)]
            base = ".".join([*pkg, *([base] if base else [])])
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            yield sub if sub in modules else base  # `from pkg import submodule` names the submodule


def _dynamic(node: ast.Call) -> bool:
    f = node.func
    return (isinstance(f, ast.Name) and f.id in ("__import__", "import_module")) or (
        isinstance(f, ast.Attribute) and f.attr == "import_module"
    )


def _walk(tree: ast.AST) -> Iterator[tuple[ast.AST, bool]]:
    """Every node with whether it sits inside a function body."""
    stack: list[tuple[ast.AST, bool]] = [(tree, False)]
    while stack:
        node, lazy = stack.pop()
        yield node, lazy
        inner = lazy or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        stack.extend((child, inner) for child in ast.iter_child_nodes(node))


def scan(root: Path) -> Tree:
    files = {module_name(root, f): f for r in ROOTS if (root / r).is_dir() for f in sorted((root / r).rglob("*.py"))}
    imports: list[Import] = []
    problems: list[str] = []
    for module, file in files.items():
        if module.startswith(GENERATED):
            continue
        rel = str(file.relative_to(root))
        for node, lazy in _walk(ast.parse(file.read_text(), filename=rel)):
            names: list[str] = []
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = list(_targets(node, module, file, files))
            elif isinstance(node, ast.Call) and _dynamic(node):
                arg = node.args[0] if node.args else None
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    names = [arg.value]
                else:
                    problems.append(
                        f"{rel}:{node.lineno} {module}: dynamic import of a computed name "
                        "(import the module by name instead)"
                    )
            for name in names:
                target = _resolve(name, files) or name.split(".")[0]
                if target != module and target != "__future__":
                    assert isinstance(node, (ast.stmt, ast.expr))  # an import or a call: it has a line
                    imports.append(Import(module, target, rel, node.lineno, lazy))
    return Tree(files, imports, problems)


def _base_and_extras(root: Path) -> tuple[set[str], dict[str, set[str]]]:
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]

    def names(reqs: list[str]) -> set[str]:
        out = set()
        for req in reqs:
            dist = req.split("[")[0].split("=")[0].split("<")[0].split(">")[0].split(";")[0].strip()
            if not dist.startswith("recsvc"):
                out.add(IMPORT_NAME.get(dist, dist))
        return out

    return names(project["dependencies"]), {k: names(v) for k, v in project["optional-dependencies"].items()}


def third_party_rules(root: Path) -> dict[str, tuple[set[str], set[str]]]:
    """part → (third-party modules it may import anywhere, ones it may import only lazily)."""
    base, extras = _base_and_extras(root)
    rules = {"core": (CORE_THIRD_PARTY, set()), "shared": (base, LAZY_ONLY_IN_SHARED)}
    serve, dev = extras.get("serve", set()), extras.get("dev", set())
    ledger_lazy = LEDGER_FROM_SERVE & serve
    rules["ledger"] = (base, ledger_lazy)
    rules["ledger.postgres"] = (base | (LEDGER_POSTGRES & serve), ledger_lazy)
    rules["ledger.testing"] = (base | (TEST_RUNNER & dev), ledger_lazy)
    for part, extra in PART_EXTRA.items():
        rules[part] = (base | extras.get(extra, set()), set())
    rules["app"] = (base | set().union(*extras.values()), set())
    return rules


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def ledger_violations(tree: Tree) -> list[str]:
    """The ledger (L1) never reaches into the service or its protobuf stubs, not even inside a
    function: metrics reach it through callbacks, and what it needs of a stored answer is passed
    in. Outside its PostgreSQL store and its testing module, the ledger loads that store (and so
    psycopg) only inside a function, so opening an SQLite ledger never needs the database driver."""
    out = []
    for i in tree.imports:
        if not _within(i.importer, "recsvc.ledger"):
            continue
        if _within(i.target, "recsvc.service") or _within(i.target, "recsvc.v1"):
            what = "the service" if _within(i.target, "recsvc.service") else "the protobuf stubs"
            out.append(f"{i.path}:{i.line} {i.importer} → {i.target}: the ledger imports {what}")
        elif (
            _within(i.target, "recsvc.ledger.postgres")
            and not i.lazy
            and not any(_within(i.importer, p) for p in ("recsvc.ledger.postgres", "recsvc.ledger.testing"))
        ):
            out.append(
                f"{i.path}:{i.line} {i.importer} → {i.target}: the PostgreSQL store, imported outside a function"
            )
    return out


def layer_violations(tree: Tree) -> list[str]:
    out = []
    for m in sorted(tree.modules):
        if layer_of(m) is None:
            out.append(f"{m} is in no layer (add it to LAYERS in tests/architecture/test_layers.py)")
    for i in tree.edges():
        src, dst = layer_of(i.importer), layer_of(i.target)
        if src is None or dst is None:
            continue
        if dst[0] > src[0]:
            out.append(
                f"{i.path}:{i.line} {i.importer} → {i.target}: upward (L{src[0]} {src[1]} imports L{dst[0]} {dst[1]})"
            )
        elif dst[0] == src[0] == 2 and dst[1] != src[1]:
            out.append(
                f"{i.path}:{i.line} {i.importer} → {i.target}: part {src[1]} imports part {dst[1]} "
                "(only recsvc.app wires parts together)"
            )
    return out


def third_party_violations(tree: Tree, root: Path) -> list[str]:
    rules = third_party_rules(root)
    # _typeshed is the type checker's view of the standard library: importable only under TYPE_CHECKING.
    stdlib = set(sys.stdlib_module_names) | {"_typeshed"}
    out = []
    for i in tree.imports:
        if i.target in tree.modules or i.target.split(".")[0] in ROOTS or i.target in stdlib:
            continue
        where = layer_of(i.importer)
        if where is None:
            continue
        anywhere, lazily = rules[where[1]]
        if i.target in anywhere or (i.lazy and i.target in lazily):
            continue
        why = "only inside a function" if i.target in lazily else "not in this part's install"
        out.append(f"{i.path}:{i.line} {i.importer} → {i.target}: third-party, {why} ({where[1]})")
    return out


def cycles(tree: Tree) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    graph: dict[str, set[str]] = {m: set() for m in tree.modules}
    for i in tree.edges():
        graph[i.importer].add(i.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                scc = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    scc.append(m)
                    if m == node:
                        break
                if len(scc) > 1:
                    found.append(sorted(scc))
    return found


def cycle_violations(tree: Tree) -> list[str]:
    out = []
    for scc in cycles(tree):
        members = set(scc)
        inside = sorted(
            {
                (i.path, i.line, i.importer, i.target)
                for i in tree.edges()
                if i.importer in members and i.target in members
            }
        )
        lines = [f"  {path}:{line} {src} → {dst}" for path, line, src, dst in inside]
        out.append(f"import cycle between {', '.join(scc)}:\n" + "\n".join(lines))
    return out


def violations(root: Path) -> list[str]:
    tree = scan(root)
    return [
        *tree.problems,
        *layer_violations(tree),
        *ledger_violations(tree),
        *third_party_violations(tree, root),
        *cycle_violations(tree),
    ]


def _report(found: list[str]) -> str:
    return f"{len(found)} layering violation(s):\n" + "\n".join(found)


# ---------------------------------------------------------------------------------------------


def test_the_project_follows_the_layers():
    found = violations(REPO)
    print(_report(found))
    assert not found, _report(found)


def test_the_scan_sees_the_project():
    """Guards against a vacuous pass: the scan finds the modules and the imports we know of."""
    tree = scan(REPO)
    assert len(tree.modules) >= 40
    edges = {(i.importer, i.target) for i in tree.edges()}
    assert ("recsvc.app.cli", "data_prep.cli") in edges
    assert ("recsvc.app.cli", "recsvc.service.cli") in edges
    assert ("recsvc.service.client", "recsvc.v1.selection_pb2") in edges  # `from recsvc.v1 import selection_pb2`
    assert any(i.importer == "recsvc.service.cli" and i.lazy for i in tree.edges())  # function-level ones count
    assert {layer_of(m) for m in tree.modules} >= {
        (0, "core"),
        (1, "shared"),
        (2, "service"),
        (2, "data_prep"),
        (2, "eval"),
        (3, "app"),
    }


_TOY_PYPROJECT = """
[project]
name = "recsvc"
dependencies = ["numpy==1", "polars==1"]
[project.optional-dependencies]
serve = ["grpcio==1"]
prep = ["sansa==1"]
eval = ["matplotlib==1"]
"""

_TOY = {
    "recsvc/__init__.py": "",
    "recsvc/checks.py": "def f():\n    from recsvc.service import server\n",  # upward, lazily
    "recsvc/stats.py": "import polars\n",  # core: numpy/scipy/numba/randomgen only
    "recsvc/engines.py": "import distributed\n\ndef g():\n    import dask\n",  # dask lazily: fine
    "recsvc/service/__init__.py": "",
    "recsvc/service/server.py": "import grpc\nimport matplotlib\nfrom ..mechanisms import exact\n",
    "recsvc/mechanisms/__init__.py": "",
    "recsvc/mechanisms/exact.py": "import numpy\n",
    "recsvc/app/__init__.py": "",
    "recsvc/app/cli.py": "import data_prep.a\nimport eval.a\nimport sansa\n",  # the app may
    "recsvc/newthing.py": "",
    "data_prep/__init__.py": "",
    "data_prep/a.py": "import importlib\nimportlib.import_module('eval.b')\n",
    "eval/__init__.py": "",
    "eval/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import b\n",
    "eval/b.py": "def h():\n    from eval.a import X\n\ndef k(n):\n    __import__(n)\n",
}


def test_the_checker_finds_upward_imports_and_cycles(tmp_path):
    for rel, text in _TOY.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    (tmp_path / "pyproject.toml").write_text(_TOY_PYPROJECT)
    found = violations(tmp_path)
    text = _report(found)
    print(text)
    expected = [
        "recsvc/checks.py:2 recsvc.checks → recsvc.service.server: upward (L0 core imports L2 service)",
        "data_prep/a.py:2 data_prep.a → eval.b: part data_prep imports part eval",
        "recsvc/stats.py:1 recsvc.stats → polars: third-party, not in this part's install (core)",
        "recsvc/engines.py:1 recsvc.engines → distributed: third-party, only inside a function (shared)",
        "recsvc/service/server.py:2 recsvc.service.server → matplotlib: third-party, not in this part's install",
        "eval/b.py:5 eval.b: dynamic import of a computed name",
        "recsvc.newthing is in no layer",
        "import cycle between eval.a, eval.b:\n  eval/a.py:3 eval.a → eval.b\n  eval/b.py:2 eval.b → eval.a",
    ]
    for e in expected:
        assert any(e in f for f in found), f"missing: {e}\n{text}"
    assert len(found) == len(expected), text  # and nothing else: the app, lazy dask, relative imports are fine


_TOY_LEDGER = {
    "recsvc/__init__.py": "",
    "recsvc/ledger/__init__.py": "from recsvc.ledger import postgres\n",  # eagerly: psycopg for every user
    "recsvc/ledger/base.py": "def f():\n    from recsvc.service import metrics\n",  # upward, even lazily
    "recsvc/ledger/sqlite.py": "from recsvc.v1 import selection_pb2\nimport psycopg\n",  # stubs; psycopg eagerly
    "recsvc/ledger/export.py": "def g():\n    import pyarrow\n    from recsvc.ledger import postgres\n",  # fine
    "recsvc/ledger/postgres.py": "import psycopg\nimport psycopg_pool\n",  # fine: the store itself
    "recsvc/ledger/testing.py": "import pytest\nfrom recsvc.ledger import postgres\n",  # fine
    "recsvc/service/__init__.py": "",
    "recsvc/service/metrics.py": "",
    "recsvc/v1/__init__.py": "",
    "recsvc/v1/selection_pb2.py": "",
}

_TOY_PYPROJECT_LEDGER = """
[project]
name = "recsvc"
dependencies = ["numpy==1"]
[project.optional-dependencies]
serve = ["grpcio==1", "psycopg[binary]==3", "psycopg-pool==3", "pyarrow==1"]
dev = ["pytest==9"]
"""


def test_the_ledger_may_not_import_the_service_or_its_stubs(tmp_path):
    for rel, text in _TOY_LEDGER.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    (tmp_path / "pyproject.toml").write_text(_TOY_PYPROJECT_LEDGER)
    found = violations(tmp_path)
    text = _report(found)
    print(text)
    expected = [
        "recsvc/ledger/base.py:2 recsvc.ledger.base → recsvc.service.metrics: the ledger imports the service",
        "recsvc/ledger/base.py:2 recsvc.ledger.base → recsvc.service.metrics: upward (L1 ledger imports L2 service)",
        "recsvc.ledger.sqlite → recsvc.v1.selection_pb2: the ledger imports the protobuf stubs",
        "recsvc.ledger.sqlite → recsvc.v1.selection_pb2: upward (L1 ledger imports L2 service)",
        "recsvc/ledger/sqlite.py:2 recsvc.ledger.sqlite → psycopg: third-party, only inside a function (ledger)",
        "recsvc/ledger/__init__.py:1 recsvc.ledger → recsvc.ledger.postgres: the PostgreSQL store, imported outside",
    ]
    for e in expected:
        assert any(e in f for f in found), f"missing: {e}\n{text}"
    assert len(found) == len(expected), text


def test_the_real_ledger_imports_neither_the_service_nor_its_stubs():
    """The rule above, on the project itself (also part of test_the_project_follows_the_layers)."""
    tree = scan(REPO)
    assert any(_within(m, "recsvc.ledger.postgres") for m in tree.modules)  # the scan sees the ledger
    assert ledger_violations(tree) == []
