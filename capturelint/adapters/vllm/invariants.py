"""vLLM's declared region invariants: the defaults of ``--engine vllm``.

The same two region decisions as the bundled engine's (``bundled.invariants``), with
the same ids (a settings file that replaces or drops one does so under both engines),
but selecting vLLM 0.33.0's ops: the scopes are vLLM's module prefixes
(``model.layers.N.attn``) and the functions are those of
``vllm/models/deepseek_v4/attention.py`` and ``nvidia/flashmla.py``, which are not the
bundled engine's.

- ``dsv4-v1-attention-prep-eager``: under Model Runner V1, in PIECEWISE graphs, what
  ``_prepare_and_attn`` runs before the sparse attention stays eager (V1's
  ``_prepare_and_attn_eager``, attention.py:323-328): the q projection (``wq_b``, in
  ``project_query_and_cache_kv``), the fused q-norm / RoPE / KV insert
  (``_fused_qnorm_rope_kv_insert``), the compressor, and the indexer's query path
  (its own ops, ``wq_b`` and compressor). Not the input projections of ``forward``
  (``fused_wqa_wkv``, the indexer's ``weights_proj``) nor ``fused_q_kv_rmsnorm``:
  vLLM captures those under every runner.
- ``dsv4-sparse-attention-eager``: in PIECEWISE graphs, nothing of the break
  ``_sparse_indexer_and_attn`` is captured: ``forward_mqa`` and the FlashMLA calls
  under it (``_forward_decode``, ``_forward_prefill``, ``flash_mla_*``), and the
  indexer's top-k (``indexer.indexer_op``).

The compressor and indexer selectors are written from vLLM's module tree (the
compressed layers' ``named_modules``); the tiny model's ratio-4 and ratio-128 layers
(``layers``) run them.
"""

from __future__ import annotations

from capturelint.invariants import Invariant, shipped_defaults

DEFAULTS_TOML = '''
[tool.capturelint.invariants.dsv4-v1-attention-prep-eager]
require = "eager"
runners = ["v1"]
modes = ["PIECEWISE"]
why = """Model Runner V1 captures its PIECEWISE graphs without attention metadata (a dummy run), \\
so attention input preparation captured there records the profile-run branch (F.pad instead of \\
the q-norm, RoPE and KV-cache insert) and replays it on every step (vLLM #51430); V1 runs \\
_prepare_and_attn in the eager break _prepare_and_attn_eager (vLLM #52401)"""
select = [
    { scope = "model.layers.*.attn.wq_b" },
    { scope = "model.layers.*.attn", function = ["project_query_and_cache_kv", "_fused_qnorm_rope_kv_insert"] },
    { scope = "model.layers.*.attn.compressor*" },
    { scope = ["model.layers.*.attn.indexer", "model.layers.*.attn.indexer.wq_b", "model.layers.*.attn.indexer.compressor*"] },
]

[tool.capturelint.invariants.dsv4-sparse-attention-eager]
require = "eager"
modes = ["PIECEWISE"]
why = """the indexer top-k and the sparse attention read each step's block tables and positions; \\
vLLM's DeepSeek V4 attention runs them in the eager break _sparse_indexer_and_attn under every \\
runner and region"""
select = [
    { scope = "model.layers.*.attn", function = ["_sparse_indexer_and_attn", "forward_mqa", "_forward_decode",
                                                 "_forward_prefill", "flash_mla_*"] },
    { scope = "model.layers.*.attn.indexer.indexer_op*" },
]
'''


GENERIC_TOML = '''
[tool.capturelint.invariants.attention-eager]
require = "eager"
modes = ["PIECEWISE"]
why = """vLLM's Attention runs the attention kernel in the eager break unified_attention_with_output \\
(model_executor/layers/attention/attention.py:770): it reads each step's attention metadata (query start \\
locations, sequence lengths, block tables) and picks its launch from the step's sizes, so captured it would \\
replay the capture's; only the KV-cache write (unified_kv_cache_update) is captured. Selected: the attention \\
kernel, the opaque op, and the profile run's zero fill of the output (TritonAttentionImpl.forward, what a capture \\
without metadata runs there)"""
select = [
    { scope = "model.layers.*.self_attn.attn", op = ["capturelint_vllm.unified_attention*", "vllm.unified_attention_with_output*"] },
    { scope = "model.layers.*.self_attn.attn", function = "forward", op = "aten.fill_*" },
]
'''


MAMBA2_TOML = '''
[tool.capturelint.invariants.mamba2-mixer-eager]
require = "eager"
modes = ["PIECEWISE"]
why = """vLLM's MambaMixer2 runs its convolution and state-space scan in the eager break mamba_mixer2 \\
(model_executor/layers/mamba/mamba_mixer2.py:1229): they read each step's Mamba2 metadata (prefill and decode \\
split, query start locations, state indices, initial-state flags) and write the request's conv and SSM state \\
lines, so captured they would replay the capture's split and lines; the projections and the gated norm around \\
it are captured. Selected: the break's op and its kernels"""
select = [
    { scope = "model.layers.*.mixer", op = ["vllm.mamba_mixer2*", "capturelint_vllm.causal_conv1d*",
                                            "capturelint_vllm.selective_state_update*",
                                            "capturelint_vllm.mamba_chunk_scan*"] },
]

[tool.capturelint.invariants.hybrid-attention-eager]
require = "eager"
modes = ["PIECEWISE"]
why = """the hybrid's attention layers are vLLM's Attention, whose attention kernel runs in the eager break \\
unified_attention_with_output (model_executor/layers/attention/attention.py:770), as in the generic family's \\
attention-eager; only the KV-cache write is captured"""
select = [
    { scope = "model.layers.*.mixer.attn", op = ["capturelint_vllm.unified_attention*", "vllm.unified_attention_with_output*"] },
]
'''


# The gated delta-net hybrid: its full-attention layers are vLLM's Attention (the
# generic family's attention-eager, the same scopes), its linear-attention
# layers keep the convolution and the delta rule in the break qwen_gdn_attention_core.
GDN_TOML = GENERIC_TOML + '''
[tool.capturelint.invariants.gdn-core-eager]
require = "eager"
runners = ["v2"]
modes = ["PIECEWISE"]
why = """vLLM's gated delta-net layer runs its convolution and delta rule in the eager break \\
qwen_gdn_attention_core (model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py:2243): they read each \\
step's GDN metadata (prefill/decode split, state indices, query start locations) and update the conv and \\
recurrent states of the step's requests, so captured they would replay the capture's; the input and output \\
projections and the gated norm are captured. Selected: the op and the kernels under it. Model Runner V2 only: V1 captures its PIECEWISE graphs in a \\
dummy run without GDN metadata, where the break returns before any of them, so there is nothing to select"""
select = [
    { scope = "model.layers.*.linear_attn", op = ["vllm.qwen_gdn_attention_core*", "capturelint_vllm.gdn_*",
                                              "capturelint_vllm.causal_conv1d*"] },
]
'''


MLA_TOML = '''
[tool.capturelint.invariants.mla-attention-eager]
require = "eager"
modes = ["PIECEWISE"]
why = """vLLM's MLAAttention runs the latent attention in the eager break unified_mla_attention_with_output \\
(model_executor/layers/attention/mla_attention.py:1484): forward_impl splits the step into decode and prefill \\
rows by the step's attention metadata (num_decode_tokens), the decode attention reads each step's block tables \\
and sequence lengths and the prefill its query start locations, so captured they would replay the capture's; only \\
the latent KV-cache write (unified_mla_kv_cache_update) is captured. Selected: the decode path (forward_mqa with \\
its decode kernel, the W_UK and W_UV absorptions), the prefill path (forward_mha), and the profile run's zero \\
fill of the output (forward_impl, what a capture without metadata runs there)"""
select = [
    { scope = "model.layers.*.self_attn.mla_attn.mla_attn", op = ["capturelint_vllm.mla_decode_attention*"] },
    { scope = "model.layers.*.self_attn.mla_attn.mla_attn", function = ["forward_mqa", "forward_mha", "_v_up_proj"] },
    { scope = "model.layers.*.self_attn.mla_attn.mla_attn", function = "forward_impl", op = ["aten.fill_*", "aten.bmm*"] },
]
'''


# Kimi-Linear (adapters/vllm/kimi.py): both kinds of layer keep their kernels in an eager break.
KIMI_TOML = '''
[tool.capturelint.invariants.kda-eager]
require = "eager"
modes = ["PIECEWISE"]
why = """vLLM's Kimi delta attention runs its short convolution and delta rule in the eager break \\
KimiGatedDeltaNetAttention._forward (model_executor/layers/mamba/gdn/kimi_gdn_linear_attn.py): they read each \\
step's GDN metadata (prefill/decode split, state indices, query start locations) and update the conv and \\
recurrent states of the step's requests, so captured they would replay the capture's; the projections and the \\
output projection are captured. Selected: the convolutions, the chunked prefill, the packed decode, the \\
initial-state gather"""
select = [
    { scope = "model.layers.*.self_attn", op = ["capturelint_vllm.chunk_kda*", "capturelint_vllm.kda_packed_decode*", "capturelint_vllm.gather_initial_states*", "capturelint_vllm.causal_conv1d*"] },
]

[tool.capturelint.invariants.kimi-mla-attention-eager]
require = "eager"
modes = ["PIECEWISE"]
why = """vLLM's Kimi MLA layer (models/kimi_k3/nvidia/mla.py) runs its latent attention in the eager break \\
MultiHeadLatentAttention._attention: it splits the step into decode and prefill rows by the step's attention \\
metadata, writes the latent cache at the step's slots and reads its block tables and sequence lengths, so \\
captured it would replay the capture's. Selected: the fused epilogues (key concat / decode query concat with the \\
cache insert), the decode attention and the W_UV up-projection"""
select = [
    { scope = "model.layers.*.self_attn", op = ["_C.fused_kimi_k3_mla_*", "capturelint_vllm.mla_decode_attention*"] },
    { scope = "model.layers.*.self_attn", function = ["_v_up_proj", "forward_mqa"] },
]
'''


SPARSE_MLA_TOML = '''
[tool.capturelint.invariants.sparse-mla-indexer-attention-eager]
require = "eager"
modes = ["PIECEWISE"]
why = """DeepSeek V3.2's attention (models/deepseek_v32/attention.py) runs the indexer's top-k and the sparse MLA \\
in the eager break _sparse_indexer_and_attn: sparse_attn_indexer (model_executor/layers/sparse_attn_indexer.py:437, \\
itself an eager break) reads each step's indexer metadata (decode/prefill split, sequence lengths, block tables) and \\
picks its prefill chunks and decode path on the host, and FlashMLA sparse's forward_mqa converts the step's top-k \\
indices to cache slots through its block table; captured, they would replay the capture's. Only the projections, \\
norms, RoPE and the cache writes (fused_norm_rope, fused_q) are captured"""
select = [
    { scope = "model.layers.*.self_attn", function = ["_sparse_indexer_and_attn", "sparse_attn_indexer", "forward_mqa",
                                                       "_forward_bf16_kv", "_bf16_flash_mla_kernel", "flash_mla_*"] },
]
'''


def default_invariants() -> tuple[Invariant, ...]:
    """vLLM's invariants for DeepSeek V4 (the default architecture), with source ``default``."""
    return shipped_defaults(DEFAULTS_TOML, "capturelint/adapters/vllm/invariants.py")


__all__ = ["DEFAULTS_TOML", "GDN_TOML", "GENERIC_TOML", "KIMI_TOML", "MAMBA2_TOML", "MLA_TOML", "SPARSE_MLA_TOML",
           "default_invariants"]
