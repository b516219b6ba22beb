"""Reports are byte-identical to their pins (``tests/pins.py`` says why and how to
update them on purpose)."""

from __future__ import annotations

import difflib

import pytest

from pins import PINNED, PINS, Pin, produce


@pytest.mark.parametrize("pin", PINNED, ids=lambda p: p.name)
def test_report_is_byte_identical_to_its_pin(pin: Pin, tmp_path, cached_configurations):
    if pin.vllm:
        import sys
        from pathlib import Path

        sys.path.insert(0, str(Path(__file__).parent / "vllm"))
        from vllm_required import require_vllm

        require_vllm()
    status, data = produce(pin, tmp_path)
    assert status == pin.status
    pinned = (PINS / pin.name).read_bytes()
    if data != pinned:
        diff = "\n".join(difflib.unified_diff(pinned.decode().splitlines(), data.decode().splitlines(), "pinned", "now",
                                              lineterm="", n=1))
        pytest.fail(f"{pin.name} differs from its pin (PYTHONPATH=. python tests/pins.py --update if meant):\n"
                    f"{diff[:4000]}")
