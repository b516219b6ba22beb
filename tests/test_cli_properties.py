"""A property of the whole command line: whatever the arguments, settings file and
``CAPTURELINT_THREADS``, a command ends with exit status 0, 1 or 2, prints no traceback,
and an error (2) is exactly one line on stderr.

Bounded to a few seconds: the engine is replaced by a fake that returns a clean report
at once (and a tripwire fails the test if a real configuration ever starts), ``--target``
only names modules and files that do not exist, and every file a command writes lands in
a temporary folder.
"""

from __future__ import annotations

import contextlib
import io
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from capturelint.cli import main
from capturelint.findings import Numerical
from capturelint.report import Checked, ConfigReport, Report
from capturelint.settings import _KEYS
from capturelint.snapshot import ConfigMap, EngineParams, RegionMap

# ------------------------------------------------------------------ strategies

WORDS = st.text(alphabet="abcXYZ019_-.,:/ ", max_size=8)
NUMBERS = st.sampled_from(["0", "1", "-1", "2", "4", "24", "257", "4097", "18446744073709551616", "1e3", "nan", "inf",
                           "-inf", "1.5", "10"])
MODES = st.sampled_from(["PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE", "NONE", "piecewise",
                         "PIECEWISE,FULL", "", ",", "SOMETIMES"])
FILES = st.sampled_from(["out.txt", "-", "missing/x.txt", ".", "", "pyproject.toml", "b.json", "sub/", "out.png"])
CODES = st.sampled_from(["CL101", "CL1", "CL", "cl9", "CL999", "", ",", "CL101,CL104", "E501"])
TARGETS = st.sampled_from(["nosuch_capturelint_module:f", "missing_target.py:f", "no-colon", ":f", "x.py:", "a:b:c"])

VALUE = st.one_of(WORDS, NUMBERS, MODES, FILES, CODES)

OPTIONS: dict[str, st.SearchStrategy] = {
    "--runner": st.sampled_from(["v1", "v2", "all", "V1", "v3", ""]),
    "--mode": MODES,
    "--eager-region": st.sampled_from(["narrow", "wide", "per-runner", "medium", ""]),
    "--fresh-metadata": st.none(),
    "--layers": NUMBERS,
    "--steps": NUMBERS,
    "--seed": NUMBERS,
    "--kernels": st.sampled_from(["torch", "triton", "cuda"]),
    "--break-outputs": st.sampled_from(["copy", "discard", "keep"]),
    "--platform": st.sampled_from(["cuda", "rocm", "cpu", "tpu"]),
    "--spec": st.sampled_from(["mtp", "dspark", "eagle", ""]),
    "--config": FILES,
    "--select": CODES,
    "--ignore": CODES,
    "--format": st.sampled_from(["rich", "json", "sarif", "github", "dot", "svg", "png", "html", "xml", ""]),
    "-o": FILES,
    "--exit-zero": st.none(),
    "--baseline": FILES,
    "--max-eager-growth": NUMBERS,
    "-v": st.none(),
    "--target": TARGETS,
    "--ops": st.none(),
    "--all-graphs": st.none(),
    "--no-check": st.none(),
    "--update": FILES,
    "--against-runner": st.sampled_from(["v1", "v2", "v3"]),
    "--against-mode": MODES,
    "--against-eager-region": st.sampled_from(["narrow", "wide", "x"]),
    "--json": st.none(),
    "--capture-sizes": st.sampled_from(["1,2,4", "x", "0", ""]),
    "-h": st.none(),
    "--bogus": st.none(),
}

COMMANDS = st.sampled_from([
    [], ["check"], ["check"], ["check"], ["show"], ["diff"], ["diff", "a.json"], ["diff", "a.json", "b.json"],
    ["snapshot"], ["rules"], ["rules", "CL101"], ["rules", "CL000"], ["engine"], ["engine", "run"], ["--version"],
    ["-h"], ["nosuchcommand"],
])  # not --debug: it prints tracebacks on purpose (tests/test_cli_promises.py)


@st.composite
def argument_lists(draw) -> list[str]:
    args = list(draw(COMMANDS))
    for name in draw(st.lists(st.sampled_from(sorted(OPTIONS)), max_size=5)):
        value = draw(OPTIONS[name])
        args.append(name)
        if value is not None:
            args.append(value)
    if draw(st.booleans()):
        args.append(draw(VALUE))  # a stray positional value
    return args


TOML_VALUES = st.sampled_from([
    '"v1"', '["v1", "v2"]', "[]", '["PIECEWISE"]', '["NONE"]', '"narrow"', '"medium"', '["CL1"]', '["CL999"]',
    '"CL101"', "4", "0", "-1", "18446744073709551616", "1.5", "nan", "inf", "true", '"json"', '"sarif"', '"xml"',
    '"b.json"', '""', "{ a = 1 }", '["x", 1]',
])


@st.composite
def settings_files(draw) -> bytes | None:
    kind = draw(st.sampled_from(["none", "table", "table", "broken", "binary"]))
    if kind == "none":
        return None
    if kind == "binary":
        return b"[tool.capturelint]\nsteps = 4 # \xff\n"
    if kind == "broken":
        return b"[tool.capturelint]\nrunners = = 1\n"
    keys = draw(st.lists(st.sampled_from(list(_KEYS) + ["runner", "unknown-key"]), max_size=4, unique=True))
    lines = [f"{key} = {draw(TOML_VALUES)}" for key in keys]
    return ("[tool.capturelint]\n" + "\n".join(lines) + "\n").encode()


# ------------------------------------------------------------------ the fakes

def _fake_report(plan, progress=None, shadow=True, static=False, keep_captures=False) -> Report:
    configs = [
        ConfigReport(str(runner), str(mode), str(plan.eager_region), [],
                     Numerical(str(runner), str(mode), 1.0, 0.0, 0.0, 3) if shadow else None, [],
                     checked=Checked(("CL101",), (), 3, 0, True) if shadow else Checked())
        for runner, mode in plan.configurations
    ]
    return Report(configs)


def _fake_regions(plan, progress=None) -> RegionMap:
    engine = EngineParams(plan.layers, plan.steps, plan.seed, plan.kernels, plan.fresh_metadata, plan.break_outputs)
    return RegionMap(engine, tuple(ConfigMap(str(r), str(m), str(plan.eager_region), ()) for r, m in plan.configurations))


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    """A folder to run in, the engine replaced by fakes, and a tripwire on real runs."""
    import capturelint.adapters.bundled.plan as bundled
    import capturelint.engine.cli as engine_cli
    import capturelint.pipeline as pipeline
    from capturelint.errors import CapturelintError

    real: list[str] = []

    def tripwire(*args, **kwargs):
        real.append("a real configuration started")
        raise CapturelintError("the property test must not run an engine")

    def fake_twin(config):
        raise CapturelintError("fake engine: not run in the property test")

    folder = tmp_path_factory.mktemp("cli-properties")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(bundled, "run_check", _fake_report)
        mp.setattr(bundled, "record_regions", _fake_regions)
        mp.setattr(pipeline, "check_configuration", tripwire)
        mp.setattr(engine_cli, "run_with_eager_twin", fake_twin)
        mp.chdir(folder)
        (folder / ".git").mkdir()
        yield folder, real


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=argument_lists(), pyproject=settings_files(), threads=st.sampled_from([None, None, None, "1", "abc", "0"]))
def test_every_outcome_is_0_1_or_2_without_a_traceback(sandbox, args, pyproject, threads):
    folder, real = sandbox
    config = folder / "pyproject.toml"
    if pyproject is None:
        config.unlink(missing_ok=True)
    else:
        config.write_bytes(pyproject)
    out, err = io.StringIO(), io.StringIO()
    previous = os.environ.pop("CAPTURELINT_THREADS", None)
    if threads is not None:
        os.environ["CAPTURELINT_THREADS"] = threads
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(args)
    finally:
        os.environ.pop("CAPTURELINT_THREADS", None)
        if previous is not None:
            os.environ["CAPTURELINT_THREADS"] = previous
    stderr = err.getvalue()
    assert code in (0, 1, 2), (args, code, stderr)
    assert "Traceback" not in stderr and "internal error" not in stderr, (args, stderr)
    if code == 2:
        assert len(stderr.splitlines()) == 1 and stderr.startswith("capturelint: "), (args, stderr)
    assert real == [], args
    assert not [p.name for p in folder.rglob("*.tmp")], "an atomic write left its temporary file"
