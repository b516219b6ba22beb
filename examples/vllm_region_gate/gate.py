"""A pre-merge gate for vLLM's CUDA-graph capture regions, shown on a real regression.

vLLM PR #51430 narrowed DeepSeek V4's eager region under every model runner; under
Model Runner V1 a PIECEWISE capture runs without attention metadata, so the captured
graph kept the profile-run ``F.pad`` branch of ``_fused_qnorm_rope_kv_insert`` and
replay never wrote the KV cache (GSM8K 0.94 -> 0.04). PR #52401 chose the region per
runner (attention.py:323-328). ``narrow_v1_region.patch`` reverts that choice.

This script runs the command a vLLM pull request would be gated on,

    capturelint check --engine vllm --runner v1 --mode PIECEWISE --format json

twice: on the vLLM that Python imports (the original), and on a copy of it with the
patch applied, put first on ``PYTHONPATH`` as a pull request's checkout would be. The
copy is cheap: a tree of symlinks (directories real, every file linked) in which only
``models/deepseek_v4/attention.py`` is a real, patched file. vLLM is never imported
here (``importlib.util.find_spec`` only); each check is a subprocess (~20 s, most of it
vLLM's import), and the two run side by side.

Exit status 0 when the gate works: the original passes (exit 0) and the patched copy
fails (exit 1) with a CL101 captured in ``_fused_qnorm_rope_kv_insert`` of the patched
file. Any other outcome exits 1 and says which; exit 2 when the gate cannot run (no
vLLM, the patch does not apply, a check errs).

    python examples/vllm_region_gate/gate.py [--workdir DIR] [--keep]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
PATCH = HERE / "narrow_v1_region.patch"
REPO_ROOT = HERE.parent.parent  # holds the capturelint package when run from a checkout
TARGET = "vllm/models/deepseek_v4/attention.py"  # the patched file, as the patch names it
FUNCTION = "_fused_qnorm_rope_kv_insert"
CHECK = ["check", "--engine", "vllm", "--runner", "v1", "--mode", "PIECEWISE", "--format", "json"]


class GateError(Exception):
    """The gate could not run (exit 2)."""


# ---------------------------------------------------------------------- the patch


@dataclass
class Hunk:
    old_start: int
    lines: list[str] = field(default_factory=list)  # with their ' ', '-', '+' prefixes


def parse_patch(text: str) -> tuple[str, list[Hunk]]:
    """The target path (``b/`` stripped, i.e. ``-p1``) and hunks of a one-file unified diff."""
    target = None
    hunks: list[Hunk] = []
    for line in text.splitlines():
        if line.startswith("+++ "):
            target = line[4:].split("\t")[0].strip()
            target = target.split("/", 1)[1] if "/" in target else target
        elif line.startswith("@@"):
            m = re.match(r"@@ -(\d+)(?:,\d+)? \+\d+(?:,\d+)? @@", line)
            if not m:
                raise GateError(f"{PATCH.name}: malformed hunk header {line!r}")
            hunks.append(Hunk(int(m.group(1))))
        elif hunks and line[:1] in (" ", "-", "+"):
            hunks[-1].lines.append(line)
        elif hunks and line == "":
            hunks[-1].lines.append(" ")  # an empty context line whose space was stripped
        elif hunks and line.startswith("\\"):
            continue  # "\ No newline at end of file"
    if target is None or not hunks:
        raise GateError(f"{PATCH.name}: no '+++' header or no hunk: not a unified diff")
    return target, hunks


def apply_patch(path: Path, hunks: list[Hunk], fuzz: int = 50) -> None:
    """Apply ``hunks`` to ``path`` in place; each hunk's old lines must match exactly,
    at its stated line or within ``fuzz`` lines of it (as ``patch`` allows an offset)."""
    lines = path.read_text().splitlines(keepends=True)
    offset = 0
    for hunk in hunks:
        old = [l[1:] for l in hunk.lines if l[0] in " -"]
        new = [l[1:] for l in hunk.lines if l[0] in " +"]
        want = hunk.old_start - 1 + offset
        for start in sorted(range(max(0, want - fuzz), want + fuzz + 1), key=lambda s: abs(s - want)):
            if [l.rstrip("\r\n") for l in lines[start : start + len(old)]] == old:
                break
        else:
            raise GateError(
                f"{PATCH.name} does not apply to {path}: the hunk at line {hunk.old_start} "
                "matches nowhere near it (is this vLLM 0.33.0?)"
            )
        lines[start : start + len(old)] = [l + "\n" for l in new]
        offset += len(new) - len(old)
    path.write_text("".join(lines))


# ---------------------------------------------------------------------- the copy


def find_vllm() -> Path:
    """The folder of the vllm package Python would import, found without importing it."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise GateError("vLLM is not installed: pip install -c constraints.txt -r requirements/vllm-deps.txt && pip install --no-deps -r requirements/vllm.txt")
    return Path(list(spec.submodule_search_locations)[0])


def link_tree(src: Path, dst: Path, real: str) -> int:
    """Mirror package ``src`` at ``dst``: real directories, every file a symlink, except
    ``real`` (relative to ``src``), which is copied. Returns the number of links."""
    links = 0
    real_pyc = Path(real).stem + "."  # its stale bytecode is left out, not linked
    for dirpath, dirnames, filenames in os.walk(src):
        rel = Path(dirpath).relative_to(src)
        (dst / rel).mkdir(parents=True, exist_ok=True)
        for name in filenames + [d for d in dirnames if (Path(dirpath) / d).is_symlink()]:
            relfile = rel / name
            if relfile.as_posix() == real:
                shutil.copy2(src / relfile, dst / relfile)
            elif rel.name == "__pycache__" and rel.parent.as_posix() == Path(real).parent.as_posix() and name.startswith(real_pyc):
                continue
            else:
                os.symlink(os.path.realpath(src / relfile), dst / relfile)
                links += 1
    return links


# ---------------------------------------------------------------------- the checks


@dataclass
class Side:
    name: str
    status: int
    report: dict
    seconds: float
    cwd: Path

    @property
    def findings(self) -> list[dict]:
        return self.report.get("findings", [])


def run_check(name: str, cwd: Path, pythonpath: list[Path], timeout: float, log: Path) -> Side:
    env = dict(os.environ)
    if (REPO_ROOT / "capturelint").is_dir():
        pythonpath = pythonpath + [REPO_ROOT]  # capturelint from this checkout
    parts = [str(p) for p in pythonpath] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    # which vllm this environment imports, asked of the same interpreter and folder
    where = subprocess.run(
        [sys.executable, "-c", "import importlib.util as u; print(u.find_spec('vllm').origin)"],
        cwd=cwd, env=env, capture_output=True, text=True,
    )
    begin = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "capturelint.cli", *CHECK],
            cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        raise GateError(f"{name}: the check ran past {timeout:.0f} s") from None
    seconds = time.monotonic() - begin
    log.write_text(proc.stderr)
    (log.with_suffix(".json")).write_text(proc.stdout)
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError:
        tail = "\n".join(proc.stderr.strip().splitlines()[-8:])
        raise GateError(f"{name}: the check exited {proc.returncode} without a JSON report:\n{tail}") from None
    side = Side(name, proc.returncode, report, seconds, cwd)
    side.report["_vllm_origin"] = where.stdout.strip()
    return side


def print_side(side: Side) -> None:
    summary = side.report.get("summary", {})
    n = summary.get("findings", len(side.findings))
    what = "no findings" if not n else f"{n} finding{'s' * (n != 1)}"
    diverged = summary.get("diverged") or []
    print(f"{side.name:<9} v1 PIECEWISE: exit {side.status}, {what}"
          f"{', replay diverged: ' + ', '.join(diverged) if diverged else ''}  [{side.seconds:.1f} s]")
    print(f"          vllm imported from {side.report['_vllm_origin']}")
    for f in side.findings:
        cap = f.get("capture_frame") or {}
        step = f.get("shadow_frame") or {}
        runs = f", the step runs line {step['line']}" if step.get("line") else ""
        print(f"  {f['code']} {cap.get('file')}:{cap.get('line')} in {cap.get('function')} "
              f"({f.get('scope')}, {f.get('graph')}): captured {f.get('op')}{runs}")


def patched_file_ok(side: Side, copy_root: Path) -> list[str]:
    """Problems with the patched side's evidence; empty when it is what the gate expects."""
    problems = []
    origin = side.report["_vllm_origin"]
    if not origin.startswith(str(copy_root) + os.sep):
        problems.append(f"the patched check imported vllm from {origin}, not from the copy {copy_root}")
    source = (copy_root / TARGET).read_text().splitlines()
    hits = [f for f in side.findings if f["code"] == "CL101"
            and (f.get("capture_frame") or {}).get("function") == FUNCTION]
    if side.status != 1 or not hits:
        problems.append(f"the patched copy should fail with CL101 in {FUNCTION} (exit 1); "
                        f"it exited {side.status} with {[f['code'] for f in side.findings] or 'no findings'}")
    for f in hits:
        frame = f["capture_frame"]
        shown, line = frame["file"], frame["line"]
        text = source[line - 1].strip() if 0 < line <= len(source) else ""
        # with the copy as the working directory its files show as vllm/...; the line
        # must be the profile-run branch in the *patched* file (5 lines above the original)
        if shown != TARGET or not text.startswith("return F.pad("):
            problems.append(f"CL101 at {shown}:{line} is not the F.pad branch of the patched {TARGET} "
                            f"(line {line} there reads {text!r})")
    return problems


# ---------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path,
                        help="where the patched copy and the reports go (kept); default: a temporary folder")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder and say where it is")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per check (default 600)")
    args = parser.parse_args(argv)

    if args.workdir:
        work = args.workdir.resolve()
        for sub in ("original", "patched"):
            if (work / sub).exists():
                print(f"gate: error: {work / sub} exists; give an empty or new --workdir", file=sys.stderr)
                return 2
        work.mkdir(parents=True, exist_ok=True)
    else:
        work = Path(tempfile.mkdtemp(prefix="capturelint-gate-"))
    try:
        return gate(work, args.timeout)
    except GateError as e:
        print(f"gate: error: {e}", file=sys.stderr)
        return 2
    finally:
        if args.workdir or args.keep:
            print(f"work folder kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def gate(work: Path, timeout: float) -> int:
    begin = time.monotonic()
    vllm_dir = find_vllm()
    try:
        version = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown version"
    target, hunks = parse_patch(PATCH.read_text())
    if target != TARGET:
        raise GateError(f"{PATCH.name} patches {target}, the gate expects {TARGET}")
    print(f"vLLM {version} at {vllm_dir}")

    copy_root = work / "patched"
    real = TARGET.split("/", 1)[1]  # models/deepseek_v4/attention.py
    links = link_tree(vllm_dir, copy_root / "vllm", real)
    apply_patch(copy_root / TARGET, hunks)
    removed = sum(l[0] == "-" for h in hunks for l in h.lines)
    added = sum(l[0] == "+" for h in hunks for l in h.lines)
    print(f"patched copy at {copy_root / 'vllm'}: {links} files linked, {real} copied and "
          f"patched with {PATCH.name} ({len(hunks)} hunk, -{removed} +{added} lines)")
    print(f"check: capturelint {' '.join(CHECK)}")
    print()

    original_cwd = work / "original"  # not the copy: `python -m` puts the cwd first on sys.path
    original_cwd.mkdir()
    # the two checks are independent processes: run them side by side
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = pool.submit(run_check, "original", original_cwd, [], timeout, work / "original.log")
        second = pool.submit(run_check, "patched", copy_root, [copy_root], timeout, work / "patched.log")
        original, patched = first.result(), second.result()
    print_side(original)
    print_side(patched)
    print()

    problems = []
    if original.report["_vllm_origin"].startswith(str(copy_root) + os.sep):
        problems.append("the original check imported the patched copy")
    if original.status != 0 or original.findings:
        problems.append(f"the original vLLM should pass (exit 0, no findings); it exited {original.status} "
                        f"with {len(original.findings)} findings")
    problems += patched_file_ok(patched, copy_root)
    took = time.monotonic() - begin
    if problems:
        print("GATE BROKEN: " + "; ".join(problems) + f" [{took:.0f} s]")
        return 1
    print(f"gate works: the original passes, the patch (the narrow region under V1, vLLM before "
          f"#52401) fails with CL101 in {FUNCTION} [{took:.0f} s]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
