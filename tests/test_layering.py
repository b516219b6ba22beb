"""The import layering of docs/architecture.md, checked on the source (no import runs).

Every ``import`` and ``from ... import`` of capturelint's modules counts, at module level
or inside a function (a lazy import is still a dependency), except those under
``if TYPE_CHECKING:``. The graph is a networkx ``DiGraph`` of module names.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "capturelint"

# The check pipeline and the reporters: they know capture, not an engine.
CHECKER = (
    "capturelint.tracer", "capturelint.analyzer", "capturelint.rules", "capturelint.graph", "capturelint.regions",
    "capturelint.report", "capturelint.formats", "capturelint.findings", "capturelint.harness", "capturelint.pipeline",
    "capturelint.region_changes", "capturelint.render", "capturelint.snapshot", "capturelint.baseline",
    "capturelint.reporters", "capturelint.output", "capturelint.invariants",
)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def import_graph() -> nx.DiGraph:
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = _type_checking_lines(tree)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(tree):
            if getattr(node, "lineno", None) in skip:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph.add_edge(name, target)
    return graph


def _in(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


GRAPH = import_graph()


def test_the_graph_sees_the_package():
    assert {"capturelint.tracer", "capturelint.runtime.protocol", "capturelint.adapters.bundled"} <= set(GRAPH)
    assert GRAPH.has_edge("capturelint.tracer", "capturelint.runtime.protocol")


def test_no_import_cycles():
    cycles = sorted(sorted(c) for c in nx.simple_cycles(GRAPH))
    assert cycles == [], f"import cycles: {cycles[:5]}"


@pytest.mark.parametrize("module", sorted(m for m in GRAPH if _in(m, CHECKER)))
def test_the_checker_imports_no_engine_and_no_adapter(module):
    reached = nx.descendants(GRAPH, module)
    bad = sorted(m for m in reached if _in(m, ("capturelint.engine", "capturelint.adapters")))
    assert bad == [], f"{module} reaches {bad}"


@pytest.mark.parametrize("module", sorted(m for m in GRAPH if _in(m, ("capturelint.runtime",))))
def test_the_runtime_imports_only_the_runtime(module):
    outside = sorted(m for m in GRAPH.successors(module) if not _in(m, ("capturelint.runtime",)))
    assert outside == [], f"{module} imports {outside}"


@pytest.mark.parametrize("module", sorted(m for m in GRAPH if _in(m, ("capturelint.engine",))))
def test_the_engine_imports_no_checker(module):
    bad = sorted(m for m in GRAPH.successors(module) if _in(m, CHECKER + ("capturelint.adapters",)))
    assert bad == [], f"{module} imports {bad}"


def test_checker_modules_reach_a_runtime_only_through_the_protocol():
    for module in GRAPH:
        if not _in(module, CHECKER):
            continue
        runtime = sorted(m for m in GRAPH.successors(module) if _in(m, ("capturelint.runtime",)))
        allowed = {"capturelint.runtime.protocol", "capturelint.runtime", "capturelint.runtime.emulated"}
        extra = [m for m in runtime if m not in allowed]
        assert extra == [], f"{module} imports {extra}; the checker knows a runtime only through runtime.protocol"


def test_nothing_imports_the_cli():
    # exit statuses live in capturelint.errors; the CLI decides them, commands return them
    # (``python -m capturelint`` runs the program: the one importer)
    importers = sorted(m for m in GRAPH.predecessors("capturelint.cli") if m != "capturelint.__main__")
    assert importers == [], f"{importers} import capturelint.cli"


def test_the_comparison_and_the_file_format_are_apart():
    # snapshot.py is the file format; comparing is region_changes; the gate is baseline
    assert not nx.has_path(GRAPH, "capturelint.snapshot", "capturelint.region_changes")
    assert not nx.has_path(GRAPH, "capturelint.region_changes", "capturelint.baseline")
    assert not any(_in(m, ("capturelint.render",)) for m in nx.descendants(GRAPH, "capturelint.report"))
