"""Shared by the vLLM tests (imported by name: tests/vllm is on sys.path while they load): vLLM itself, which CI must have.

``require_vllm()`` imports vLLM for the CPU target. Without it a test skips on a
developer's machine, and fails under ``CI=true``: the README's test command installs
``requirements/vllm-deps.txt`` and ``requirements/vllm.txt``, so a missing vLLM in CI is a broken install, not a reason to
check less.
"""

from __future__ import annotations

import os

import pytest


def require_vllm():
    """vLLM, imported for the CPU target; a skip without it, a failure under CI=true."""
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    try:
        import vllm
    except ImportError as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"vLLM is required under CI=true: {exc}")
        pytest.skip(f"vLLM is not installed: {exc}")
    return vllm
