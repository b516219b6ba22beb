"""The CLI keeps its promises under bad input, faults and signals (issue #9).

Exit status 0 clean, 1 findings, 2 usage, configuration or internal error, 130
interrupted; an error is one line on stderr and no traceback; output files are whole or
untouched. One test (or a few) per row of the issue's table, numbered as there, then
its minor items. Runs of the bundled engine are small and shared (``memo_runs``);
where the engine does not matter it is replaced by a fake, and where a real process
matters (signals, pipes, file-size limits, imports) the test starts one.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from capturelint.cli import main
from capturelint.options import BreakOutputs
from capturelint.snapshot import ConfigMap, EngineParams, RegionMap

ROOT = Path(__file__).resolve().parent.parent
# v1 with the narrow region: CL101 findings, and replay diverges (token agreement < 1)
NARROW = ["--runner", "v1", "--eager-region", "narrow", "--mode", "PIECEWISE", "--layers", "2", "--steps", "6"]
TINY_MAP = RegionMap(EngineParams(2, 4, 0, "torch", False, BreakOutputs.COPY), (ConfigMap("v1", "PIECEWISE", "wide", ()),))


def run(capsys, *args) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(err: str, needle: str = "") -> str:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("capturelint: error: ") and "Traceback" not in err, err
    assert needle in lines[0], err
    return lines[0]


def cli_process(*args: str, cwd: Path | str = ROOT, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, "-m", "capturelint.cli", *args], cwd=cwd, env=environment,
                          capture_output=kw.pop("capture_output", "stdout" not in kw), timeout=kw.pop("timeout", 300), **kw)


@pytest.fixture
def no_engine(monkeypatch):
    """Fail the test if a command starts the engine: the error must come first."""
    import capturelint.adapters.bundled.plan as bundled

    calls: list[str] = []

    def refuse(*args, **kwargs):
        calls.append("ran")
        raise KeyboardInterrupt  # never a silent pass: the test sees 130, not its expected status

    monkeypatch.setattr(bundled, "run_check", refuse)
    monkeypatch.setattr(bundled, "record_regions", refuse)
    yield calls
    assert calls == [], "the command ran the engine before refusing its arguments"


@pytest.fixture
def fake_recording(monkeypatch):
    """``snapshot`` records ``TINY_MAP`` instead of running the engine."""
    import capturelint.adapters.bundled.plan as bundled

    monkeypatch.setattr(bundled, "record_regions", lambda plan, progress=None: TINY_MAP)


# --------------------------------------------------------------- 1: -o paths


@pytest.mark.parametrize("fmt", ["rich", "json"])
def test_1_output_into_a_missing_folder_is_refused_before_the_run(capsys, tmp_path, no_engine, fmt):
    target = tmp_path / "missing-dir" / "x.txt"
    code, out, err = run(capsys, "check", *NARROW, "--format", fmt, "-o", str(target))
    assert code == 2 and out == ""
    one_error_line(err, f"cannot write {target}: the folder {target.parent} does not exist")


def test_1_output_to_a_directory_is_refused(capsys, tmp_path, no_engine):
    code, _, err = run(capsys, "check", *NARROW, "-o", str(tmp_path))
    assert code == 2
    one_error_line(err, f"cannot write {tmp_path}: it is a directory")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_1_output_to_a_full_device_is_one_line(capsys, memo_runs):
    code, out, err = run(capsys, "check", *NARROW, "-o", "/dev/full")
    assert code == 2 and out == ""
    one_error_line(err, "cannot write /dev/full: No space left on device")
    assert os.path.exists("/dev/full") and not Path("/dev/full").is_file()  # written in place, never replaced


# ------------------------------------------------------------ 2: 64-bit seeds


def test_2_a_seed_over_64_bits_is_one_line_on_the_command_line(capsys, no_engine):
    code, _, err = run(capsys, "check", "--seed", str(2**64))
    assert code == 2
    one_error_line(err, "--seed must be an integer from 0 to 18446744073709551615 (64 bits), got 18446744073709551616")


def test_2_a_seed_over_64_bits_in_settings_names_the_file_and_key(capsys, tmp_path, monkeypatch, no_engine):
    (tmp_path / ".git").mkdir()
    (tmp_path / "pyproject.toml").write_text(f"[tool.capturelint]\nseed = {2**64}\n")
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, "check")
    assert code == 2
    one_error_line(err, "pyproject.toml: [tool.capturelint] seed must be an integer from 0 to 18446744073709551615")


def test_2_a_seed_over_64_bits_for_engine_run_is_one_line(capsys):
    code, _, err = run(capsys, "engine", "run", "--seed", str(2**64), "--layers", "1", "--steps", "2")
    assert code == 2
    one_error_line(err, "seed must be an integer from 0 to 18446744073709551615 (64 bits)")


# ------------------------------------------------------ 3: CAPTURELINT_THREADS


@pytest.mark.parametrize("value", ["abc", "0", "-1", "", "1.5"])
@pytest.mark.parametrize("command", [["--version"], ["rules"], ["check", "--mode", "NONE"], ["engine", "run", "-h"]])
def test_3_a_bad_thread_count_is_one_line_on_every_command(capsys, monkeypatch, value, command):
    monkeypatch.setenv("CAPTURELINT_THREADS", value)
    code, out, err = run(capsys, *command)
    assert code == 2 and out == ""
    one_error_line(err, f"CAPTURELINT_THREADS={value!r} is not a thread count")


def test_3_a_good_thread_count_is_applied_when_torch_runs(capsys, monkeypatch):
    import torch

    before = torch.get_num_threads()
    monkeypatch.setenv("CAPTURELINT_THREADS", "2")
    try:
        assert run(capsys, "engine", "run", "--mode", "NONE", "--layers", "1", "--steps", "2", "--json")[0] == 0
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


# -------------------------------------------------------- 4: invalid UTF-8 TOML


def test_4_a_pyproject_that_is_not_utf8_is_one_line(capsys, tmp_path, monkeypatch, no_engine):
    (tmp_path / ".git").mkdir()
    (tmp_path / "pyproject.toml").write_bytes(b"[tool.capturelint]\nsteps = 4  # \xff\xfe\n")
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, "check")
    assert code == 2
    one_error_line(err, "pyproject.toml: not UTF-8 text")


# ------------------------------------------------- 5: stdout full, ascii stdout


class _Stdout(io.TextIOBase):
    """A standard output that fails as a real one does, and has no file descriptor."""

    def __init__(self, error: Exception | None = None, encoding: str = "utf-8"):
        self.error, self.enc, self.text = error, encoding, []

    @property
    def encoding(self):
        return self.enc

    def isatty(self):
        return False

    def write(self, text):
        if self.error is not None:
            raise self.error
        text.encode(self.enc)  # UnicodeEncodeError, as a strict text stream raises
        self.text.append(text)
        return len(text)

    def flush(self):
        if self.error is not None:
            raise self.error


def test_5_a_full_stdout_is_one_line(capsys, memo_runs, monkeypatch):
    monkeypatch.setattr(sys, "stdout", _Stdout(OSError(28, "No space left on device")))
    code, _, err = run(capsys, "check", *NARROW)
    assert code == 2
    one_error_line(err, "cannot write to standard output: No space left on device")


def test_5_an_ascii_stdout_gets_the_report(capsys, memo_runs, monkeypatch):
    stdout = _Stdout(encoding="ascii")
    monkeypatch.setattr(sys, "stdout", stdout)
    code, _, err = run(capsys, "check", *NARROW, "--verbose")  # the evidence's panels draw non-ASCII borders
    assert code == 1 and err == ""
    text = "".join(stdout.text)
    assert "CL101 baked-control-flow" in text and " findings (CL101 x" in text and "?" in text


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_5_processes_with_a_full_or_ascii_stdout(tmp_path):
    with open("/dev/full", "w") as full:
        done = cli_process("rules", stdout=full, stderr=subprocess.PIPE)
    assert done.returncode == 2
    assert done.stderr.decode() == (
        "capturelint: error: cannot write to standard output: No space left on device; free the device or write "
        "to a file with -o\n"
    )
    done = cli_process("rules", "CL104", env={"PYTHONIOENCODING": "ascii"})
    assert done.returncode == 0 and done.stderr == b"" and b"stale-input" in done.stdout


# ------------------------------------------------------ 6: unbounded inputs


def test_6_too_many_steps_is_refused_before_the_run(capsys, no_engine):
    code, _, err = run(capsys, "check", "--steps", "1000000000")
    assert code == 2
    one_error_line(err, "--steps must be an integer from 1 to 4096, got 1000000000")


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_6_a_baseline_that_never_ends_is_refused(capsys, no_engine):
    code, _, err = run(capsys, "check", "--baseline", "/dev/zero")
    assert code == 2
    one_error_line(err, "snapshot /dev/zero is not a regular file (it is a character device)")  # not read at all


def test_6_a_huge_baseline_is_refused_by_its_size(capsys, tmp_path, no_engine):
    huge = tmp_path / "huge.json"
    with open(huge, "wb") as fh:
        fh.truncate(65 * 2**20)  # sparse: takes no disk
    code, _, err = run(capsys, "check", "--baseline", str(huge))
    assert code == 2
    one_error_line(err, f"snapshot {huge} is larger than 64 MiB")


# ------------------------------------------------- 7, 8: atomic output files


def test_7_a_snapshot_interrupted_while_written_leaves_the_old_file(capsys, tmp_path, fake_recording, monkeypatch):
    import capturelint.output as output

    base = tmp_path / "base.json"
    base.write_text("OLD")

    def interrupted(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(output.os, "fsync", interrupted)
    code, _, err = run(capsys, "snapshot", "-o", str(base))
    assert code == 130 and err == "capturelint: interrupted\n"
    assert base.read_text() == "OLD"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base.json"]  # no temporary file left


def test_7_a_writer_killed_mid_write_leaves_the_old_file(tmp_path):
    base = tmp_path / "base.json"
    base.write_text("OLD")
    script = (
        "import os, signal, sys\n"
        "import capturelint.output as output\n"
        "output.os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)\n"
        "output.write_file(sys.argv[1], 'NEW' * 100000)\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(base)], env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, timeout=120)
    assert done.returncode == -signal.SIGKILL
    assert base.read_text() == "OLD"


def test_8_a_file_size_limit_leaves_the_old_file(tmp_path):
    base = tmp_path / "full.json"
    base.write_text("OLD")
    script = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))\n"
        "from capturelint.errors import CapturelintError\n"
        "from capturelint.output import write_file\n"
        "try:\n"
        "    write_file(sys.argv[1], 'x' * 5000)\n"
        "except CapturelintError as e:\n"
        "    print(e)\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(base)], env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, timeout=120, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"cannot write {base}: File too large")
    assert base.read_text() == "OLD"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full.json"]


def test_8_a_failed_snapshot_write_is_one_line_and_leaves_the_old_file(capsys, tmp_path, fake_recording, monkeypatch):
    import errno

    import capturelint.output as output

    base = tmp_path / "full.json"
    base.write_text("OLD")

    def too_large(fd):
        raise OSError(errno.EFBIG, "File too large")

    monkeypatch.setattr(output.os, "fsync", too_large)
    code, _, err = run(capsys, "snapshot", "-o", str(base))
    assert code == 2
    one_error_line(err, f"cannot write {base}: File too large")
    assert base.read_text() == "OLD" and sorted(p.name for p in tmp_path.iterdir()) == ["full.json"]


def test_8_snapshot_output_is_written_whole(capsys, tmp_path, fake_recording):
    base = tmp_path / "base.json"
    assert run(capsys, "snapshot", "-o", str(base))[0] == 0
    assert base.read_text() == TINY_MAP.dumps()
    plain = tmp_path / "plain"
    plain.write_text("")
    assert base.stat().st_mode & 0o777 == plain.stat().st_mode & 0o777  # not the temporary file's private mode


# ------------------------------------------------ 9: --update of another file


def test_9_update_refuses_a_file_that_is_not_a_snapshot(capsys, tmp_path, no_engine):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text("[project]\nname = 'mine'\n")
    code, out, err = run(capsys, "snapshot", "--update", str(pyproject))
    assert code == 2 and out == ""
    one_error_line(err, f"refusing to replace {pyproject}: it is not a capturelint snapshot")
    assert pyproject.read_text() == "[project]\nname = 'mine'\n"


def test_9_update_writes_an_empty_or_missing_file(capsys, tmp_path, fake_recording):
    empty = tmp_path / "empty.json"
    empty.write_text("")
    code, _, err = run(capsys, "snapshot", "--update", str(empty))
    assert code == 0 and err == f"created {empty}\n" and empty.read_text() == TINY_MAP.dumps()


# ------------------------------------------------------- 10: sys.exit in a target


@pytest.mark.parametrize("where", ["import", "factory", "run"])
@pytest.mark.parametrize("exit_code", [0, 3])
def test_10_a_target_that_calls_sys_exit_is_an_error_naming_it(capsys, tmp_path, monkeypatch, where, exit_code):
    exit_at = {where: f"sys.exit({exit_code})"}
    (tmp_path / "t.py").write_text(
        "import sys\n"
        "from capturelint.target import Target\n"
        f"{exit_at.get('import', '')}\n"
        "def run():\n"
        f"    {exit_at.get('run', 'return 0')}\n"
        "def targets():\n"
        f"    {exit_at.get('factory', '')}\n"
        "    return [Target(run=run)]\n"
    )
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "check", "--target", "t.py:targets", "--format", "sarif", "-o", "out.sarif")
    assert code == 2 and out == ""
    line = one_error_line(err, "--target 't.py:targets': ")
    assert f"called sys.exit({exit_code})" in line and "no verdict" in line
    assert not (tmp_path / "out.sarif").exists()


# ------------------------------------------------- 11, 12: verdicts tell the truth


def test_11_ignored_rules_with_a_divergence_do_not_say_replay_matches(capsys, memo_runs):
    code, out, err = run(capsys, "check", *NARROW, "--ignore", "CL")
    assert code == 0  # what the user asked for
    summary = out.rstrip().splitlines()
    assert "replay matches eager execution" not in out
    assert any("replay DIFFERS from eager execution in v1/PIECEWISE (token agreement" in line for line in summary)
    code, out, err = run(capsys, "check", *NARROW, "--ignore", "CL", "--format", "json")
    assert code == 0 and json.loads(out)["summary"]["diverged"] == ["v1/PIECEWISE"]
    assert "replay DIFFERS" in err and "replay matches" not in err


def test_12_mode_none_is_an_error_not_a_pass(capsys, no_engine):
    code, out, err = run(capsys, "check", "--mode", "NONE")
    assert code == 2 and out == ""
    one_error_line(err, "mode NONE captures no CUDA graph, so there is no replay to compare with eager execution")


def test_12_a_configuration_that_replays_nothing_is_an_error(capsys):
    # the single step is a prefill: a FULL_DECODE_ONLY graph is captured but never replayed
    code, out, err = run(capsys, "check", "--runner", "v2", "--mode", "FULL_DECODE_ONLY", "--layers", "1", "--steps", "1")
    assert code == 2 and out == ""
    one_error_line(err, "runner v2, mode FULL_DECODE_ONLY captured")
    assert "replayed none, so no step could be checked" in err


# ---------------------------------------------------------- 13: nan budgets


@pytest.mark.parametrize("budget", ["nan", "inf", "-inf", "-1"])
def test_13_a_budget_that_is_not_a_percentage_is_refused(capsys, tmp_path, no_engine, budget):
    code, _, err = run(capsys, "check", "--baseline", str(tmp_path / "b.json"), "--max-eager-growth", budget)
    assert code == 2
    one_error_line(err, "--max-eager-growth must be a percentage (a number >= 0)")


# ------------------------------------------------------------------ 14: -o -


def test_14_output_dash_is_stdout(capsys, tmp_path, monkeypatch, memo_runs):
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "check", *NARROW, "-o", "-")
    assert code == 1 and re.search(r"^\S+:\d+: CL101 ", out, re.MULTILINE) and err == ""
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------ 15: interrupts


def test_15_ctrl_c_during_a_run_is_130_and_one_line(capsys, no_engine):
    code, out, err = run(capsys, "check", "--runner", "v1", "--mode", "PIECEWISE")
    no_engine.clear()  # the fake engine is the interrupt here
    assert code == 130 and out == "" and err == "capturelint: interrupted\n"


def test_15_ctrl_c_while_a_command_is_imported_is_130(capsys, monkeypatch):
    import capturelint.cli as cli

    def interrupted(name):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.importlib, "import_module", interrupted)
    code, out, err = run(capsys, "check")
    assert code == 130 and err == "capturelint: interrupted\n"


def test_15_sigint_to_a_hanging_target_is_130(tmp_path):
    (tmp_path / "hang.py").write_text(
        "import pathlib, time\n"
        "def targets():\n"
        "    pathlib.Path('started').write_text('yes')\n"
        "    while True:\n"
        "        time.sleep(0.05)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen([sys.executable, "-m", "capturelint.cli", "check", "--target", "hang.py:targets"],
                               cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 240
        while not (tmp_path / "started").exists():
            assert process.poll() is None and time.monotonic() < deadline, process.communicate()
            time.sleep(0.05)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130 and out == b"" and err == b"capturelint: interrupted\n"


# ------------------------------------------------------------ 16: closed pipes


def test_16_a_closed_pipe_keeps_the_exit_status_of_the_run(capsys, memo_runs, monkeypatch):
    monkeypatch.setattr(sys, "stdout", _Stdout(BrokenPipeError(32, "Broken pipe")))
    code, _, err = run(capsys, "check", *NARROW)
    assert code == 1 and err == ""  # findings, quietly
    monkeypatch.setattr(sys, "stdout", _Stdout(BrokenPipeError(32, "Broken pipe")))
    code, _, err = run(capsys, "check", *NARROW, "--exit-zero")
    assert code == 0 and err == ""


def test_16_a_process_whose_reader_is_gone_ends_quietly():
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first write: every write fails with EPIPE
    try:
        done = cli_process("rules", stdout=write, stderr=subprocess.PIPE)
    finally:
        os.close(write)
    assert done.returncode == 0 and done.stderr == b""


# ---------------------------------------------------- 17, 19: numpy, no warnings


def test_17_numpy_is_a_dependency():
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert any(d.split(">")[0].split("=")[0].strip() == "numpy" for d in deps)
    import numpy  # noqa: F401  (installed with capturelint)


def test_17_a_missing_triton_dependency_is_named(monkeypatch):
    import builtins

    from capturelint.engine.config import Kernels
    from capturelint.engine.dsv4.attention import attention_kernels
    from capturelint.errors import CapturelintError

    real_import = builtins.__import__

    def without_numpy(name, *args, **kwargs):
        if name == "capturelint.engine.dsv4.triton_kernels":
            raise ModuleNotFoundError("No module named 'numpy'", name="numpy")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without_numpy)
    with pytest.raises(CapturelintError) as info:
        attention_kernels(Kernels.TRITON, "cpu")
    assert str(info.value).startswith("kernels triton: Triton needs the package 'numpy', which is missing")


def test_19_importing_the_engine_prints_no_warning():
    done = cli_process("engine", "run", "-h")
    assert done.returncode == 0 and done.stderr == b"", done.stderr.decode()


# ------------------------------------------------------- 18: settings codes


def test_18_an_unknown_code_in_settings_names_the_file_and_key(capsys, tmp_path, monkeypatch, no_engine):
    (tmp_path / ".git").mkdir()
    (tmp_path / "pyproject.toml").write_text('[tool.capturelint]\nselect = ["CL999"]\n')
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, "check")
    assert code == 2
    line = one_error_line(err, "pyproject.toml: [tool.capturelint] select has 'CL999', which matches no rule code")
    assert "--select" not in line


# ----------------------------------------------------- 20: tests that need dot


def test_20_tests_that_need_dot_skip_without_it_and_ci_installs_it():
    import test_show

    marks = [m for m in getattr(test_show.test_svg_and_png_are_drawn_by_dot, "pytestmark", []) if m.name == "skipif"]
    assert marks and "Graphviz" in marks[0].kwargs["reason"]
    assert marks[0].args[0] == (__import__("shutil").which("dot") is None)
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'apt-get install -y -qq "$@"' in ci and "apt_need dot graphviz" in ci
    assert "apt_need chromium chromium" in ci and "apt_need chromedriver chromium-driver" in ci


# ------------------------------------------------------- 21: no torch to answer


@pytest.mark.parametrize("args", [["--version"], ["-h"], ["rules"], ["rules", "CL101"], ["rules", "--format", "markdown"],
                                  ["check", "-h"], ["show", "-h"], ["diff", "-h"], ["snapshot", "-h"]])
def test_21_version_help_and_rules_do_not_import_torch(args):
    script = (
        "import sys\n"
        "from capturelint.cli import main\n"
        "code = main(sys.argv[1:])\n"
        "print(code, 'torch' in sys.modules, file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", script, *args], env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=120)
    assert done.stderr.splitlines()[-1] == "0 False", done.stderr
    assert done.stdout


def test_21_the_help_lists_the_modes_a_check_runs():
    from capturelint.cli import cli
    from capturelint.options import CAPTURE_MODES

    mode = next(p for p in cli.get_command(None, "check").params if p.name == "mode")  # type: ignore[union-attr]
    assert "(default: bundled: " + ", ".join(map(str, CAPTURE_MODES)) + "; vllm: PIECEWISE,FULL)" in mode.help


def test_21_the_help_lists_each_command_with_its_own_summary():
    from capturelint.cli import cli
    from capturelint.commands import COMMANDS

    for name, entry in COMMANDS.items():
        command = cli.get_command(None, name)  # type: ignore[arg-type]
        first_paragraph = " ".join((command.help or "").split("\n\n")[0].split())
        assert entry.summary == first_paragraph, name


# ------------------------------------------------------------------ the rest


def test_an_internal_error_is_one_line_and_the_traceback_is_on_request(capsys, monkeypatch):
    import capturelint.adapters.bundled.plan as bundled

    def boom(*args, **kwargs):
        raise ValueError("boom")

    monkeypatch.setattr(bundled, "run_check", boom)
    code, out, err = run(capsys, "check", "--runner", "v1", "--mode", "PIECEWISE")
    assert code == 2 and out == ""
    assert err == ("capturelint: internal error: ValueError: boom; run again with --debug for the traceback, "
                   "and report it\n")
    code, _, err = run(capsys, "--debug", "check", "--runner", "v1", "--mode", "PIECEWISE")
    assert code == 2 and err.startswith("Traceback (most recent call last):") and 'raise ValueError("boom")' in err
    assert err.splitlines()[-1] == "capturelint: internal error: ValueError: boom; report it with the traceback above"
    monkeypatch.setenv("CAPTURELINT_DEBUG", "1")
    code, _, err = run(capsys, "check", "--runner", "v1", "--mode", "PIECEWISE")
    assert code == 2 and err.startswith("Traceback")


def test_no_command_is_one_line(capsys):
    code, out, err = run(capsys)
    assert code == 2 and out == ""
    one_error_line(err, "no command given; see 'capturelint --help'")


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--mode", ""], "Invalid value for '--mode': '' names nothing"),
        (["--select", ""], "Invalid value for '--select': '' names nothing"),
        (["--ignore", ","], "Invalid value for '--ignore': ',' names nothing"),
        (["--max-eager-growth", "5"], "--max-eager-growth is the budget of --baseline, and no baseline is given"),
        (["--runner", "v2", "--fresh-metadata"], "--fresh-metadata changes Model Runner V1's metadata builders"),
    ],
)
def test_minor_empty_values_and_options_that_would_be_ignored_are_errors(capsys, no_engine, args, needle):
    code, _, err = run(capsys, "check", *args)
    assert code == 2
    one_error_line(err, needle)


def test_minor_engine_run_refuses_fresh_metadata_without_v1(capsys):
    code, _, err = run(capsys, "engine", "run", "--runner", "v2", "--fresh-metadata", "--layers", "1", "--steps", "2")
    assert code == 2
    one_error_line(err, "--fresh-metadata changes Model Runner V1's metadata builders, and this run uses runner v2")


def test_minor_eager_break_names_are_whole_on_80_columns(capsys, memo_runs, monkeypatch):
    from rich.console import Console

    from capturelint.adapters.registry import make_plan, run_check
    from capturelint.adapters.registry import engine_options
    from capturelint.render.check import render_evidence
    from capturelint.settings import Settings

    plan = make_plan(Settings(), engine_options(runner="v1", modes=("PIECEWISE",), eager_region="wide", layers=2, steps=6))
    console = Console(width=80, record=True, file=io.StringIO())
    render_evidence(run_check(plan), console)  # -v's evidence: every graph's segments
    text = console.export_text()
    assert "…" not in text
    assert "E _prepare_and_attn_eager:" in text and max(len(line) for line in text.splitlines()) <= 80


def test_minor_one_configuration_shows_progress_on_a_terminal(monkeypatch):
    from capturelint.commands.common import ProgressReporter

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert ProgressReporter(1).enabled


def test_minor_show_per_runner_says_per_runner(capsys, memo_runs):
    code, out, _ = run(capsys, "show", "--runner", "v1", "--mode", "PIECEWISE", "--layers", "2", "--steps", "4",
                       "--eager-region", "per-runner", "--no-check")
    assert code == 0 and "eager region per-runner (wide under v1)" in out


def test_minor_docs_document_the_promises():
    errors = (ROOT / "docs" / "errors.md").read_text()
    for needle in ("--debug", "CAPTURELINT_DEBUG", "130", "atomically"):
        assert needle in errors, needle
    assert "**`--target` executes the named file**" in (ROOT / "docs" / "targets.md").read_text()
