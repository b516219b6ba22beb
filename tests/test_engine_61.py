"""The full DeepSeek V4 depth: 61 layers (tiny dims) capture and decode."""

from __future__ import annotations

from capturelint.engine.config import EngineConfig
from capturelint.runtime.forward_context import CUDAGraphMode
from capturelint.engine.llm import Engine, compare

TINY_61 = EngineConfig(
    runner="v2",
    cudagraph_mode="PIECEWISE",
    num_layers=61,
    steps=5,
    num_requests=2,
    max_num_seqs=2,
    max_prompt_len=6,
    max_num_batched_tokens=16,
    capture_sizes=(1, 2),
    hidden_size=16,
    num_heads=2,
    head_dim=8,
    rope_dim=4,
    q_lora_rank=8,
    o_lora_rank=8,
    window=4,
    index_num_heads=1,
    index_head_dim=8,
    index_topk=2,
    num_experts=2,
    num_experts_per_tok=1,
    moe_intermediate_size=8,
    vocab_size=32,
    block_size=4,
    compress_ratios=tuple((1, 4, 2, 4)[i % 4] for i in range(61)),
)


def test_61_layers_capture_and_decode():
    """Capture (one PIECEWISE graph per size, one attention break per layer), a prefill
    step too large for any graph (eager), then 4 replayed decode steps, equal to eager."""
    engine = Engine(TINY_61)
    assert len(engine.model.model.layers) == 61
    engine.capture_model()
    assert engine.runner.num_graphs == 2
    assert engine.runner.num_eager_breaks == 2 * 61
    result = engine.generate()
    assert len(result.steps) == 5
    assert result.steps[0].runtime_mode is CUDAGraphMode.NONE  # the prefill
    decode = [s for s in result.steps if s.uniform_decode]
    assert len(decode) == 4
    assert all(s.runtime_mode is CUDAGraphMode.PIECEWISE for s in decode)
    assert len(result.tokens[0]) == 5

    eager = Engine(TINY_61.eager_twin()).generate()
    token_agreement, max_logit_error = compare(result, eager)
    assert token_agreement == 1.0
    assert max_logit_error < 1e-4
