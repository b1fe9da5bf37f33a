"""The benchmarks form one package, ``scripts.bench``, run as ``python -m scripts.bench.<name>`` from
the repository root: they share :mod:`scripts.bench.harness` instead of reaching into each other
through ``sys.path``, their imports form no cycle, and every benchmark answers ``--help``."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"
BENCH = SCRIPTS / "bench"
PACKAGE = "scripts.bench"


def _modules() -> dict[str, ast.Module]:
    """Every module of the package by dotted name (``scripts.bench.harness``, ...; the package itself
    as ``scripts.bench``)."""
    out = {}
    for path in sorted(BENCH.glob("*.py")):
        name = PACKAGE if path.stem == "__init__" else f"{PACKAGE}.{path.stem}"
        out[name] = ast.parse(path.read_text(), filename=str(path))
    return out


def _imports(module: str, tree: ast.Module) -> set[str]:
    """Dotted names ``module`` imports anywhere (module level or inside functions), relative ones
    resolved; ``from a import b`` counts as both ``a`` and ``a.b``."""
    package = module if module == PACKAGE else module.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module or ""
            found.add(source)
            found.update(f"{source}.{alias.name}" for alias in node.names)
    return found


def _is_benchmark(tree: ast.Module) -> bool:
    """A module with an ``if __name__ == "__main__":`` block is a benchmark; the rest are its parts."""
    for node in tree.body:
        if (
            isinstance(node, ast.If)
            and isinstance(node.test, ast.Compare)
            and isinstance(node.test.left, ast.Name)
            and node.test.left.id == "__name__"
            and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in node.test.comparators)
        ):
            return True
    return False


MODULES = _modules()
BENCHMARKS = sorted(name for name, tree in MODULES.items() if _is_benchmark(tree))


def test_scripts_are_a_package_with_one_harness():
    assert (SCRIPTS / "__init__.py").is_file() and (BENCH / "__init__.py").is_file()
    assert f"{PACKAGE}.harness" in MODULES
    assert not list(SCRIPTS.glob("bench_*.py")) and not list(SCRIPTS.glob("profile_*.py")), (
        "benchmarks live in scripts/bench/ and run as modules"
    )
    # the service benchmark and the ones built on its harness, at least
    assert {f"{PACKAGE}.{m}" for m in ("service", "pg_share", "refusals", "rs_flood", "profile_batch")} <= set(
        BENCHMARKS
    )


def test_no_module_under_scripts_edits_sys_path():
    offenders = []
    for path in sorted(SCRIPTS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            touches = (
                (
                    isinstance(node, ast.Attribute)
                    and node.attr == "path"
                    and isinstance(node.value, ast.Name)
                    and node.value.id == "sys"
                )
                or (
                    isinstance(node, ast.ImportFrom)
                    and node.module == "sys"
                    and any(a.name == "path" for a in node.names)
                )
                or (isinstance(node, ast.Attribute) and node.attr == "addsitedir")
            )
            if touches:
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert offenders == []


def test_bench_modules_import_each_other_without_a_cycle() -> None:
    graph = {
        name: sorted(i for i in _imports(name, tree) if i in MODULES and i != name) for name, tree in MODULES.items()
    }
    # Iterative depth-first search: a grey node reached again closes a cycle.
    colour: dict[str, str] = {}
    cycles = []
    for root in graph:
        if root in colour:
            continue
        stack = [(root, iter(graph[root]))]
        path = [root]
        colour[root] = "grey"
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                colour[node] = "black"
                stack.pop()
                path.pop()
            elif colour.get(child) == "grey":
                cycles.append([*path[path.index(child) :], child])
            elif child not in colour:
                colour[child] = "grey"
                stack.append((child, iter(graph[child])))
                path.append(child)
    assert cycles == []
    assert graph[f"{PACKAGE}.harness"] == [], "the harness imports no benchmark"


def test_every_part_that_is_not_a_benchmark_is_used_by_one():
    """A module without a ``__main__`` block must be imported by another module of the package,
    so a benchmark that lost its entry point cannot hide among the parts."""
    used = set().union(*(_imports(name, tree) for name, tree in MODULES.items()))
    orphans = [name for name in MODULES if name != PACKAGE and name not in BENCHMARKS and name not in used]
    assert orphans == []


def test_only_the_harness_starts_the_throwaway_postgresql():
    """The benchmarks reach the project's PostgreSQL cluster helper through the harness alone."""
    helpers = {
        name: sorted(i for i in _imports(name, tree) if i.endswith(".pg_cluster") or ".ledger.testing" in i)
        for name, tree in MODULES.items()
    }
    assert {name for name, found in helpers.items() if found} <= {f"{PACKAGE}.harness"}


def test_every_project_name_a_benchmark_imports_exists():
    """Imports inside functions too (the servers, the in-process profile): a renamed project module
    or symbol fails here, not halfway through a benchmark run."""
    import importlib
    import importlib.util

    missing = []
    for name, tree in MODULES.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                wanted = [(alias.name, None) for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                wanted = [(node.module, alias.name) for alias in node.names]
            else:
                continue
            for module, attr in wanted:
                if module.split(".")[0] not in ("recsvc", "data_prep", "eval", "scripts"):
                    continue
                try:
                    found = importlib.import_module(module)
                except ImportError:
                    missing.append(f"{name}:{node.lineno} {module}")
                    continue
                submodule = hasattr(found, "__path__") and importlib.util.find_spec(f"{module}.{attr}") is not None
                if attr and not hasattr(found, attr) and not submodule:
                    missing.append(f"{name}:{node.lineno} {module}.{attr}")
    assert missing == []


# Runs each benchmark as `python -m` does (runpy, as __main__) with --help, all in one fresh
# interpreter started from the repository's root, so numpy and the project load once, not per benchmark.
HELP_DRIVER = """
import contextlib, io, json, runpy, sys
out = {}
for module in sys.argv[1:]:
    buf, code = io.StringIO(), "returned without exiting"
    sys.argv = [module, "--help"]
    try:
        with contextlib.redirect_stdout(buf):
            runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code
    except Exception as exc:
        code = "raised " + repr(exc)
    out[module] = [code, buf.getvalue()]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def helps() -> dict[str, list[object]]:
    proc = subprocess.run(
        [sys.executable, "-c", HELP_DRIVER, *BENCHMARKS], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.parametrize("module", BENCHMARKS)
def test_benchmark_runs_as_a_module_and_answers_help(module, helps):
    code, out = helps[module]
    assert code == 0, (code, out)
    assert str(out).startswith("usage:") and "--help" in str(out)


def test_no_text_names_a_benchmark_by_a_script_path():
    """Commands and references name benchmarks as modules, the way they run."""
    stale = re.compile(r"scripts/(bench_[a-z_]+|profile_batch)\.py")
    tracked = subprocess.run(
        ["git", "ls-files", "*.py", "*.md", "*.sh", "*.toml", "*.cfg", "*.txt"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    if tracked.returncode != 0:
        pytest.skip("not a git checkout")
    offenders = []
    for rel in tracked.stdout.split():
        if rel == Path(__file__).relative_to(REPO).as_posix():
            continue
        path = REPO / rel
        if path.is_file():
            offenders += [
                f"{rel}:{n}"
                for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
                if stale.search(line)
            ]
    assert offenders == []
