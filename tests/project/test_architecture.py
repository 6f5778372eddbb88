"""The layout's rules, read from the code's own imports (docs/architecture.md draws them):
dependencies point one way between the packages and between harness's parts, no module takes
part in an import cycle, harness keeps a short top level, no engine is named where runs are
planned, expanded, executed or recorded, no command imports another, and the dashboard and
the reports read the store only through db's named reads. And the page itself stays true: every
file and every ``file.py:symbol`` it names exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from harness import REPO_ROOT
from harness.cli import SUBCOMMANDS
from harness.engines import ENGINES

PACKAGES = ("harness", "devices", "db", "reports")
# what each package may import of the others (the layers docs/architecture.md draws)
MAY_IMPORT = {"harness": {"devices", "db", "reports"}, "reports": {"db", "devices"},
              "devices": set(), "db": set()}
# where no engine may be named: specs, planning, history, running a job and a lab, the back
# ends of the audit and reproduce, and the reports; each engine is reached through its adapter
ENGINE_BLIND = ("harness/spec", "harness/plan", "harness/history", "harness/execution",
                "harness/lab", "harness/verify", "reports")
# the modules there whose subject is one engine's claims (the audit of an article about lmc, of
# llama-bench's published tables): each names that engine in its docstring, as the reason
ABOUT_ONE_ENGINE = ("harness/verify/engine_checks.py", "harness/verify/importance_check.py",
                    "reports/audit/llamabench_rows.py", "reports/audit/claims_file.py")
HARNESS_TOP_LEVEL_MODULES = 12
# what reads the store only through db's named reads: neither SQL nor the tables
STORE_READERS = ("harness/web", "reports")
BELOW_THE_STORE = ("sqlalchemy", "db.models")
ARCHITECTURE = REPO_ROOT / "docs" / "architecture.md"
# the repository's folders a path on the page starts from (a name inside a table row, such as
# static/live.js under harness/web, is read by the reader in its row's folder)
TOP_FOLDERS = ("harness", "db", "devices", "reports", "engine", "tests", "specs", "claims",
               "bench", "docs", "models", "scripts")
# a path to a file, then optionally :symbol or :Class.member ("harness/cli.py:main")
NAMED = re.compile(r"(?<![\w/.<-])((?:[\w-]+/)+[\w.-]+\.(?:py|md|toml|h|c|js|html))"
                   r"(?::([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)?))?")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def sources() -> dict[str, Path]:
    return {module_name(p): p for package in PACKAGES
            for p in sorted((REPO_ROOT / package).rglob("*.py"))
            if "migrations" not in p.parts}


def imported(path: Path, known: set[str]) -> set[str]:
    """The project modules a module imports: at its top, inside functions, and for type
    checkers alone (a cycle there still ties the two modules together)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            # `from a import b`: the module a.b when there is one, else a (b is a name in it)
            names = [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in known
                     else node.module for alias in node.names]
        else:
            names = []
        for name in names:
            while name and name not in known:  # `from a.b import c`: the module a.b.c or a.b
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = sources()
    known = set(modules)
    return {name: imported(path, known) - {name} for name, path in modules.items()}


def cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := walk(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (found := walk(node)):
            return found
    return None


def collapsed(graph: dict[str, set[str]], unit_of) -> dict[str, set[str]]:
    units: dict[str, set[str]] = {}
    for module, targets in graph.items():
        here = unit_of(module)
        if here is None:
            continue
        units.setdefault(here, set()).update(
            u for t in targets if (u := unit_of(t)) is not None and u != here)
    return units


def test_the_cycle_finder_finds_one() -> None:
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_no_module_imports_itself_back(graph: dict[str, set[str]]) -> None:
    assert cycle(graph) is None


def test_packages_depend_one_way(graph: dict[str, set[str]]) -> None:
    packages = collapsed(graph, lambda m: m.split(".")[0])
    for package, targets in packages.items():
        assert targets <= MAY_IMPORT[package], (package, targets - MAY_IMPORT[package])


def test_harness_parts_depend_one_way(graph: dict[str, set[str]]) -> None:
    """harness's subpackages and top-level modules form no cycle either: spec, plan,
    execution, engines, workloads ... each is a room whose doors open one way."""
    def part(module: str) -> str | None:
        parts = module.split(".")
        return ".".join(parts[:2]) if parts[0] == "harness" and len(parts) > 1 else None

    assert cycle(collapsed(graph, part)) is None


def test_no_command_imports_another(graph: dict[str, set[str]]) -> None:
    """A command shares only the helper modules (arguments, table, context), never another
    command's module."""
    commands = {f"harness.commands.{name}" for name in SUBCOMMANDS}
    for command in commands:
        assert not graph[command] & commands, (command, graph[command] & commands)


def modules_named(path: Path) -> set[str]:
    """Every module an import statement of the file names, whatever it is (``from a import
    b`` names a and a.b), at its top, inside functions or for type checkers alone."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def below_the_store(name: str) -> bool:
    return any(name == banned or name.startswith(banned + ".") for banned in BELOW_THE_STORE)


def test_the_import_scan_sees_sql_and_tables(tmp_path: Path) -> None:
    module = tmp_path / "reader.py"
    module.write_text("from db import models\n\ndef f():\n    import sqlalchemy.orm\n")
    assert sorted(filter(below_the_store, modules_named(module))) == ["db.models",
                                                                      "sqlalchemy.orm"]


def test_the_dashboard_and_the_reports_read_the_store_through_db() -> None:
    """harness/web and reports call db's named reads (db/queries.py, db/frames.py,
    db/experiments.py, Store, Boards, Jobs ...); they build no SQL and touch no table of
    their own."""
    for folder in STORE_READERS:
        for path in sorted((REPO_ROOT / folder).rglob("*.py")):
            found = sorted(filter(below_the_store, modules_named(path)))
            assert not found, (str(path.relative_to(REPO_ROOT)), found)


def test_harness_keeps_a_short_top_level() -> None:
    modules = [p.name for p in (REPO_ROOT / "harness").glob("*.py")]
    assert len(modules) <= HARNESS_TOP_LEVEL_MODULES, sorted(modules)


def test_no_engine_is_named_where_runs_are_planned_run_or_recorded(
        graph: dict[str, set[str]]) -> None:
    names = set(ENGINES)
    for name, path in sources().items():
        relative = str(path.relative_to(REPO_ROOT))
        if not relative.startswith(ENGINE_BLIND):
            continue
        if relative in ABOUT_ONE_ENGINE:
            docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
            assert any(engine in docstring for engine in names), (relative, "says which engine")
            continue
        engine_packages = {m for m in graph[name] if m.startswith("harness.engines.")
                           and m.split(".")[2] != "base"}
        assert not engine_packages, (name, engine_packages)
        tree = ast.parse(path.read_text())
        literals = {node.value for node in ast.walk(tree)
                    if isinstance(node, ast.Constant) and isinstance(node.value, str)}
        assert not literals & names, (name, literals & names)


def defined(path: Path) -> set[str]:
    """What a module defines at its top (functions, classes, assignments) and its classes'
    methods, as ``Class.method``."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            names.update(f"{node.name}.{member.name}" for member in node.body
                         if isinstance(member, ast.FunctionDef | ast.AsyncFunctionDef))
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def stale_names(text: str) -> list[str]:
    """The files and ``file.py:symbol``s ``text`` names that do not exist in the repository."""
    stale = []
    for path, symbol in NAMED.findall(text):
        if path.split("/")[0] not in TOP_FOLDERS:
            continue
        where = REPO_ROOT / path
        if not where.is_file():
            stale.append(path)
        elif symbol and (not path.endswith(".py") or symbol not in defined(where)):
            stale.append(f"{path}:{symbol}")
    return stale


def test_the_page_scan_finds_what_is_gone() -> None:
    text = ("`harness/cli.py:main` and `harness/engines/base.py:EngineAdapter.figures`, "
            "`harness/engines/<name>/`; gone: `harness/nonesuch.py`, `harness/cli.py:nonesuch`, "
            "`harness/engines/base.py:EngineAdapter.nonesuch`")
    assert stale_names(text) == ["harness/nonesuch.py", "harness/cli.py:nonesuch",
                                 "harness/engines/base.py:EngineAdapter.nonesuch"]


def test_every_file_and_symbol_the_architecture_page_names_exists() -> None:
    """docs/architecture.md names files (``db/store.py``) and what is in them
    (``harness/plan/planner.py:make_plan``, ``db/jobs.py:Jobs.add``): each must still be there,
    so that the page cannot go stale silently when code moves."""
    assert stale_names(ARCHITECTURE.read_text()) == []
