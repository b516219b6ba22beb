"""The README's install is what CI runs, and it is complete.

A fresh machine must pass the README's two commands with nothing else installed. So
``.ci/run`` builds a new virtual environment and runs the README's test command in it,
verbatim (checked here), and the environment that command builds must hold everything
that the packages in it need (checked here, as ``pip check`` would, from the installed
metadata): a package that only the machine's own Python happened to have cannot hide.
Under ``CI=true`` the tests also assert that they run in that venv, without the
system's site-packages.
"""

from __future__ import annotations

import importlib.metadata as metadata
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CI = os.environ.get("CI", "").lower() == "true"


def readme_blocks(section: str) -> list[str]:
    """The ``sh`` code blocks of a README section, one string each."""
    text = (ROOT / "README.md").read_text()
    start = text.index(f"## {section}\n")
    end = text.find("\n## ", start + 1)
    body = text[start:end if end != -1 else None]
    return [b.strip() for b in re.findall(r"```sh\n(.*?)```", body, flags=re.S)]


def test_ci_runs_the_readme_test_command_verbatim_in_a_fresh_venv():
    main_job, tests = readme_blocks("Quick start")
    assert "capturelint check --runner v1 --eager-region narrow" in main_job
    script = (ROOT / ".ci" / "run").read_text().splitlines()
    assert tests in script, ".ci/run must run the README's test command verbatim"
    venv = script.index("python3 -m venv .venv")
    activate = script.index(". .venv/bin/activate")
    assert script.index("rm -rf .venv") < venv < activate < script.index(tests)


def test_readme_installs_vllm_with_resolution_and_the_wheel_without():
    _, tests = readme_blocks("Quick start")
    steps = [s.strip() for s in tests.split("&&")]
    assert "pip install -c constraints.txt -e '.[test]' -r requirements/vllm-deps.txt" in steps
    assert "pip install --no-deps -r requirements/vllm.txt" in steps
    wheel = [line.split("#")[0].strip() for line in (ROOT / "requirements" / "vllm.txt").read_text().splitlines()]
    assert [line for line in wheel if line] == ["vllm==0.33.0"], "vllm.txt holds vLLM alone (installed --no-deps)"


def _requirements(path: Path) -> list[str]:
    out = []
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            out.append(line)
    return out


def _unmet(dist_name: str, seen: set[str]) -> list[str]:
    """Requirements of ``dist_name`` and, recursively, of what they pull in, that the
    environment does not satisfy (markers evaluated, extras not followed)."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    key = canonicalize_name(dist_name)
    if key in seen:
        return []
    seen.add(key)
    try:
        dist = metadata.distribution(dist_name)
    except metadata.PackageNotFoundError:
        return [f"{dist_name} is not installed"]
    problems = []
    for text in dist.requires or []:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        try:
            installed = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            problems.append(f"{dist_name} needs {req}, which is not installed")
            continue
        if req.specifier and not req.specifier.contains(installed, prereleases=True):
            problems.append(f"{dist_name} needs {req}, but {req.name} {installed} is installed")
            continue
        problems += _unmet(req.name, seen)
    return problems


def test_every_requirement_of_the_vllm_package_set_is_installed():
    """What vLLM's imports need is resolved by pip, not hand-kept: every package of
    ``vllm-deps.txt`` and everything it needs, transitively, is installed here."""
    pytest.importorskip("vllm", reason="vLLM is not installed")
    from packaging.requirements import Requirement

    seen: set[str] = set()
    problems = []
    for text in _requirements(ROOT / "requirements" / "vllm-deps.txt"):
        req = Requirement(text)
        installed = metadata.version(req.name)
        assert req.specifier.contains(installed, prereleases=True), f"{req} pinned, {installed} installed"
        problems += _unmet(req.name, seen)
    assert not problems, "\n".join(problems)
    assert metadata.version("vllm") == "0.33.0"
    assert metadata.version("torch").startswith("2.13.0"), "torch must stay the CPU build of constraints.txt"


def test_vllm_dsv4_path_imports_in_an_isolated_interpreter():
    """``import vllm`` and its DeepSeek V4 attention in a fresh interpreter that ignores
    PYTHONPATH and the user's site-packages (``-I``): what it finds, the venv holds."""
    if not CI:
        pytest.importorskip("vllm", reason="vLLM is not installed")
    code = ("import os; os.environ['VLLM_TARGET_DEVICE'] = 'cpu'; import vllm; "
            "import vllm.models.deepseek_v4.attention, vllm.models.deepseek_v4.nvidia.flashmla; "
            "print(vllm.__version__)")
    done = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "0.33.0"


@pytest.mark.skipif(not CI, reason="only CI's run promises a fresh venv")
def test_ci_runs_in_a_venv_without_the_system_site_packages():
    assert sys.prefix != sys.base_prefix, "CI must run in the venv .ci/run makes"
    cfg = (Path(sys.prefix) / "pyvenv.cfg").read_text()
    assert re.search(r"include-system-site-packages\s*=\s*false", cfg)
    assert Path(sysconfig.get_paths()["purelib"]).is_relative_to(Path(sys.prefix))
