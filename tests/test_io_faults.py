"""The promises of docs/errors.md ("Errors, interrupts and output files") hold under faults
of input files, output files, standard streams and signals (issue 16).

One test (or a few) per row of the issue's table, numbered as there (N7 ... N16), then
its minor items. Most run ``python -m capturelint`` in a process, as a user does: the
faults are of the process (signals, closed descriptors, a PATH without Graphviz, file
names at the system's limit). Runs of the bundled engine are one layer, six steps, one
configuration; commands that need no engine (``merge``, ``--version``) are used where
the engine does not matter.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from capturelint.cli import main

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["--runner", "v1", "--mode", "PIECEWISE", "--layers", "1", "--steps", "6"]
NARROW = [*SMALL, "--eager-region", "narrow"]  # findings (exit 1)
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def capturelint(*args: str, cwd: Path | str = ROOT, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    """``python -m capturelint ARGS`` in a process; text output."""
    kw.setdefault("capture_output", "stdout" not in kw and "stderr" not in kw)
    return subprocess.run([sys.executable, "-m", "capturelint", *map(str, args)], cwd=cwd, env={**ENV, **(env or {})},
                          text=True, timeout=kw.pop("timeout", 300), **kw)


def run(capsys, *args: str) -> tuple[int, str, str]:
    """``capturelint ARGS`` in this process (torch is loaded already: no import to wait for)."""
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(err: str, *needles: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("capturelint: error: ") and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], (needle, err)
    return lines[0]


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    """A real JSON report of a check with findings (exit 1): the narrow region breaks a
    declared invariant (CL201), which the static check sees."""
    path = tmp_path_factory.mktemp("report") / "report.json"
    done = capturelint("check", "--static", *NARROW, "--format", "json", "-o", path)
    assert done.returncode == 1 and json.loads(path.read_text())["findings"], done.stderr
    return path


# ------------------------------------------------ N7: SIGTERM, SIGHUP mid-write

# Holds the command inside the atomic write (in os.fsync of the temporary file), where
# the test signals it; everything else runs as it does for a user.
SLOW_FSYNC = """
import os, sys, time
from pathlib import Path

real_fsync, marker = os.fsync, Path(sys.argv[1])

def fsync(fd):
    marker.write_text("writing")
    time.sleep(120)
    real_fsync(fd)

os.fsync = fsync
sys.argv = ["capturelint", *sys.argv[2:]]
from capturelint.cli import entry
entry()
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["TERM", "HUP"])
def test_n7_a_signal_during_the_atomic_write_leaves_no_temporary_file(report, tmp_path, signum):
    out, marker = tmp_path / "out.json", tmp_path / "writing"
    out.write_text("the old report\n")
    process = subprocess.Popen([sys.executable, "-c", SLOW_FSYNC, str(marker), "merge", str(report), "-o", str(out)],
                               cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert process.poll() is None and time.monotonic() < deadline, process.communicate()
            time.sleep(0.02)
        assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # inside the write
        process.send_signal(signum)
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 128 + signum and err == "capturelint: terminated\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json", "writing"]  # no .out.json.XXXX.tmp
    assert out.read_text() == "the old report\n"


TERMINATING_TARGET = """
import os, signal, time

def targets():
    os.kill(os.getpid(), signal.{name})
    time.sleep(30)
    raise RuntimeError("the signal was not acted on")
"""


@pytest.mark.parametrize("name", ["SIGTERM", "SIGHUP"])
def test_n7_sigterm_and_sighup_end_a_command_as_ctrl_c_does(tmp_path, name):
    (tmp_path / "term.py").write_text(TERMINATING_TARGET.format(name=name))
    done = capturelint("check", "--target", "term.py:targets", cwd=tmp_path)
    assert done.returncode == 128 + getattr(signal, name) and done.stderr == "capturelint: terminated\n"


def test_n7_the_handlers_before_a_command_are_restored_after_it(tmp_path, capsys, monkeypatch):
    (tmp_path / "t.py").write_text("import signal\nSEEN = []\ndef targets():\n"
                                   "    SEEN.append(signal.getsignal(signal.SIGTERM))\n    raise RuntimeError('stop')\n")
    monkeypatch.chdir(tmp_path)
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    assert run(capsys, "check", "--target", "t.py:targets")[0] == 2
    assert {signum: signal.getsignal(signum) for signum in before} == before
    seen = sys.modules["capturelint_target_t"].SEEN
    assert seen and seen[0] is not before[signal.SIGTERM]  # while the command ran, capturelint's handler


def test_n7_an_ignored_sighup_stays_ignored(tmp_path, capsys, monkeypatch):
    (tmp_path / "term.py").write_text(TERMINATING_TARGET.format(name="SIGHUP").replace("time.sleep(30)", ""))
    monkeypatch.chdir(tmp_path)
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as nohup starts a command
    try:
        assert main(["check", "--target", "term.py:targets"]) == 2
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)
    one_error_line(capsys.readouterr().err, "RuntimeError: the signal was not acted on")


# ------------------------------------------------------ N8: shards of one check


def _shard(folder: Path, k: int, *options: str) -> Path:
    path = folder / f"shard-{k}-{'-'.join(options) or 'base'}.json"
    status = main(["check", "--static", "--runner", "v1", "--mode", "PIECEWISE,FULL", "--layers", "1", "--steps", "6",
                   "--shard", f"{k}/2", "--format", "json", "-o", str(path), *options])
    assert status in (0, 1)
    return path


@pytest.mark.parametrize("other", [["--seed", "1"], ["--eager-region", "narrow"], ["--ignore", "CL106"]],
                         ids=["seed", "eager-region", "ignore"])
def test_n8_shards_of_checks_with_other_options_are_refused(tmp_path, capsys, other):
    first, second, foreign = _shard(tmp_path, 1), _shard(tmp_path, 2), _shard(tmp_path, 2, *other)
    assert [c["runner"] + "/" + c["mode"] for c in json.loads(foreign.read_text())["configurations"]] == ["v1/FULL"]
    capsys.readouterr()
    assert main(["merge", str(first), str(second), "-o", str(tmp_path / "merged.json")]) in (0, 1)  # one check: joined
    capsys.readouterr()
    assert main(["merge", str(first), str(foreign)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    one_error_line(err, f"merge: {foreign} is shard 2/2 of another check than {first}", "merge the shards of one check")


def test_n8_the_fingerprint_is_of_what_shapes_the_report_not_of_how_it_ran(tmp_path, capsys):
    a = json.loads(_shard(tmp_path, 1).read_text())["shard"]
    b = json.loads(_shard(tmp_path, 1, "--jobs", "2").read_text())["shard"]
    c = json.loads(_shard(tmp_path, 1, "--select", "CL2").read_text())["shard"]
    assert a == b and len(a["check"]) == 16
    assert c["check"] != a["check"] and c["configurations"] == a["configurations"]


# -------------------------------------------------- N9: deeply nested documents


def test_n9_deeply_nested_json_to_merge_is_one_line(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000)
    done = capturelint("merge", deep)
    assert done.returncode == 2
    one_error_line(done.stderr, f"merge: {deep} is nested more than 64 levels deep")
    deep.write_text('{"a": ' * 200 + "1" + "}" * 200)  # parses whole, still refused
    one_error_line(capturelint("merge", deep).stderr, "is nested more than 64 levels deep")


@pytest.mark.parametrize("document", ["x = " + "[" * 100_000, "[invariants.a]\nx." + "a." * 5_000 + "b = 1\n"],
                         ids=["arrays", "dotted-keys"])
def test_n9_deeply_nested_toml_to_invariants_is_one_line(tmp_path, capsys, document):
    (tmp_path / "deep.toml").write_text(document)
    code, _, err = run(capsys, "invariants", "--invariants", tmp_path / "deep.toml")
    assert code == 2
    one_error_line(err, "deep.toml: nested more than 64 levels deep")


def test_n9_a_deeply_nested_pyproject_is_one_line(tmp_path, report):
    (tmp_path / ".git").mkdir()
    (tmp_path / "pyproject.toml").write_text("[tool.capturelint]\nx = " + "[" * 100_000)
    done = capturelint("merge", report, cwd=tmp_path)
    assert done.returncode == 2
    one_error_line(done.stderr, "pyproject.toml: nested more than 64 levels deep")


# ------------------------------------------------- N10: what --invariants reads


@pytest.mark.parametrize("special", ["/dev/zero", "fifo"])
def test_n10_invariants_from_a_device_or_a_fifo_are_refused_at_once(tmp_path, special):
    if special == "fifo":
        os.mkfifo(tmp_path / "fifo")  # no writer: opening it to read would block
    elif not os.path.exists(special):
        pytest.skip(f"needs {special}")
    done = capturelint("check", "--static", *SMALL, "--invariants", special, cwd=tmp_path, timeout=120)
    assert done.returncode == 2
    what = "a named pipe" if special == "fifo" else "a character device"
    one_error_line(done.stderr, f"{special}: not a regular file (it is {what})")


def test_n10_an_invariants_file_over_the_limit_is_refused_by_its_size(tmp_path, capsys):
    big = tmp_path / "big.toml"
    with big.open("wb") as fh:
        fh.truncate(4 * 2**20 + 1)  # sparse: refused by its size, never read
    code, _, err = run(capsys, "invariants", "--invariants", big)
    assert code == 2
    one_error_line(err, f"{big}: larger than 4 MiB")


# ------------------------------------------------- N11: --static checks nothing


def test_n11_static_with_no_static_rule_selected_is_an_error(capsys):
    code, out, err = run(capsys, "check", "--static", *SMALL, "--select", "CL101")
    assert code == 2 and out == ""
    one_error_line(err, "nothing to check: check --static runs only CL106, CL201, CL202, CL203",
                   "the rules selected are CL101")


# ---------------------------------------------------- N12: svg without Graphviz


def test_n12_svg_without_dot_is_an_error_and_writes_no_file(tmp_path, capsys, monkeypatch):
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # a PATH without dot
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.dot").write_text("mine\n")
    code, _, err = run(capsys, "show", *SMALL, "--format", "svg", "-o", "x.svg")
    assert code == 2
    one_error_line(err, "Graphviz 'dot' was not found on PATH, so no SVG can be drawn")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin", "x.dot"] and (tmp_path / "x.dot").read_text() == "mine\n"


# --------------------------------------------------- N13, N14: standard output


def test_n13_output_to_dev_stdout_into_a_pipe_is_standard_output(report):
    if not os.path.exists("/dev/stdout"):
        pytest.skip("needs /dev/stdout")
    to_stdout = capturelint("merge", report)
    done = capturelint("merge", report, "-o", "/dev/stdout")
    assert done.returncode == to_stdout.returncode == 1
    assert done.stdout == to_stdout.stdout and json.loads(done.stdout)["findings"]


@pytest.mark.parametrize("args", [["--version"], ["rules"]])
def test_n14_a_closed_standard_output_is_one_line(args):
    done = capturelint(*args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=lambda: os.close(1))
    assert done.returncode == 2
    one_error_line(done.stderr, "cannot write to standard output: it is closed")


def test_n14_a_closed_standard_output_is_no_matter_when_nothing_goes_there(report, tmp_path):
    done = capturelint("merge", report, "-o", tmp_path / "m.json", stderr=subprocess.PIPE, preexec_fn=lambda: os.close(1))
    assert done.returncode == 1 and "error" not in done.stderr
    assert (tmp_path / "m.json").read_text() == report.read_text()


# ------------------------------------------------------ N15: long file names


def test_n15_a_legal_250_byte_name_is_written(report, tmp_path):
    name = "r" * 245 + ".json"
    assert len(name.encode()) == 250
    done = capturelint("merge", report, "-o", name, cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert [p.name for p in tmp_path.iterdir()] == [name] and (tmp_path / name).read_text() == report.read_text()


# ------------------------------------------------ N16: Ctrl-C after the report


def test_n16_ctrl_c_right_after_the_report_is_written_is_130_or_the_run_s_status(tmp_path):
    """The report is written, then the process ends; a Ctrl-C in between says
    ``interrupted`` (130), or comes when the exit status is already decided (0: the
    kernel is tearing the process down). It never kills the process without a word."""
    statuses = []
    for delay in (0, 0.05, 0.1):
        out = tmp_path / f"out-{delay}.json"
        process = subprocess.Popen([sys.executable, "-m", "capturelint", "check", "--static", *SMALL, "--format", "json", "-o",
                                    str(out)],
                                   env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        try:
            deadline = time.monotonic() + 240
            while not out.exists():
                assert process.poll() is None and time.monotonic() < deadline, process.communicate()
                time.sleep(0.001)
            time.sleep(delay)
            process.send_signal(signal.SIGINT)
            _, err = process.communicate(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
        statuses.append(process.returncode)
        assert process.returncode in (0, 130), (delay, process.returncode, err)
        assert err.endswith("capturelint: interrupted\n") == (process.returncode == 130), err
        assert json.loads(out.read_text())["static"] is True  # the report is whole either way
    assert 130 in statuses


# ------------------------------------------------------------------ minor


def _unwritable_folder(tmp_path: Path) -> Path:
    """A folder this process may not write: a read-only one, or (root may write those)
    /proc/sys, which nobody may create files in."""
    if os.geteuid() != 0:
        folder = tmp_path / "read-only"
        folder.mkdir(mode=0o555)
        return folder
    if os.path.isdir("/proc/sys") and not os.access("/proc/sys", os.W_OK):
        return Path("/proc/sys")
    pytest.skip("running as root without a folder that root may not write")


def test_minor_an_unwritable_folder_is_refused_before_the_run(tmp_path, capsys, monkeypatch):
    folder = _unwritable_folder(tmp_path)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.py").write_text("import pathlib\ndef targets():\n    pathlib.Path('ran').write_text('yes')\n")
    code, _, err = run(capsys, "check", "--target", "t.py:targets", "-o", folder / "out.json")
    assert code == 2
    one_error_line(err, f"cannot write {folder / 'out.json'}: the folder {folder} is not writable")
    assert not (tmp_path / "ran").exists()  # refused before the target was even imported


@pytest.mark.parametrize("command", [["check"], ["merge"], ["rules"], ["show"], ["engine", "run"], ["snapshot"]])
def test_minor_every_command_takes_debug(capsys, command):
    code, out, err = run(capsys, *command, "--debug", "--help")
    assert code == 0 and "--debug" in out, err


def test_minor_debug_after_the_command_prints_the_traceback():
    done = capturelint("merge", "--debug", "missing.json")
    assert done.returncode == 2 and "Traceback" in done.stderr
    assert done.stderr.splitlines()[-1].startswith("capturelint: error: merge: missing.json does not exist")


@pytest.mark.parametrize("value, traceback", [("on", True), ("YES", True), ("1", True), ("off", False),
                                              ("false", False), ("0", False), ("", False)])
def test_minor_capturelint_debug_is_a_switch(value, traceback):
    done = capturelint("merge", "missing.json", env={"CAPTURELINT_DEBUG": value})
    assert done.returncode == 2 and ("Traceback" in done.stderr) == traceback, done.stderr
    assert done.stderr.splitlines()[-1].startswith("capturelint: error: merge: missing.json does not exist")


def test_minor_a_capturelint_debug_that_is_not_a_switch_is_one_line():
    done = capturelint("merge", "missing.json", env={"CAPTURELINT_DEBUG": "maybe"})
    assert done.returncode == 2
    one_error_line(done.stderr, "CAPTURELINT_DEBUG='maybe' is not a switch")


@pytest.mark.parametrize("command, option", [("check", ["--runner", "v2"]), ("check", ["--layers", "2"]),
                                             ("check", ["--engine", "vllm"]), ("check", ["--mode", "FULL"]),
                                             ("check", ["--platform", "cuda"]), ("suggest", ["--eager-region", "wide"])])
def test_minor_engine_options_given_with_target_are_errors(tmp_path, capsys, monkeypatch, command, option):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.py").write_text("import pathlib\npathlib.Path('imported').write_text('yes')\ndef targets():\n    pass\n")
    code, _, err = run(capsys, command, "--target", "t.py:targets", *option)
    assert code == 2
    one_error_line(err, f"{option[0]} configures ", "and --target does not read it, so it would be ignored",
                   f"drop {option[0]}")
    assert not (tmp_path / "imported").exists()


def test_minor_engine_settings_with_target_are_named_in_a_warning(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".git").mkdir()
    (tmp_path / "pyproject.toml").write_text('[tool.capturelint]\nlayers = 2\nrunners = ["v1"]\n')
    (tmp_path / "t.py").write_text("def targets():\n    raise RuntimeError('stop here')\n")
    code, _, err = run(capsys, "check", "--target", "t.py:targets")
    assert code == 2
    warning, error = err.splitlines()
    assert warning == ("capturelint: warning: pyproject.toml: [tool.capturelint] layers, runners configure "
                       "capturelint's engines and do not apply to --target (its Target objects say their runner, mode "
                       "and workload)")
    assert "stop here" in error


def test_minor_a_stderr_that_cannot_be_written_does_not_change_the_exit_status(report, tmp_path):
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full")
    with open("/dev/full", "w") as full:
        done = capturelint("merge", report, "-o", tmp_path / "m.json", stderr=full, stdout=subprocess.PIPE)
    assert done.returncode == 1  # findings, as without the full device
    assert (tmp_path / "m.json").read_text() == report.read_text()


def test_minor_a_patch_for_an_engine_outside_the_working_folder_has_relative_paths(tmp_path, capsys):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    checkout = tmp_path / "checkout"
    (checkout / "engines").mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "suggest_engines.py", checkout / "engines" / "two.py")
    subprocess.run(["git", "init", "-q"], cwd=checkout, check=True)
    code, patch, err = run(capsys, "suggest", "--target", f"{checkout}/engines/two.py:targets", "--format", "patch")
    assert code == 0, err
    assert patch.startswith("--- a/engines/two.py\n+++ b/engines/two.py\n")  # not a/<absolute path>
    (tmp_path / "fix.patch").write_text(patch)
    applied = subprocess.run(["git", "apply", str(tmp_path / "fix.patch")], cwd=checkout, capture_output=True, text=True)
    assert applied.returncode == 0, applied.stderr
    assert (checkout / "engines" / "two.py").read_text().count("@eager_break_during_capture\n") == 2


def test_minor_disabling_an_unknown_invariant_is_an_error_naming_the_ids(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "inv.toml").write_text("[invariants.dsv4-sparse-attention-eagre]\nenabled = false\n")
    code, _, err = run(capsys, "invariants", "--invariants", "inv.toml")
    assert code == 2
    one_error_line(err, "command line (inv.toml): invariant dsv4-sparse-attention-eagre has enabled = false",
                   "known ids: dsv4-sparse-attention-eager, dsv4-v1-attention-prep-eager")


def test_minor_the_shared_reader_refuses_what_is_not_a_regular_file_for_every_input(tmp_path, report):
    os.mkfifo(tmp_path / "fifo")  # no writer: opening it to read would block
    for args, says in ((["merge", "fifo"], "merge: fifo is not a regular file (it is a named pipe)"),
                       (["merge", report, "--config", "fifo"], "fifo: not a regular file (it is a named pipe)"),
                       (["check", *SMALL, "--baseline", "fifo"], "snapshot fifo is not a regular file (it is a named pipe)")):
        done = capturelint(*args, cwd=tmp_path, timeout=120)
        assert done.returncode == 2
        one_error_line(done.stderr, says)
