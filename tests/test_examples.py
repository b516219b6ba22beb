"""The examples tell their stories: each runs, exits 0, and prints what its docstring says.

Each example's docstring ends with "Expected output:" and the output of a run at its
default sizes (4 layers, 12 steps). Here they run smaller so the file stays fast
(``SIZES``): the narrow-region story with 2 layers (a sliding-window and an indexer
layer), the two 16-configuration matrices with 1 layer, whose sliding-window KV insert
is where V1's narrow region goes wrong; 6 steps so that the workload has a uniform
decode batch, without which FULL_DECODE_ONLY would replay nothing. The output is compared with
the docstring's after masking the numbers that depend on the sizes (counts,
percentages, errors, token ids): every word, code, op, layer name, verdict and source
line (``attention.py:305``) must match, so the docstrings cannot drift from what the
scripts print. Whitespace is collapsed because numbers of other widths move column
padding and line wraps.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SIZES = {
    "pr51430_narrow_region_v1": ["--layers", "2", "--steps", "6"],
    "pr51768_denylist_unnecessary": ["--layers", "1", "--steps", "6"],
    "pr52401_per_runner_region": ["--layers", "1", "--steps", "6"],
}

# A number not glued to a name (v1, CL101, layers.0) or a source line (attention.py:305);
# counts written "x4" are numbers too.
_NUMBER = re.compile(r"(?:(?<![\w.:])|(?<=\bx))\d+(?:\.\d+)?(?:e[-+]?\d+)?%?")
# Token-id lists and step lists have as many numbers as the run has steps.
_NUMBER_RUN = re.compile(r"#(?:,? #)+")


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"examples_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def expected_output(module: ModuleType) -> str:
    """The block after "Expected output:" in the module docstring, dedented."""
    doc = module.__doc__ or ""
    assert "Expected output:\n" in doc, f"{module.__name__}: docstring has no 'Expected output:' block"
    block = doc.split("Expected output:\n", 1)[1]
    lines = block.strip("\n").split("\n")
    assert all(not line or line.startswith("    ") for line in lines), "the block is indented by 4 spaces"
    return "\n".join(line[4:] for line in lines) + "\n"


def shape(text: str) -> str:
    """``text`` with size-dependent numbers masked and whitespace collapsed."""
    masked = _NUMBER_RUN.sub("#", _NUMBER.sub("#", text))
    return " ".join(masked.split())


def test_shape_keeps_names_and_source_lines():
    assert shape("CL101 in model.layers.0.attn at attention.py:305, v1") == "CL101 in model.layers.0.attn at attention.py:305, v1"
    assert shape("0.0% of 45 tokens: 127 148 45\n  14.8 < 1e-4") == "# of # tokens: # # < #"
    assert shape("replay steps 1, 2, 3 (12 times)") == "replay steps # (# times)"
    assert shape("4 findings (CL101 x4)") == "# findings (CL101 x#)"


# Examples that are `check --target` subjects rather than stories, and where they are tested.
TARGETS = {"torch_cuda_graph": "tests/test_capture_semantics.py"}


def test_every_example_is_tested():
    assert sorted(p.stem for p in EXAMPLES.glob("*.py")) == sorted(list(SIZES) + list(TARGETS))
    for name, test in TARGETS.items():
        assert f"examples/{name}.py" in (EXAMPLES.parent / test).read_text()


@pytest.mark.parametrize("name", sorted(SIZES))
def test_example_tells_its_story(name, capsys):
    module = load(name)
    expected = expected_output(module)
    assert module.main(SIZES[name]) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert shape(out) == shape(expected), (
        f"examples/{name}.py no longer prints what its docstring says; if the change is meant, "
        f"paste the output of `python examples/{name}.py` under 'Expected output:'.\n"
        f"--- printed ({' '.join(SIZES[name])})\n{out}--- docstring\n{expected}"
    )
    # The title has no size-dependent numbers: word for word, padding included.
    assert expected.splitlines()[0] in out.splitlines()
    assert "The story holds" in out


def test_story_that_does_not_hold_exits_1(capsys, monkeypatch):
    # With the wide region (the state before PR #51430) replay is right and the check is
    # clean, so the narrow-region story's claims fail and it must say so.
    module = load("pr51430_narrow_region_v1")
    monkeypatch.setattr(module, "REGION", "wide")
    assert module.main(SIZES["pr51430_narrow_region_v1"]) == 1
    out = capsys.readouterr().out
    assert "The story does not hold" in out
    assert "exit status 0; findings by code: none" in out
