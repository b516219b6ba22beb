"""The architecture families ``--model`` checks on vLLM's own runners, beyond DeepSeek V4
(the default, whose tiny model, reproduction and drafts are ``model``, ``runners``).

A family is a module of this package (``generic``: vLLM's ``Attention``) that builds
vLLM's own model class of each of its architectures and runs it whole on vLLM's own V1
and V2 runners, PIECEWISE and FULL. Its module provides:

- ``loop_for(arch)``: the step loop (a ``runners.real.VllmRunnerLoop`` subclass) of one
  architecture's configurations;
- ``backend()``: a context manager entered inside ``install.cpu_shim`` around each
  configuration (the attention backend, the kernels' CPU stand-ins);
- ``DEFAULT_LAYERS``: the layers of its default check.

Its default invariants (vLLM's region decisions for the family, ``invariants``) are
named here, so the plan is made without importing torch or vLLM. Adding a family is one
``Family`` row below, the architectures' rows in ``archs.CHECKED`` and the module.
"""

from __future__ import annotations

import dataclasses
import importlib
from types import ModuleType

from capturelint.adapters.vllm import archs, invariants
from capturelint.invariants import Invariant, shipped_defaults


@dataclasses.dataclass(frozen=True)
class Family:
    """One family: its name in ``archs`` (``Arch.family``), its module, the layers of its
    default check and its default invariants (TOML in ``invariants``)."""

    name: str
    module: str
    default_layers: int
    invariants_toml: str = ""

    def load(self) -> ModuleType:
        """The family's module (it imports torch and, when used, vLLM)."""
        return importlib.import_module(self.module)

    def invariants(self) -> tuple[Invariant, ...]:
        """The family's default invariants, source ``default``."""
        if not self.invariants_toml:
            return ()
        return shipped_defaults(self.invariants_toml, "capturelint/adapters/vllm/invariants.py")


FAMILIES = {f.name: f for f in (
    Family("generic attention", "capturelint.adapters.vllm.generic", 2, invariants.GENERIC_TOML),
    Family("sparse MLA", "capturelint.adapters.vllm.sparse_mla", 2, invariants.SPARSE_MLA_TOML),
    Family("MLA", "capturelint.adapters.vllm.mla", 1, invariants.MLA_TOML),
    Family("Kimi linear + MLA", "capturelint.adapters.vllm.kimi", 2, invariants.KIMI_TOML),
    Family("gated delta-net hybrid", "capturelint.adapters.vllm.gdn", 2, invariants.GDN_TOML),
    Family("Mamba2 hybrid", "capturelint.adapters.vllm.mamba2", 2, invariants.MAMBA2_TOML),
)}


def of(arch: str) -> Family | None:
    """The family of ``arch`` when it runs on vLLM's own runners through a family module;
    None for DeepSeek V4 (``model``)."""
    found = archs.ARCHS.get(arch)
    return FAMILIES.get(found.family) if found is not None else None


def default_invariants(model: str) -> tuple[Invariant, ...]:
    """The default invariants of ``--model``: DeepSeek V4's, one family's, or under
    ``all`` every checked family's (each applied to its own configurations:
    ``family_invariants``)."""
    if model == archs.ALL:
        found: list[Invariant] = list(invariants.default_invariants())
        for name in dict.fromkeys(archs.ARCHS[a].family for a in archs.SUPPORTED):
            for i in FAMILIES[name].invariants() if name in FAMILIES else ():
                if all(i.id != j.id for j in found):
                    found.append(i)
        return tuple(found)
    family = of(model)
    return family.invariants() if family is not None else invariants.default_invariants()


def family_invariants(arch: str, given: tuple[Invariant, ...]) -> tuple[Invariant, ...]:
    """``given`` for one architecture's configurations: the defaults of other families
    left out (a project's own invariants apply to every family)."""
    own = {i.id for i in default_invariants(arch)}
    return tuple(i for i in given if not (i.source == "default" and i.id not in own))


__all__ = ["FAMILIES", "Family", "default_invariants", "family_invariants", "of"]
