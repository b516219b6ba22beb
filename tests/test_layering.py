"""The import layering of docs/architecture.md, checked on the source (no import runs).

Every ``import`` and ``from ... import`` of capturelint's modules counts, at module level
or inside a function (a lazy import is still a dependency); those under ``if
TYPE_CHECKING:`` count for cycles and for the analyzer (``TYPED``). The graphs are
networkx ``DiGraph`` objects of module names.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "capturelint"

# The check pipeline and the reporters: they know capture, not an engine.
CHECKER = (
    "capturelint.tracer", "capturelint.analyzer", "capturelint.rules", "capturelint.graph", "capturelint.regions",
    "capturelint.report", "capturelint.formats", "capturelint.findings", "capturelint.harness", "capturelint.pipeline",
    "capturelint.region_changes", "capturelint.render", "capturelint.snapshot", "capturelint.baseline",
    "capturelint.reporters", "capturelint.output", "capturelint.invariants", "capturelint.records",
    "capturelint.objects",
)

# What the checker may import of runtime/: the vocabulary, and the one op-schema reader and
# one frame walker that the tracer shares with the emulated primitive.
RUNTIME_FOR_CHECKER = {
    "capturelint.runtime.protocol", "capturelint.runtime", "capturelint.runtime.emulated",
    "capturelint.runtime.schema", "capturelint.runtime.frames",
}


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


def import_graph(type_checking: bool = False) -> nx.DiGraph:
    """The import graph; with ``type_checking``, imports for type checking count too."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = set() if type_checking else _type_checking_lines(tree)
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
TYPED = import_graph(type_checking=True)


def test_the_graph_sees_the_package():
    assert {"capturelint.tracer", "capturelint.runtime.protocol", "capturelint.adapters.bundled"} <= set(GRAPH)
    assert GRAPH.has_edge("capturelint.tracer", "capturelint.runtime.protocol")


def test_no_import_cycles():
    # counted with the imports for type checking: a cycle hidden under TYPE_CHECKING is
    # still two modules that cannot be understood apart
    assert GRAPH.edges <= TYPED.edges
    cycles = sorted(sorted(c) for c in nx.simple_cycles(TYPED))
    assert cycles == [], f"import cycles: {cycles[:5]}"


def test_the_analyzer_imports_no_rule():
    # tracer -> analyzer -> rules: the rules read the analyzer's views; the analyzer
    # calls whatever rules it is handed, by the check methods they implement
    reached = nx.descendants(TYPED, "capturelint.analyzer")
    assert not any(_in(m, ("capturelint.rules",)) for m in reached), sorted(reached)


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
        extra = [m for m in runtime if m not in RUNTIME_FOR_CHECKER]
        assert extra == [], f"{module} imports {extra}; the checker knows a runtime only through runtime.protocol"


def test_nothing_imports_the_cli():
    # exit statuses live in capturelint.errors; the CLI decides them, commands return them
    importers = sorted(m for m in GRAPH.predecessors("capturelint.cli"))
    assert importers == [], f"{importers} import capturelint.cli"


def test_the_comparison_and_the_file_format_are_apart():
    # snapshot.py is the file format; comparing is region_changes; the gate is baseline
    assert not nx.has_path(GRAPH, "capturelint.snapshot", "capturelint.region_changes")
    assert not nx.has_path(GRAPH, "capturelint.region_changes", "capturelint.baseline")
    assert not any(_in(m, ("capturelint.render",)) for m in nx.descendants(GRAPH, "capturelint.report"))


def test_the_records_import_no_torch():
    # the capture record is read without an engine: importing it with torch unimportable works
    code = "import sys; sys.modules['torch'] = None; import capturelint.records as r; print(r.Stream.__name__)"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=PACKAGE.parent)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "Stream"
    assert sorted(nx.descendants(GRAPH, "capturelint.records")) == ["capturelint.runtime.protocol"]


def test_every_record_type_is_documented_where_defined():
    import enum

    import capturelint.records as records

    types = [v for v in vars(records).values() if isinstance(v, type) and v.__module__ == records.__name__]
    assert {"Stream", "OpRecord", "TensorUse", "Segment", "BreakArg", "Origin", "StreamKind"} <= {t.__name__ for t in types}
    for t in types:
        doc = t.__dict__.get("__doc__") or ""
        generated = doc.startswith(t.__name__ + "(") or (issubclass(t, enum.Enum) and doc == enum.Enum.__doc__)
        assert doc and not generated, f"records.{t.__name__} has no docstring of its own"


@pytest.mark.parametrize("needle, home", [
    ("alias_info", "runtime/schema.py"),  # the one op-schema reader
    ("_getframe", "runtime/frames.py"),  # the one frame walker
    (".f_back", "runtime/frames.py"),
    (".tb_next", "runtime/frames.py"),
])
def test_one_op_schema_reader_and_one_frame_walker(needle, home):
    users = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if needle in p.read_text(encoding="utf-8"))
    assert users == [home]
