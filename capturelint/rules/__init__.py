"""Every rule of capturelint, one class per diagnostic; ``RULES`` is the registry."""

from __future__ import annotations

from typing import TYPE_CHECKING

from capturelint.errors import CapturelintError
from capturelint.findings import Finding, RuleInfo
from capturelint.rules.base import Rule
from capturelint.rules.cl101_baked_control_flow import BakedControlFlow
from capturelint.rules.cl102_baked_host_value import BakedHostValue
from capturelint.rules.cl103_baked_shape import BakedShape
from capturelint.rules.cl104_stale_input import StaleInput
from capturelint.rules.cl105_escaped_eager_output import EscapedEagerOutput
from capturelint.rules.cl106_host_sync_in_capture import HostSyncInCapture
from capturelint.rules.cl107_stale_break_argument import StaleBreakArgument
from capturelint.rules.cl108_stale_input_held import StaleInputHeld
from capturelint.rules.cl109_output_overwritten import OutputOverwritten
from capturelint.rules.cl110_capture_output_consumed import CaptureOutputConsumed
from capturelint.rules.cl111_pool_memory_shared import PoolMemoryShared
from capturelint.rules.cl112_event_across_capture import EventAcrossCapture
from capturelint.rules.cl113_baked_learning_rate import BakedLearningRate
from capturelint.rules.cl114_grad_rebound import GradRebound
from capturelint.rules.cl115_autocast_cache import AutocastCache
from capturelint.rules.cl116_captured_host_state import CapturedHostState
from capturelint.rules.cl201_declared_eager_captured import DeclaredEagerCaptured
from capturelint.rules.cl202_declared_captured_eager import DeclaredCapturedEager
from capturelint.rules.cl203_eager_budget_exceeded import EagerBudgetExceeded
from capturelint.rules.cl901_unexplained_divergence import UnexplainedDivergence
from capturelint.rules.cl902_unused_suppression import UnusedSuppression
from capturelint.rules.cl903_invalid_suppression import InvalidSuppression

if TYPE_CHECKING:
    from capturelint.waivers import SuppressionView

# In code order; the order is not significant (the rules are pure: ``Rule``), and the
# analyzer calls each rule where it has a check method (``Rule.hooks``).
RULES: tuple[type[Rule], ...] = (
    BakedControlFlow, BakedHostValue, BakedShape, StaleInput, EscapedEagerOutput, HostSyncInCapture,
    StaleBreakArgument, StaleInputHeld, OutputOverwritten, CaptureOutputConsumed, PoolMemoryShared, EventAcrossCapture,
    BakedLearningRate, GradRebound, AutocastCache, CapturedHostState, DeclaredEagerCaptured, DeclaredCapturedEager, EagerBudgetExceeded, UnexplainedDivergence, UnusedSuppression,
    InvalidSuppression,
)
# What ``check --static`` runs: the rules that judge a capture alone (no shadow, no twin).
STATIC_CODES: frozenset[str] = frozenset(r.code for r in RULES if r.hooks & {"check_capture", "check_region"})
BY_CODE = {r.code: r for r in RULES}


def rule(code: str) -> type[Rule]:
    try:
        return BY_CODE[code.upper()]
    except KeyError:
        raise CapturelintError(f"unknown rule code {code!r}; run 'capturelint rules' to list the codes") from None


def suppression_findings(view: SuppressionView, codes: frozenset[str]) -> list[Finding]:
    """The findings of the selected suppression rules (CL902, CL903) on the comments
    of ``view`` (``capturelint.waivers``)."""
    out: list[Finding] = []
    for r in RULES:
        if r.code in codes and "check_suppressions" in r.hooks:
            out.extend(r().check_suppressions(view))
    return sorted(out, key=Finding.sort_key)


def rule_infos() -> tuple[RuleInfo, ...]:
    """Every rule's code, name and doc (``findings.RuleInfo``): what a SARIF log documents."""
    return tuple(r.info() for r in RULES)


def select_codes(select: list[str] | None, ignore: list[str] | None) -> frozenset[str]:
    """The codes that stay on: ``select`` (prefixes such as ``CL1`` allowed) minus ``ignore``."""

    def expand(items: list[str], option: str) -> set[str]:
        out: set[str] = set()
        for item in items:
            item = item.strip().upper()
            if not item:
                continue
            matched = {c for c in BY_CODE if c.startswith(item)}
            if not matched:
                raise CapturelintError(
                    f"{option} {item!r} matches no rule code; run 'capturelint rules' to list the codes"
                )
            out |= matched
        return out

    chosen = expand(select, "--select") if select else set(BY_CODE)
    return frozenset(chosen - (expand(ignore, "--ignore") if ignore else set()))


__all__ = ["RULES", "STATIC_CODES", "BY_CODE", "Rule", "rule", "select_codes", "suppression_findings"]
