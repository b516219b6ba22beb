"""The rooms of capturelint and their one-way doors, checked on the source (no import runs).

The design's architecture page ("Rooms and one-way doors", "Checks on the picture")
draws the picture; this module is that picture as data. Every module of the package sits
in exactly one room (``ROOMS``, lowest first; a name covers its submodules), and a module
in no room fails until it is placed:

- **runtime** (``runtime/``: protocol, op-schema reader, frame walker, the emulated
  primitive, the breakable runtime);
- **base**: the package root, ``errors``, ``limits``, ``output``, ``options``, ``inputs``
  (bounded reading), ``interrupts`` (signals), ``hosting`` (code a command runs can
  neither end the process nor move its working folder), ``sources`` (the engine's source read
  for reports), ``lists`` (long lists cut at five): values and plumbing that every room
  above the runtime may import;
- **engine** (``engine/``): the bundled DeepSeek V4 server, with its own CLI group
  ``engine.cli`` (``commands.COMMANDS`` names it by a string; no command imports it);
- **model**, the report model: the capture record ``records``, ``findings`` and ``finding_keys``, the region
  graph ``graph``, ``regions``, ``report``, ``shard``, the region map file ``snapshot``,
  ``region_changes`` and ``waivers`` (suppressions, accepted findings): what reporters render;
- **reporters**: ``reporters`` (the registry: each command's formats), ``formats/`` (what
  another program reads: SARIF, GitHub workflow commands), ``render/`` (what a person
  looks at: Rich, HTML, Graphviz), a split the door ``format_draws_for_a_person`` keeps;
- the check pipeline, lowest first: **tracer** (``tracer``, ``objects``, ``naming``,
  ``shadow_isolation``, ``memory_watch``), **analyzer**,
  **rules** (``rules/``, ``invariants``), **check** (``harness``, ``pipeline``,
  ``settings``, ``common_options``, ``suggest``, ``baseline``, ``merge``, ``acceptance``);
- **adapters** (``adapters/``, and ``target``, the public face of the target adapter);
- **api** (``api``, ``pytest_plugin``): the Python API the commands are a layer over, and
  the pytest plugin over it;
- **commands** (``commands/``) and **cli** (``cli``, ``__main__``, ``launch``: the program's first code).

The doors (each a function from an import graph to the edges that break it, in
``DOORS``): no import goes up to a higher room; the runtime imports only the runtime,
base only base and ``runtime.protocol``, the engine only the runtime and base; the
checker (model, reporters, check pipeline) imports no engine and no adapter, and of the
runtime only ``runtime.protocol`` save the modules ``RUNTIME_USERS`` names; reporters
import only the report model, and only commands import reporters; an adapter imports no
other adapter's modules (``adapters.common`` is what they share, ``adapters.registry``
may import every adapter), only the bundled adapter imports the engine and only the vLLM
adapter imports vllm; the API, commands and the CLI import no engine and no runtime, and of the
adapters only the registry; no import cycle. Nothing outside ``adapters/registry.py``
compares an engine's name (``test_nothing_outside_the_registry_switches_on_the_engine``),
and no module takes another's private name (``from X import _name``, ``X._name``:
``test_no_module_takes_another_ones_private_names``).

Every ``import`` and ``from ... import`` of the package counts, at module level or in a
function (a lazy import is still a dependency), and so does one under ``if
TYPE_CHECKING:`` (a module typed against another knows it): the doors run on ``TYPED``;
``GRAPH`` leaves those out (what runs). The tests of the test run the same doors on a
scratch copy of the package with one line added, and a breach must show.
"""

from __future__ import annotations

import ast
import collections
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import networkx as nx
import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "capturelint"
ROOT = "capturelint"

# Known breaches, as (importer, imported) edges: none since the adapter registry, the
# options module and the reporters' own fixes. A breach not listed fails its door; an
# entry that no longer occurs fails test_every_known_violation_still_occurs: the list
# only shrinks.
KNOWN_VIOLATIONS: set[tuple[str, str]] = set()

# Comparisons of an engine's name outside adapters/registry.py, as (file in the package,
# the comparison); listed once per occurrence. The registry work emptied it.
KNOWN_ENGINE_SWITCHES: tuple[tuple[str, str], ...] = ()

ROOMS: dict[str, tuple[str, ...]] = {
    "runtime": ("capturelint.runtime",),
    "base": (ROOT, "capturelint.errors", "capturelint.limits", "capturelint.output", "capturelint.options",
             "capturelint.inputs", "capturelint.interrupts", "capturelint.sources", "capturelint.hosting",
             "capturelint.lists"),
    "engine": ("capturelint.engine",),
    "model": ("capturelint.records", "capturelint.finding_keys", "capturelint.findings", "capturelint.graph", "capturelint.regions",
              "capturelint.report", "capturelint.shard", "capturelint.snapshot", "capturelint.region_changes",
              "capturelint.waivers"),
    "reporters": ("capturelint.reporters", "capturelint.formats", "capturelint.render"),
    "tracer": ("capturelint.tracer", "capturelint.objects", "capturelint.naming", "capturelint.shadow_isolation",
               "capturelint.memory_watch"),
    "analyzer": ("capturelint.analyzer",),
    "rules": ("capturelint.rules", "capturelint.invariants"),
    "check": ("capturelint.harness", "capturelint.pipeline", "capturelint.settings", "capturelint.suggest",
              "capturelint.baseline", "capturelint.merge", "capturelint.acceptance", "capturelint.common_options"),
    "adapters": ("capturelint.adapters", "capturelint.target"),
    "api": ("capturelint.api", "capturelint.pytest_plugin"),
    "commands": ("capturelint.commands",),
    "cli": ("capturelint.cli", "capturelint.__main__", "capturelint.launch"),
}
CHECKER = ("model", "reporters", "tracer", "analyzer", "rules", "check")
FRONT = ("api", "commands", "cli")

# runtime.protocol is the vocabulary every checker module may know; of the rest of the
# runtime, the one op-schema reader serves the tracer, the one frame walker the modules
# that walk frames, and the emulated primitive the pipeline, which installs it for every
# adapter. A checker module imports nothing else of a runtime.
PROTOCOL = "capturelint.runtime.protocol"
RUNTIME_USERS = {
    "capturelint.runtime.schema": {"capturelint.tracer", "capturelint.shadow_isolation", "capturelint.memory_watch"},
    "capturelint.runtime.frames": {"capturelint.tracer", "capturelint.memory_watch", "capturelint.harness",
                                   "capturelint.suggest"},
    "capturelint.runtime.emulated": {"capturelint.pipeline"},
}

# What adapters share, and the registry keyed by engine name (which may import them all).
REGISTRY = "capturelint.adapters.registry"
ADAPTERS_SHARED = {"capturelint.adapters", "capturelint.adapters.common", REGISTRY}

# The engine families (--engine); an adapter's family is its package (or module) under adapters/.
ENGINE_NAMES = ("bundled", "vllm")


# ------------------------------------------------------------------ the graph


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _under_type_checking(tree: ast.AST) -> set[int]:
    """ids of the nodes under ``if TYPE_CHECKING:``."""
    ids: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            ids.update(id(n) for child in node.body for n in ast.walk(child))
    return ids


def import_graph(package: Path = PACKAGE, type_checking: bool = True) -> nx.DiGraph:
    """The import graph of the package's modules; without ``type_checking``, imports under
    ``if TYPE_CHECKING:`` are left out. ``from a import b`` is an edge to ``a.b`` when that
    is a module, else to ``a``. Each node's ``third_party`` holds the top-level names of
    what it imports from outside the package."""
    modules = {module_name(p, package): p for p in package.rglob("*.py")}
    graph = nx.DiGraph()
    graph.add_nodes_from((m, {"third_party": set()}) for m in modules)

    def resolve(target: str) -> str:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        return target

    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = set() if type_checking else _under_type_checking(tree)
        package_name = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                bases, targets = [a.name for a in node.names], [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    kept = package_name.split(".")[: len(package_name.split(".")) - node.level + 1]
                    base = ".".join(kept + ([base] if base else []))
                bases = [base]
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            for base in bases:
                if base.split(".")[0] != ROOT:
                    graph.nodes[name]["third_party"].add(base.split(".")[0])
            for target in targets:
                target = resolve(target)
                if target and target != name:
                    graph.add_edge(name, target)
    return graph


GRAPH = import_graph(type_checking=False)
TYPED = import_graph()


def _in(module: str, names: tuple[str, ...]) -> bool:
    return any(module == n or (n != ROOT and module.startswith(n + ".")) for n in names)


def rooms_of(module: str) -> list[str]:
    return [room for room, names in ROOMS.items() if _in(module, names)]


def room_of(module: str) -> str | None:
    rooms = rooms_of(module)
    return rooms[0] if len(rooms) == 1 else None


def family(module: str) -> str:
    """An adapter's engine family: its package or module under ``adapters/``
    (``adapters.vllm.runners.real`` -> ``vllm``, ``adapters.plain.target`` -> ``plain``);
    outside it, the family whose public face it is (``capturelint.target`` -> ``plain``),
    else the module's own name."""
    parts = module.split(".")
    if module in PUBLIC_FACES:
        return PUBLIC_FACES[module]
    return parts[2] if parts[:2] == [ROOT, "adapters"] and len(parts) > 2 else parts[-1]


# Modules outside adapters/ that are an adapter family's public face, by family.
PUBLIC_FACES = {"capturelint.target": "plain"}  # the user's import of the target adapter


Edge = tuple[str, str]


def _edges(graph: nx.DiGraph) -> Iterator[tuple[str, str | None, str, str | None]]:
    for a, b in graph.edges:
        yield a, room_of(a), b, room_of(b)


# ------------------------------------------------------------------ the doors


def unplaced_modules(graph: nx.DiGraph) -> list[str]:
    """Modules in no room, or in more than one."""
    return sorted(m for m in graph if len(rooms_of(m)) != 1)


def upward_arrows(graph: nx.DiGraph) -> list[Edge]:
    """A module imports nothing of a room above its own (ROOMS, lowest first)."""
    order = list(ROOMS)
    return sorted((a, b) for a, ra, b, rb in _edges(graph) if ra and rb and order.index(ra) < order.index(rb))


def import_cycles(graph: nx.DiGraph) -> list[Edge]:
    """No two modules import each other, however far round: the edges on a cycle."""
    component = {m: i for i, c in enumerate(nx.strongly_connected_components(graph)) for m in c if len(c) > 1}
    return sorted((a, b) for a, b in graph.edges if a in component and component[a] == component.get(b))


def runtime_imports_beyond_runtime(graph: nx.DiGraph) -> list[Edge]:
    """runtime/ -> torch only."""
    return sorted((a, b) for a, ra, b, rb in _edges(graph) if ra == "runtime" and rb not in (None, "runtime"))


def base_imports_beyond_base(graph: nx.DiGraph) -> list[Edge]:
    """What every room may import imports only its own kind and the runtime's vocabulary."""
    return sorted((a, b) for a, ra, b, rb in _edges(graph)
                  if ra == "base" and rb not in (None, "base") and b != PROTOCOL)


def engine_imports_beyond_runtime(graph: nx.DiGraph) -> list[Edge]:
    """engine/ -> runtime/ (and base)."""
    allowed = (None, "engine", "runtime", "base")
    return sorted((a, b) for a, ra, b, rb in _edges(graph) if ra == "engine" and rb not in allowed)


def checker_imports_engine_or_adapter(graph: nx.DiGraph) -> list[Edge]:
    """The checker knows capture, not an engine."""
    return sorted((a, b) for a, ra, b, rb in _edges(graph) if ra in CHECKER and rb in ("engine", "adapters"))


def checker_imports_runtime(graph: nx.DiGraph) -> list[Edge]:
    """Check pipeline -> runtime/protocol ONLY (and RUNTIME_USERS)."""
    return sorted((a, b) for a, ra, b, rb in _edges(graph)
                  if ra in CHECKER and rb == "runtime" and b != PROTOCOL and a not in RUNTIME_USERS.get(b, ()))


def reporter_imports_beyond_model(graph: nx.DiGraph) -> list[Edge]:
    """Reporters -> report model only."""
    allowed = (None, "reporters", "model", "base")
    return sorted((a, b) for a, ra, b, rb in _edges(graph) if ra == "reporters" and rb not in allowed and b != PROTOCOL)


def format_draws_for_a_person(graph: nx.DiGraph) -> list[Edge]:
    """formats/ writes what another program reads against its schema (SARIF, GitHub
    workflow commands); what a person looks at (Rich, HTML, Graphviz) is render/'s: a
    module of formats/ imports nothing of render/ and no Rich (docs/house.md)."""
    formats = ("capturelint.formats",)
    bad = [(a, b) for a, ra, b, rb in _edges(graph) if _in(a, formats) and _in(b, ("capturelint.render",))]
    bad += [(m, "rich") for m in graph if _in(m, formats) and "rich" in graph.nodes[m]["third_party"]]
    return sorted(bad)


def reporter_importers(graph: nx.DiGraph) -> list[Edge]:
    """Commands render through the reporters; nothing below them does."""
    return sorted((a, b) for a, ra, b, rb in _edges(graph)
                  if rb == "reporters" and ra not in (None, "reporters", "commands"))


def adapter_imports_other_adapter(graph: nx.DiGraph) -> list[Edge]:
    """An adapter imports no other adapter: only its own family's modules and what they
    share; the shared modules import no adapter, except the registry, which keys them all."""
    bad = []
    for a, ra, b, rb in _edges(graph):
        if ra != "adapters" or rb != "adapters" or b in ADAPTERS_SHARED or a == REGISTRY:
            continue
        if a in ADAPTERS_SHARED or family(a) != family(b):
            bad.append((a, b))
    return sorted(bad)


def adapter_imports_engine(graph: nx.DiGraph) -> list[Edge]:
    """adapters/ -> engine/ (bundled only)."""
    return sorted((a, b) for a, ra, b, rb in _edges(graph)
                  if ra == "adapters" and rb == "engine" and family(a) != "bundled")


def vllm_outside_the_vllm_adapter(graph: nx.DiGraph) -> list[Edge]:
    """adapters/ -> vllm (vllm only)."""
    return sorted((m, "vllm") for m in graph if "vllm" in graph.nodes[m]["third_party"]
                  and not (room_of(m) == "adapters" and family(m) == "vllm"))


def command_imports_engine_or_runtime(graph: nx.DiGraph) -> list[Edge]:
    """Commands reach engines through the adapter registry, never directly."""
    return sorted((a, b) for a, ra, b, rb in _edges(graph) if ra in FRONT and rb in ("engine", "runtime"))


def command_imports_adapter_beyond_registry(graph: nx.DiGraph) -> list[Edge]:
    """Commands know adapters through the registry only."""
    return sorted((a, b) for a, ra, b, rb in _edges(graph) if ra in FRONT and rb == "adapters" and b != REGISTRY)


DOORS: dict[str, Callable[[nx.DiGraph], list[Edge]]] = {f.__name__: f for f in (
    upward_arrows, import_cycles, runtime_imports_beyond_runtime, base_imports_beyond_base,
    engine_imports_beyond_runtime, checker_imports_engine_or_adapter, checker_imports_runtime,
    reporter_imports_beyond_model, format_draws_for_a_person, reporter_importers, adapter_imports_other_adapter, adapter_imports_engine,
    vllm_outside_the_vllm_adapter, command_imports_engine_or_runtime, command_imports_adapter_beyond_registry,
)}


def new_violations(door: str, graph: nx.DiGraph) -> list[Edge]:
    return [e for e in DOORS[door](graph) if e not in KNOWN_VIOLATIONS]


# ---------------------------------------------------------- switches on engines


def _names_engine(node: ast.AST) -> bool:
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return name.lower() in ("engine", "engine_name")


def _is_engine_name(node: ast.AST, own: str) -> bool:
    values = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return any(isinstance(v, ast.Constant) and v.value in ENGINE_NAMES and v.value != own for v in values)


def engine_switches(package: Path = PACKAGE) -> list[tuple[str, str]]:
    """Comparisons (``==``, ``!=``, ``in``, ``not in``) that ask which engine this is: of an
    engine (``engine``, ``plan.engine``) with anything but another engine, or of anything
    with an engine's name. An adapter may say its own family's name (``"vllm" in
    sys.modules`` in the vLLM adapter); adapters/registry.py may ask."""
    found = []
    for path in sorted(package.rglob("*.py")):
        where = path.relative_to(package).as_posix()
        if where == "adapters/registry.py":
            continue
        own = family(module_name(path, package)) if where.startswith("adapters/") else ""
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Compare) or not all(
                    isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) for op in node.ops):
                continue
            sides = [node.left, *node.comparators]
            engines = [_names_engine(s) for s in sides]
            if (any(engines) and not all(engines)) or any(_is_engine_name(s, own) for s in sides):
                found.append((where, ast.unparse(node)))
    return found


def new_engine_switches(package: Path = PACKAGE) -> list[tuple[str, str]]:
    new = collections.Counter(engine_switches(package)) - collections.Counter(KNOWN_ENGINE_SWITCHES)
    return sorted(new.elements())


# ---------------------------------------------------------- private names stay home


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_imports(package: Path = PACKAGE) -> list[tuple[str, str]]:
    """A module's private names (``_name``) are its own: no module of the package takes
    one from another, by ``from X import _name`` or as ``X._name`` of a module it
    imported; a name two modules share is public (or lives in one module). As
    (importing module, ``X._name``)."""
    modules = {module_name(p, package): p for p in package.rglob("*.py")}
    found = []
    for name, path in sorted(modules.items()):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        package_name = name if path.name == "__init__.py" else name.rpartition(".")[0]
        bound: dict[str, str] = {}  # local name -> the package module it is
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    kept = package_name.split(".")[: len(package_name.split(".")) - node.level + 1]
                    base = ".".join(kept + ([base] if base else []))
                if base.split(".")[0] != ROOT:
                    continue
                for alias in node.names:
                    if _private(alias.name):
                        found.append((name, f"{base}.{alias.name}"))
                    if f"{base}.{alias.name}" in modules:
                        bound[alias.asname or alias.name] = f"{base}.{alias.name}"
            elif isinstance(node, ast.Import):
                bound.update((a.asname, a.name) for a in node.names if a.asname and a.name.split(".")[0] == ROOT)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound
                    and _private(node.attr) and bound[node.value.id] != name):
                found.append((name, f"{bound[node.value.id]}.{node.attr}"))
    return sorted(set(found))


# ------------------------------------------------------------ the real package


def test_the_graph_sees_the_package():
    assert {"capturelint.tracer", "capturelint.runtime.protocol", "capturelint.adapters.bundled.plan"} <= set(GRAPH)
    assert GRAPH.has_edge("capturelint.tracer", "capturelint.runtime.protocol")
    # from capturelint.runtime import frames: an edge to the module, not to the package
    assert GRAPH.has_edge("capturelint.harness", "capturelint.runtime.frames")
    assert not GRAPH.has_edge("capturelint.harness", "capturelint.runtime")
    # imports for type checking are in TYPED only
    assert TYPED.has_edge("capturelint.rules.base", "capturelint.analyzer")
    assert not GRAPH.has_edge("capturelint.rules.base", "capturelint.analyzer")
    assert GRAPH.edges <= TYPED.edges
    assert "vllm" in TYPED.nodes["capturelint.adapters.vllm.install"]["third_party"]


def test_every_module_is_in_one_room():
    # a new module must be placed in ROOMS (and so under its doors)
    assert unplaced_modules(TYPED) == [], {m: rooms_of(m) for m in unplaced_modules(TYPED)}


@pytest.mark.parametrize("door", DOORS)
def test_door(door):
    breaches = new_violations(door, TYPED)
    assert breaches == [], f"{DOORS[door].__doc__.strip()} Breached by: {breaches}"


def test_every_known_violation_still_occurs():
    # KNOWN_VIOLATIONS only shrinks: remove an entry once the breach is gone
    occurring = {e for door in DOORS.values() for e in door(TYPED)}
    assert sorted(KNOWN_VIOLATIONS - occurring) == []


def test_no_import_cycles_even_under_type_checking():
    assert import_cycles(TYPED) == []


def test_the_engine_cli_is_the_one_command_outside_commands():
    # the engine group is the engine's own CLI: listed by name, imported by capturelint.cli
    # when run, so no command module imports the engine
    from capturelint.commands import COMMANDS

    outside = sorted(e.module for e in COMMANDS.values() if not _in(e.module, ("capturelint.commands",)))
    assert outside == ["capturelint.engine.cli"]


def test_nothing_outside_the_registry_switches_on_the_engine():
    assert new_engine_switches() == []


def test_every_known_engine_switch_still_occurs():
    gone = collections.Counter(KNOWN_ENGINE_SWITCHES) - collections.Counter(engine_switches())
    assert sorted(gone.elements()) == []


def test_the_comparison_and_the_file_format_are_apart():
    # snapshot.py is the file format; comparing is region_changes; the gate is baseline
    assert not nx.has_path(TYPED, "capturelint.snapshot", "capturelint.region_changes")
    assert not nx.has_path(TYPED, "capturelint.region_changes", "capturelint.baseline")


def test_the_records_import_no_torch():
    # the capture record is read without an engine: importing it with torch unimportable works
    code = "import sys; sys.modules['torch'] = None; import capturelint.records as r; print(r.Stream.__name__)"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=PACKAGE.parent)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "Stream"
    # the protocol's vocabulary, and the list cutter of its lint messages (torch-free both)
    assert sorted(nx.descendants(GRAPH, "capturelint.records")) == ["capturelint.lists", "capturelint.runtime.protocol"]


def test_every_record_type_is_documented_where_defined():
    import enum

    import capturelint.records as records

    types = [v for v in vars(records).values() if isinstance(v, type) and v.__module__ == records.__name__]
    assert {"Stream", "OpRecord", "TensorUse", "Segment", "BreakArg", "Origin", "StreamKind"} <= {t.__name__ for t in types}
    for t in types:
        doc = t.__dict__.get("__doc__") or ""
        generated = doc.startswith(t.__name__ + "(") or (issubclass(t, enum.Enum) and doc == enum.Enum.__doc__)
        assert doc and not generated, f"records.{t.__name__} has no docstring of its own"


def test_no_module_takes_another_ones_private_names():
    assert private_imports() == []


@pytest.mark.parametrize("needle, home", [
    ("alias_info", "runtime/schema.py"),  # the one op-schema reader
    ("_getframe", "runtime/frames.py"),  # the one frame walker
    (".f_back", "runtime/frames.py"),
    (".tb_next", "runtime/frames.py"),
])
def test_one_op_schema_reader_and_one_frame_walker(needle, home):
    users = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if needle in p.read_text(encoding="utf-8"))
    assert users == [home]


# ------------------------------------------------------------ tests of the test


def scratch(tmp_path: Path, edits: dict[str, str]) -> Path:
    """A copy of the package with each text of ``edits`` appended to its file (relative to
    the package; a new file where there is none)."""
    package = tmp_path / ROOT
    shutil.copytree(PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__"))
    for where, text in edits.items():
        with (package / where).open("a", encoding="utf-8") as f:
            f.write("\n" + text + "\n")
    return package


@pytest.mark.parametrize("door, where, line, breach", [
    # the vLLM adapter imports the bundled engine
    ("adapter_imports_engine", "adapters/vllm/plan.py", "import capturelint.engine.dsv4.ops",
     ("capturelint.adapters.vllm.plan", "capturelint.engine.dsv4.ops")),
    ("adapter_imports_engine", "adapters/vllm/kernels/reference.py", "from capturelint.engine.dsv4 import ops",
     ("capturelint.adapters.vllm.kernels.reference", "capturelint.engine.dsv4.ops")),
    ("adapter_imports_engine", "adapters/common.py", "from capturelint.engine import llm",
     ("capturelint.adapters.common", "capturelint.engine.llm")),
    # an adapter imports another adapter, or what they share imports one
    ("adapter_imports_other_adapter", "adapters/bundled/plan.py", "from capturelint.adapters.vllm import plan",
     ("capturelint.adapters.bundled.plan", "capturelint.adapters.vllm.plan")),
    ("adapter_imports_other_adapter", "adapters/vllm/runners/real.py", "from capturelint.adapters.bundled import plan",
     ("capturelint.adapters.vllm.runners.real", "capturelint.adapters.bundled.plan")),
    ("adapter_imports_other_adapter", "adapters/common.py", "from capturelint.adapters.bundled.plan import CheckPlan",
     ("capturelint.adapters.common", "capturelint.adapters.bundled.plan")),
    ("vllm_outside_the_vllm_adapter", "adapters/bundled/plan.py", "import vllm.config",
     ("capturelint.adapters.bundled.plan", "vllm")),
    # a command imports the engine, a runtime, or an adapter past the registry
    ("command_imports_engine_or_runtime", "commands/check.py", "from capturelint.engine.llm import LLM",
     ("capturelint.commands.check", "capturelint.engine.llm")),
    ("command_imports_engine_or_runtime", "commands/rules.py", "import capturelint.runtime.emulated",
     ("capturelint.commands.rules", "capturelint.runtime.emulated")),
    ("command_imports_adapter_beyond_registry", "commands/merge.py", "from capturelint.adapters import vllm",
     ("capturelint.commands.merge", "capturelint.adapters.vllm")),
    # a cycle only under TYPE_CHECKING
    ("import_cycles", "findings.py",
     "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from capturelint.pipeline import check_all",
     ("capturelint.findings", "capturelint.pipeline")),
    # the region graph imports the emulated primitive (the pipeline's alone)
    ("checker_imports_runtime", "graph.py", "from capturelint.runtime.emulated import emulate_cuda",
     ("capturelint.graph", "capturelint.runtime.emulated")),
    ("checker_imports_runtime", "harness.py", "from capturelint.runtime import schema",
     ("capturelint.harness", "capturelint.runtime.schema")),
    # the checker modules the old CHECKER list left out
    ("checker_imports_engine_or_adapter", "suggest.py", "import capturelint.engine.llm",
     ("capturelint.suggest", "capturelint.engine.llm")),
    ("checker_imports_engine_or_adapter", "merge.py", "from capturelint.engine.dsv4 import ops",
     ("capturelint.merge", "capturelint.engine.dsv4.ops")),
    ("checker_imports_runtime", "settings.py", "from capturelint.runtime.breakable import BreakableGraph",
     ("capturelint.settings", "capturelint.runtime.breakable")),
    ("checker_imports_runtime", "shard.py", "import capturelint.runtime.emulated",
     ("capturelint.shard", "capturelint.runtime.emulated")),
    # reporters, and who imports them
    ("reporter_imports_beyond_model", "render/dot.py", "from capturelint.pipeline import check_all",
     ("capturelint.render.dot", "capturelint.pipeline")),
    ("reporter_imports_beyond_model", "render/html.py", "from capturelint.api import check",
     ("capturelint.render.html", "capturelint.api")),
    ("format_draws_for_a_person", "formats/sarif.py", "from capturelint.render.check import render_rich",
     ("capturelint.formats.sarif", "capturelint.render.check")),
    ("format_draws_for_a_person", "formats/github.py", "from rich.text import Text",
     ("capturelint.formats.github", "rich")),
    ("reporter_importers", "pipeline.py", "from capturelint.render.check import render_rich",
     ("capturelint.pipeline", "capturelint.render.check")),
    # upward, and the lowest rooms
    ("upward_arrows", "report.py", "from capturelint.harness import trace_run",
     ("capturelint.report", "capturelint.harness")),
    ("upward_arrows", "analyzer.py", "from capturelint.rules import RULES",
     ("capturelint.analyzer", "capturelint.rules")),
    ("upward_arrows", "report.py", "from capturelint.render.check import render_rich",
     ("capturelint.report", "capturelint.render.check")),
    ("upward_arrows", "commands/check.py", "from capturelint.cli import main",
     ("capturelint.commands.check", "capturelint.cli")),
    ("engine_imports_beyond_runtime", "engine/llm.py", "from capturelint.findings import Finding",
     ("capturelint.engine.llm", "capturelint.findings")),
    ("runtime_imports_beyond_runtime", "runtime/emulated.py", "from capturelint.errors import CapturelintError",
     ("capturelint.runtime.emulated", "capturelint.errors")),
    ("base_imports_beyond_base", "errors.py", "from capturelint.runtime.frames import user_frame",
     ("capturelint.errors", "capturelint.runtime.frames")),
])
def test_a_scratch_breach_fails_its_door(tmp_path, door, where, line, breach):
    graph = import_graph(scratch(tmp_path, {where: line}))
    assert breach not in KNOWN_VIOLATIONS
    assert breach in new_violations(door, graph)


def test_a_cycle_under_type_checking_counts(tmp_path):
    package = scratch(tmp_path, {"findings.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                                "    from capturelint.pipeline import check_all"})
    assert import_cycles(import_graph(package, type_checking=False)) == []
    assert ("capturelint.pipeline", "capturelint.findings") in import_cycles(import_graph(package))


def test_a_new_module_must_be_placed(tmp_path):
    package = scratch(tmp_path, {"newroom.py": "X = 1", "adapters/common.py": "X = 1"})
    assert unplaced_modules(import_graph(package)) == ["capturelint.newroom"]


def test_the_doors_let_through_what_the_picture_allows(tmp_path):
    package = scratch(tmp_path, {
        "adapters/registry.py": "from capturelint.adapters.vllm import plan",
        "adapters/common.py": "from capturelint.pipeline import check_all",
        "adapters/vllm/install.py": "from capturelint.adapters.common import check_all",
        "adapters/vllm/runners/spec.py": "from capturelint.adapters.vllm.runners.reproduced import Batch",
        "adapters/bundled/plan.py": "from capturelint.engine.dsv4 import ops",
        "commands/check.py": "from capturelint.adapters.registry import bundled",
        "options.py": "from capturelint.runtime.protocol import BreakOutputs",
        "snapshot.py": "from capturelint.options import BreakOutputs",
    })
    graph = import_graph(package)
    assert graph.has_edge("capturelint.adapters.registry", "capturelint.adapters.vllm.plan")
    assert unplaced_modules(graph) == []
    assert {door: new_violations(door, graph) for door in DOORS} == {door: [] for door in DOORS}


@pytest.mark.parametrize("where, line, switch", [
    ("commands/check.py", 'x = settings.engine != "vllm"', "settings.engine != 'vllm'"),
    ("pipeline.py", 'x = engine == "bundled"', "engine == 'bundled'"),
    ("adapters/plain/target.py", 'x = kind in ("bundled", "vllm")', "kind in ('bundled', 'vllm')"),
    ("adapters/vllm/install.py", 'x = name == "bundled"', "name == 'bundled'"),
])
def test_a_scratch_engine_switch_is_found(tmp_path, where, line, switch):
    assert new_engine_switches(scratch(tmp_path, {where: line})) == [(where, switch)]


@pytest.mark.parametrize("where, line, breach", [
    ("adapters/vllm/runners/spec.py", "from capturelint.adapters.vllm.model import _LAYER_NAMES",
     ("capturelint.adapters.vllm.runners.spec", "capturelint.adapters.vllm.model._LAYER_NAMES")),
    ("commands/check.py", "from .common import _hidden", ("capturelint.commands.check", "capturelint.commands.common._hidden")),
    ("adapters/vllm/runners/real.py", "from capturelint.adapters.vllm import install as i\nx = i._shim_lock",
     ("capturelint.adapters.vllm.runners.real", "capturelint.adapters.vllm.install._shim_lock")),
])
def test_a_scratch_private_import_is_found(tmp_path, where, line, breach):
    assert private_imports(scratch(tmp_path, {where: line})) == [breach]


def test_a_modules_own_private_names_and_dunders_are_no_breach(tmp_path):
    package = scratch(tmp_path, {
        "adapters/vllm/model.py": "from capturelint.adapters.vllm import model as me\nx = me._distributed_ready",
        "adapters/vllm/plan.py": "from capturelint import __name__ as pkg_name\nimport torch._dynamo",
    })
    assert private_imports(package) == []


def test_the_registry_and_an_adapter_naming_itself_are_no_switch(tmp_path):
    package = scratch(tmp_path, {
        "adapters/registry.py": 'x = plan.engine == "vllm"',
        "adapters/vllm/kernels/reference.py": 'x = "vllm" in sys.modules',
        "baseline.py": "x = old.engine == new.engine",  # the same engine twice: not which one
    })
    assert new_engine_switches(package) == []
