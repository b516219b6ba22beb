"""Paths in findings and patches for installed code whose venv lies in the checkout.

``.ci/run`` (and many developers) keep the virtual environment in the repository
(``.venv/``), so an installed vLLM lies below the working directory. Its files must
still show as their import path (``vllm/models/...``), in findings and in patches, as
they do when the venv is elsewhere.
"""

from __future__ import annotations

import os

import pytest

from capturelint.runtime import frames


@pytest.fixture
def venv_in_checkout(tmp_path, monkeypatch):
    site = tmp_path / ".venv" / "lib" / "python3.11" / "site-packages"
    module = site / "vllm" / "models" / "attention.py"
    module.parent.mkdir(parents=True)
    module.write_text("x = 1\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(frames, "_site_prefixes", (str(site) + os.sep,))
    monkeypatch.setattr(frames, "_display_cache", {})
    return tmp_path, module


def test_installed_code_below_the_working_directory_shows_its_import_path(venv_in_checkout):
    checkout, module = venv_in_checkout
    assert frames.display_path(str(module)) == "vllm/models/attention.py"
    own = checkout / "engine.py"  # the checkout's own code stays relative to it
    own.write_text("y = 2\n")
    assert frames.display_path(str(own)) == "engine.py"


def test_patches_of_installed_code_below_the_working_directory_use_its_import_path(venv_in_checkout):
    from capturelint.suggest import _shown_path

    checkout, module = venv_in_checkout
    assert _shown_path(str(module)) == "vllm/models/attention.py"
    own = checkout / "engine.py"
    own.write_text("y = 2\n")
    assert _shown_path(str(own)) == "engine.py"
