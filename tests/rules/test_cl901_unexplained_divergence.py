"""CL901: numerical divergence that no structural rule explains (a coverage gap)."""

from capturelint.analyzer import RunLabel, RunOutcome
from capturelint.rules.cl901_unexplained_divergence import UnexplainedDivergence
from toy_engine import check_toy

LABEL = RunLabel("v1", "PIECEWISE")


def gap(findings=(), token_agreement=None, max_step_error=0.0, twin_error=None, host_sync=None):
    outcome = RunOutcome(LABEL, tuple(findings), host_sync, 4, max_step_error, token_agreement, twin_error)
    return list(UnexplainedDivergence().check_run(outcome))


def test_divergence_without_a_structural_finding_is_reported():
    (f,) = gap(token_agreement=0.4, max_step_error=3.0)
    assert f.code == "CL901" and f.condition.value == "numerical"
    assert "coverage gap" in f.message and "3" in f.message


def test_an_eager_twin_error_alone_is_a_gap_when_there_are_no_tokens():
    (f,) = gap(twin_error=0.5)
    assert "eager-twin error 0.5" in f.message
    assert gap(token_agreement=1.0, twin_error=0.5) == []  # tokens, when there are some, decide


def test_divergence_explained_by_a_structural_finding_is_not_a_gap():
    result, _ = check_toy("stale_input")
    assert result.findings and result.max_step_error > 0.1
    assert gap(result.findings, 1.0, result.max_step_error) == []
    assert not any(f.code == "CL901" for f in result.findings)


def test_float_noise_is_not_a_gap():
    assert gap(token_agreement=1.0, max_step_error=5e-5) == []
    assert gap(twin_error=5e-5) == []


def test_a_divergence_entering_at_a_break_is_located_there():
    """An adapter that found the break where the divergence from the twin enters
    (``RunOutcome.entered``, vLLM's break probe) locates CL901 at it."""
    from capturelint.analyzer import EnteredAt
    from capturelint.findings import LineRole, MessageParts
    from capturelint.runtime.protocol import Frame

    at = Frame("vllm/models/deepseek_v4/attention.py", 738, "_sparse_indexer_and_attn")
    entered = EnteredAt("DeepseekV4Attention._sparse_indexer_and_attn", at, 3, 3, 4)
    outcome = RunOutcome(LABEL, (), None, 4, 0.0, 0.78, 1.18, entered)
    (f,) = UnexplainedDivergence().check_run(outcome)
    assert f.location == at and f.location_role is LineRole.BREAK
    assert f.op == "break DeepseekV4Attention._sparse_indexer_and_attn"
    assert "first at step 3, 3 real rows padded to 4" in f.message and "padded alike" in f.message
    assert MessageParts.of(f.message).fix.startswith("Make the break compute the real rows alike")
    # the same break in an unpadded step: no word of padding
    (g,) = UnexplainedDivergence().check_run(RunOutcome(LABEL, (), None, 4, 0.0, 0.5, 1.0,
                                                        EnteredAt(entered.name, at, 1, 4, 4)))
    assert "(first at step 1, 4 rows)" in g.message and "padded alike" not in g.message
    # without one, no source line, as before
    (h,) = gap(token_agreement=0.78, twin_error=1.18)
    assert h.location is None and "coverage gap" in h.message
