"""docs/gallery is what the renderer draws today: regenerated, byte for byte.

The gallery's entries are recorded again in this process (engine runs shared with the
other region tests), except the 61-layer one (half a minute of engine time): its
checked-in DOT is drawn again, and ``tests/test_dot_order.py`` checks 61-layer folding
on the seed's layers. DOT and SVG are compared byte for byte: Graphviz draws the same
SVG from the same DOT on one machine, and the SVGs were drawn with the Graphviz that
CI installs (Debian's 2.43).
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GALLERY = ROOT / "docs" / "gallery"
REGENERATE = "PYTHONPATH=. python docs/gallery/make.py"
NOT_RECORDED = {"layers-61"}

pytestmark = pytest.mark.skipif(shutil.which("dot") is None,
                                reason="needs Graphviz's 'dot' (Debian package graphviz; .ci/run installs it)")


def load_make():
    spec = importlib.util.spec_from_file_location("gallery_make", GALLERY / "make.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_gallery_is_up_to_date(memo_runs, tmp_path, monkeypatch):
    make = load_make()
    monkeypatch.chdir(ROOT)  # the plain example's target is named from the repository root
    for name in NOT_RECORDED:
        shutil.copy(GALLERY / f"{name}.dot", tmp_path)
    make.make(tmp_path, record_only=[e.name for e in make.ENTRIES if e.name not in NOT_RECORDED])
    made = sorted(p.name for p in tmp_path.iterdir())
    kept = sorted(p.name for p in GALLERY.iterdir() if p.name != "make.py" and p.name != "__pycache__")
    assert made == kept, f"docs/gallery holds other files than make.py writes; regenerate: {REGENERATE}"
    stale = [name for name in made if (tmp_path / name).read_bytes() != (GALLERY / name).read_bytes()]
    assert not stale, f"docs/gallery is out of date ({', '.join(stale)}); regenerate: {REGENERATE}"


def test_the_gallery_pictures_keep_the_size_targets():
    sizes = dict(re.findall(r"!\[([\w-]+)\]\(\S+\.svg\) \((\d+ x \d+) px", (GALLERY / "README.md").read_text()))
    assert set(sizes) == {e.name for e in load_make().ENTRIES}
    for name, size in sizes.items():
        assert int(size.split(" x ")[0]) <= 1440, (name, size)
    assert int(sizes["layers-61"].split(" x ")[1]) <= 3000
