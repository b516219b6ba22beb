"""The bundled DeepSeek V4 engine's declared region invariants: the adapter's defaults.

They are the region decisions of vLLM's DeepSeek V4 attention, written as data
(``capturelint.invariants``), in the same TOML a project writes under
``[tool.capturelint.invariants]``; ``examples/invariants/pyproject.toml`` holds the same
tables (a test keeps them equal). A settings file or ``--invariants FILE`` replaces one
by giving its id, or drops it with ``enabled = false``.

- ``dsv4-v1-attention-prep-eager``: under Model Runner V1, in PIECEWISE graphs, the
  attention input preparation (q projection, fused q-norm / RoPE / KV insert, the
  compressors, the indexer query path) runs in an eager break: V1 captures without
  attention metadata, so a captured preparation replays its profile-run branch.
- ``dsv4-sparse-attention-eager``: in PIECEWISE graphs, nothing of the sparse-attention
  break (indexer top-k, sparse attention) is captured.
"""

from __future__ import annotations

from capturelint.invariants import Invariant, shipped_defaults

DEFAULTS_TOML = '''
[tool.capturelint.invariants.dsv4-v1-attention-prep-eager]
require = "eager"
runners = ["v1"]
modes = ["PIECEWISE"]
why = """Model Runner V1 captures its PIECEWISE graphs without attention metadata (a dummy run), \\
so attention input preparation captured there records the profile-run branch (no q-norm, RoPE, \\
KV-cache insert or compression) and replays it on every step (vLLM #51430); V1 keeps it in the \\
eager region (the wide region, vLLM #52401)"""
select = [
    { scope = "model.layers.*.attn.wq_b" },
    { scope = "model.layers.*.attn", function = "_prepare_and_attn" },
    { scope = "model.layers.*.attn", function = "_fused_qnorm_rope_kv_insert" },
    { scope = "model.layers.*.attn.compressor*" },
    { scope = "model.layers.*.attn.indexer*" },
    { scope = "model.layers.*.attn", function = "query" },
]

[tool.capturelint.invariants.dsv4-sparse-attention-eager]
require = "eager"
modes = ["PIECEWISE"]
why = """the indexer top-k and the sparse attention read each step's block tables and positions; \\
vLLM's DeepSeek V4 attention runs them in the eager break _sparse_indexer_and_attn under every \\
runner and region"""
select = [
    { scope = "model.layers.*.attn*", function = ["_sparse_indexer_and_attn", "select"] },
]
'''


def default_invariants() -> tuple[Invariant, ...]:
    """The bundled engine's invariants, with source ``default``."""
    return shipped_defaults(DEFAULTS_TOML, "capturelint/adapters/bundled/invariants.py")


__all__ = ["DEFAULTS_TOML", "default_invariants"]
