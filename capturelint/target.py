"""The public API for checking an engine of your own (``capturelint check --target``):
``Target`` and ``load_targets``. The adapter lives in ``capturelint.adapters.target``."""

from capturelint.adapters.target import Target, load_targets, run_targets

__all__ = ["Target", "load_targets", "run_targets"]
