"""The public API for checking an engine of your own (``capturelint check --target``, the
``targets`` setting, ``capturelint.api.check(targets=...)``): ``Target`` and
``load_targets``; ``emulate_cuda()``, under which capturelint runs a target's code, for
``Target`` objects built by a test where no GPU is usable (``with emulate_cuda():
targets = make_targets()``). The adapter lives in ``capturelint.adapters.plain.target``."""

from capturelint.adapters.plain.target import Target, load_targets, run_targets
from capturelint.runtime.emulated import emulate_cuda

__all__ = ["Target", "emulate_cuda", "load_targets", "run_targets"]
