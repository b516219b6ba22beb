"""The architectures ``--engine vllm --model`` knows: the ones it checks, and every name
of vLLM 0.33.0's ``DEFAULT_BREAKABLE_CUDAGRAPH_ARCHITECTURES`` (``config/vllm.py:76``)
with the reason it is not checked yet. Pure data (no torch, no vLLM): the option's parser
reads it, and ``table`` turns a ``--model all`` report into the table of
``docs/vllm-architectures.md``.

Families (by the eager breaks their code takes, not by name):

- ``deepseek-v4``: vLLM's DeepSeek V4 attention in a tiny model of ours (``model``),
  with its compressed layers and indexer; the reproduction of the runners' capture
  conditions stands in for FULL graphs (``runners.real``);
- ``generic attention``: vLLM's own model class whose attention is vLLM's ``Attention``
  (eager break ``unified_attention_with_output``), over vLLM's Triton attention backend
  with reference kernels (``generic``), both runners and modes on vLLM's own runners;
- ``MLA``: vLLM's own DeepSeek V2/V3 model class whose attention is vLLM's
  ``MLAAttention`` (eager break ``unified_mla_attention_with_output``), over vLLM's Triton
  MLA backend with reference kernels (``mla``), both runners and modes on vLLM's own runners;
- ``Mamba2 hybrid``: vLLM's own model class whose layers are vLLM's ``MambaMixer2``
  (eager break ``mamba_mixer2``) beside ``Attention`` layers, with vLLM's hybrid KV
  cache plan (``mamba2``), both runners and modes on vLLM's own runners.

``python -m capturelint.adapters.vllm.archs REPORT.json...`` prints the Markdown table of
``check --engine vllm --model all --format json`` reports (merged shards too), or of
``--model ARCH`` reports, one per architecture.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any

from capturelint.findings import problem_entries

DEFAULT = "DeepseekV4ForCausalLM"
ALL = "all"


@dataclasses.dataclass(frozen=True)
class Arch:
    """An architecture name: its family, vLLM's module, and, when not checked, why."""

    name: str
    family: str
    module: str
    reason: str | None = None  # None: checked
    full_on_vllm_runners: bool = True  # FULL graphs run on vLLM's own runners (False: the reproduction)

    @property
    def supported(self) -> bool:
        return self.reason is None


_SPARSE_MLA = ("sparse MLA family (MLA attention with its eager break, mla_attention.py:1484, and the sparse-attention "
               "indexer, sparse_attn_indexer.py:437): no CPU references for its FlashMLA / DeepGEMM kernels yet")
_DSA = ("vLLM's own model runs on both runners (adapters/vllm/sparse_mla.py, kernels/sparse_mla_fused.py: V2 PIECEWISE "
        "graph run = eager), but V1 PIECEWISE captures without attention metadata (gpu_model_runner.py:5637), so "
        "fused_norm_rope's MLA/indexer cache writes are not in its graphs (CL101, token agreement 0.33: vLLM's hazard, "
        "as DeepSeek V4's #51430); V2 FULL equals eager but reports CL112 at the index group's side stream "
        "(index_group.py:147, not yet told apart from the emulation of vLLM's CPU placeholder stream); V1 FULL unchecked")
_GDN = ("gated delta-net hybrid (layers/mamba/gdn/*_gdn_linear_attn.py breaks; FLA Triton kernels in captured code "
        "need torch references): not covered yet")
_KIMI = ("Kimi K3 (models/kimi_k3/nvidia): its delta attention is the full-rank-gate KimiK3DeltaAttention (kda.py, "
         "not the KimiLinear layer the Kimi linear + MLA family checks), its MLP a latent MoE and its residual the "
         "attn_res stream: their Triton / CuTe DSL kernels have no CPU references yet")
_KIMI_MTP = ("Kimi K3's MTP draft (models/kimi_k3/nvidia/mtp.py): a speculative-decoding draft of Kimi K3, whose "
             "target is not covered (KimiK3ForConditionalGeneration), and vLLM's own runners are not driven with "
             "drafts for this family")

_DOTS3 = ("its full-attention layers are DeepSeek V3.2 sparse MLA with the indexer (Dots3NoteFullAttention, "
          "Dots3NotePaddedSparseBackend over FlashAttention's sparse MLA: the sparse MLA family's kernels); its "
          "sliding-window layers are dense MLA on Dots3NoteTritonMLABackend (models/dots3_note/nvidia/attention.py), "
          "whose decode gathers the window with its own Triton kernels (_gather_swa_kv_kernel, "
          "_apply_swa_score_mask_kernel) and whose prefill is flash-attn varlen (vllm_flash_attn): no CPU references "
          "for those yet (the MLA family's decode_attention_fwd and concat_and_cache_mla references cover the rest)")

CHECKED = (
    Arch(DEFAULT, "deepseek-v4", "vllm/models/deepseek_v4", full_on_vllm_runners=False),
    Arch("Qwen3ForCausalLM", "generic attention", "vllm/model_executor/models/qwen3.py"),
    Arch("LlamaForCausalLM", "generic attention", "vllm/model_executor/models/llama.py"),
    Arch("DeepseekV2ForCausalLM", "MLA", "vllm/model_executor/models/deepseek_v2.py"),
    Arch("DeepseekV3ForCausalLM", "MLA", "vllm/model_executor/models/deepseek_v2.py"),
    Arch("KimiLinearForCausalLM", "Kimi linear + MLA", "vllm/models/kimi_k3"),
    Arch("Qwen3NextForCausalLM", "gated delta-net hybrid", "vllm/model_executor/models/qwen3_next.py"),
    Arch("NemotronHForCausalLM", "Mamba2 hybrid", "vllm/model_executor/models/nemotron_h.py"),
)

NOT_YET = (
    Arch("AliceAIForCausalLM", "Kimi delta attention hybrid", "vllm/model_executor/models/alice_ai.py",
         "its linear-attention layers are KimiGatedDeltaNetAttention (layers/mamba/gdn/kimi_gdn_linear_attn.py, the "
         "layer the Kimi linear + MLA family checks), beside Qwen3-Next's gated full attention and MoE "
         "(Qwen3NextAttention, which the gated delta-net family checks): no family assembles the two yet"),
    Arch("BeamForCausalLM", "model folder", "vllm/models/beam",
         "its own attention classes (BeamAttention, DFlash2BeamAttention in models/beam/nvidia) over CUDA-only "
         "kernels: no CPU references yet"),
    Arch("DeepseekV32ForCausalLM", "sparse MLA", "vllm/models/deepseek_v32", _DSA),
    Arch("DeepseekV32MTPModel", "sparse MLA", "vllm/models/deepseek_v32", _SPARSE_MLA),
    Arch("DeepseekV4ForConditionalGeneration", "deepseek-v4", "vllm/models/deepseek_v4",
         "the multimodal wrapper of DeepseekV4ForCausalLM: its attention is checked as DeepseekV4ForCausalLM; the "
         "vision tower (no breakable graph) is not built"),
    Arch("DeepSeekV4MTPModel", "deepseek-v4", "vllm/models/deepseek_v4",
         "the MTP draft: checked by --model DeepseekV4ForCausalLM --spec mtp, not as a row of its own"),
    Arch("DeepseekV41ForCausalLM", "deepseek-v4.1", "vllm/models/deepseek_v41",
         "its own attention classes (models/deepseek_v41: MegaAttn, FlashInfer MLA, decoder replay layers) with 11 "
         "eager breaks: not covered yet"),
    Arch("Dots3NoteForCausalLM", "sparse MLA + sliding-window MLA", "vllm/models/dots3_note", _DOTS3),
    Arch("Dots3NoteMTPModel", "sparse MLA + sliding-window MLA", "vllm/models/dots3_note",
         "the MTP draft of Dots3NoteForCausalLM: " + _DOTS3),
    Arch("Glm5NextForCausalLM", "sparse MLA + gated delta-net", "vllm/models/glm5next", _SPARSE_MLA),
    Arch("Glm5NextForConditionalGeneration", "sparse MLA + gated delta-net", "vllm/models/glm5next", _SPARSE_MLA),
    Arch("Glm5NextMTPModel", "sparse MLA + gated delta-net", "vllm/models/glm5next", _SPARSE_MLA),
    Arch("GlmMoeDsaForCausalLM", "sparse MLA", "vllm/models/deepseek_v32", _DSA),
    Arch("HYV4ForCausalLM", "sparse MLA", "vllm/models/hy_v4", _SPARSE_MLA),
    Arch("HYV4MTPModel", "sparse MLA", "vllm/models/hy_v4", _SPARSE_MLA),
    Arch("InklingForCausalLM", "short convolution hybrid", "vllm/models/inkling",
         "short convolutions (layers/mamba/short_conv.py, Triton/causal-conv kernels in captured code) beside "
         "attention: not covered yet"),
    Arch("InklingForConditionalGeneration", "short convolution hybrid", "vllm/models/inkling",
         "the multimodal wrapper of InklingForCausalLM: short convolutions are not covered yet"),
    Arch("KimiK3ForConditionalGeneration", "Kimi linear + MLA", "vllm/models/kimi_k3", _KIMI),
    Arch("KimiK3MTPModel", "Kimi linear + MLA", "vllm/models/kimi_k3", _KIMI_MTP),
    Arch("MiniMaxM3SparseForCausalLM", "sparse attention + MLA", "vllm/models/minimax_m3",
         "MiniMax M3's sparse attention and MLA layers (models/minimax_m3): not covered yet"),
    Arch("MiniMaxM3SparseForConditionalGeneration", "sparse attention + MLA", "vllm/models/minimax_m3",
         "the multimodal wrapper of MiniMaxM3SparseForCausalLM: not covered yet"),
    Arch("MuseSpark1xForCausalLM", "model folder", "vllm/models/muse_spark",
         "on vLLM's list but not in its model registry (model_executor/models/registry.py): vLLM cannot build it "
         "by this name"),
    Arch("MuseSparkForConditionalGeneration", "model folder", "vllm/models/muse_spark",
         "its own attention classes (MuseSpark1xAttention in models/muse_spark/nvidia) over CUDA-only kernels: "
         "not covered yet"),
    Arch("Qwen4ExpForCausalLM", "gated delta-net + short conv + MLA", "vllm/models/qwen4_exp", _GDN),
    Arch("Qwen4ExpForConditionalGeneration", "gated delta-net + short conv + MLA", "vllm/models/qwen4_exp", _GDN),
    Arch("Qwen4ExpMTP", "gated delta-net + short conv + MLA", "vllm/models/qwen4_exp", _GDN),
    Arch("Step5ForCausalLM", "sparse attention", "vllm/models/step5",
         "Step5SparseAttention (models/step5/nvidia) over CUDA-only sparse kernels: not covered yet"),
    Arch("Step5ForConditionalGeneration", "sparse attention", "vllm/models/step5",
         "the multimodal wrapper of Step5ForCausalLM: not covered yet"),
)

ARCHS = {a.name: a for a in CHECKED + NOT_YET}
SUPPORTED = tuple(a.name for a in CHECKED)

# vLLM 0.33.0's DEFAULT_BREAKABLE_CUDAGRAPH_ARCHITECTURES (config/vllm.py:76), as the
# wheel has it: tests/vllm/test_vllm_archs.py compares it with the installed vLLM's.
VLLM_LIST = frozenset({
    "AliceAIForCausalLM", "BeamForCausalLM", "DeepseekV32MTPModel", "DeepseekV32ForCausalLM", "DeepseekV4ForCausalLM",
    "DeepseekV4ForConditionalGeneration", "DeepSeekV4MTPModel", "DeepseekV41ForCausalLM", "Dots3NoteForCausalLM",
    "Dots3NoteMTPModel", "Glm5NextForCausalLM", "Glm5NextForConditionalGeneration", "Glm5NextMTPModel",
    "GlmMoeDsaForCausalLM", "HYV4ForCausalLM", "HYV4MTPModel", "InklingForCausalLM", "InklingForConditionalGeneration",
    "KimiK3ForConditionalGeneration", "KimiK3MTPModel", "KimiLinearForCausalLM", "MiniMaxM3SparseForCausalLM",
    "MiniMaxM3SparseForConditionalGeneration", "MuseSpark1xForCausalLM", "MuseSparkForConditionalGeneration",
    "Qwen4ExpForCausalLM", "Qwen4ExpForConditionalGeneration", "Qwen4ExpMTP", "Step5ForCausalLM",
    "Step5ForConditionalGeneration",
})


def lookup(name: str) -> Arch | None:
    """The architecture of ``name``, any case; None for a name not known here."""
    found = ARCHS.get(name)
    if found is not None:
        return found
    return next((a for a in ARCHS.values() if a.name.lower() == name.lower()), None)


def split_label(runner: str) -> tuple[str, str]:
    """``Qwen3ForCausalLM:v1`` -> (``Qwen3ForCausalLM``, ``v1``): a ``--model all``
    configuration's runner label; a plain ``v1`` is the default architecture's."""
    arch, sep, plain = runner.rpartition(":")
    return (arch, plain) if sep else (DEFAULT, runner)


def step_loop(arch: str, mode: str) -> str:
    """Which step loop runs ``arch``'s configurations of ``mode`` (``plan.step_loop``)."""
    found = ARCHS.get(arch)
    if found is None or not found.supported:
        return "-"
    return "reproduction" if mode == "FULL" and not found.full_on_vllm_runners else "vLLM's runner"


def labelled(report: dict[str, Any]) -> dict[str, Any]:
    """``report`` with every configuration and finding labelled ``ARCH:runner``: a
    ``--model ARCH`` report names its architecture in its subject and its runners
    plainly (``v1``); a ``--model all`` report's labels already are."""
    model = (report.get("subject") or {}).get("model", DEFAULT)
    if model == ALL:
        return report

    def label(entry: dict[str, Any]) -> dict[str, Any]:
        return {**entry, "runner": entry["runner"] if ":" in entry["runner"] else f"{model}:{entry['runner']}"}

    expanded = {**report, "findings": [f for p in report.get("findings", []) for f in problem_entries(p)]}
    return {**report, **{key: [label(entry) for entry in expanded.get(key, [])]
                         for key in ("configurations", "findings", "numerical")}}


def table(reports: dict[str, Any] | list[dict[str, Any]]) -> list[tuple[str, str, str, str, str]]:
    """The rows of ``--model all`` JSON reports, or of ``--model ARCH`` reports one per
    architecture: (architecture, family, runner, mode, verdict), one per checked
    configuration (``safe``: no finding, and the replays and the eager twin compared
    equal; ``corrupting``: its first finding, the outputs differing from eager;
    ``hazard``: its first finding where the outputs still agreed in this workload), then
    one per name of vLLM's list not checked (``not supported yet``: the reason)."""
    rows = []
    findings: dict[tuple[str, str], list[dict[str, Any]]] = {}
    numbers: dict[tuple[str, str], dict[str, Any]] = {}
    configurations: list[dict[str, Any]] = []
    for report in [reports] if isinstance(reports, dict) else reports:
        report = labelled(report)
        configurations.extend(report.get("configurations", []))
        for f in (f for p in report.get("findings", []) for f in problem_entries(p)):  # one entry a problem
            findings.setdefault((f["runner"], f["mode"]), []).append(f)
        numbers.update({(n["runner"], n["mode"]): n for n in report.get("numerical", [])})
    for cfg in configurations:
        arch, runner = split_label(cfg["runner"])
        found = findings.get((cfg["runner"], cfg["mode"]), [])
        if found:
            first = found[0]
            where = first.get("location") or first.get("capture_frame") or first.get("step_frame") or {}
            at = f" at {where.get('file', '?')}:{where.get('line', '?')}" if where else ""
            n = numbers.get((cfg["runner"], cfg["mode"]))
            # a finding whose replays and eager twin still agreed in this workload is a
            # hazard the workload did not trip, not a corruption shown
            agreed = n is not None and n.get("token_agreement") == 1.0 and n.get("max_logit_error") == 0.0
            kind = "hazard (outputs agreed with eager in this workload)" if agreed else "corrupting"
            verdict = f"{kind}: {first['code']}{at} ({len(found)} finding{'s' if len(found) > 1 else ''})"
        else:
            verdict = "safe"
        rows.append((arch, ARCHS[arch].family if arch in ARCHS else "?", runner, cfg["mode"], verdict))
    for a in NOT_YET:
        rows.append((a.name, a.family, "v1, v2", "PIECEWISE, FULL", f"not supported yet: {a.reason}"))
    return rows


def markdown(reports: dict[str, Any] | list[dict[str, Any]]) -> str:
    """``docs/vllm-architectures.md``: the table of a ``--model all`` report, or of one
    ``--model ARCH`` report per architecture."""
    lines = [
        "# vLLM architectures: breakable CUDA graphs, checked",
        "",
        "Generated by `python -m capturelint.adapters.vllm.archs REPORT.json...` from the JSON reports of",
        "`capturelint check --engine vllm --model ARCH --format json`, one per checked architecture",
        "(`tests/vllm/data/model_all/`; the same rows as one `--model all` report), vLLM 0.33.0, the",
        "default workload and sizes of each family; `tests/vllm/test_vllm_archs.py` checks it is current.",
        "Every name of vLLM's `DEFAULT_BREAKABLE_CUDAGRAPH_ARCHITECTURES` (`config/vllm.py:76`) has a",
        "row; the checked families are described in `docs/vllm.md`.",
        "",
        "The step loop: `vLLM's runner` is vLLM's own `GPUModelRunner` (V1 or V2) capturing and",
        "replaying; `reproduction` is capturelint's reproduction of its capture conditions (DeepSeek",
        "V4's FULL graphs: `docs/vllm.md` says which rules running them on vLLM's runner would lose).",
        "",
        "| architecture | family | on vLLM's list | runner | mode | step loop | breakable graphs |",
        "|---|---|---|---|---|---|---|",
    ]
    for arch, family, runner, mode, verdict in table(reports):
        listed = "yes" if arch in VLLM_LIST else "no"
        loop = step_loop(arch, mode)
        lines.append(f"| `{arch}` | {family} | {listed} | {runner} | {mode} | {loop} | {verdict} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print("usage: python -m capturelint.adapters.vllm.archs REPORT.json... (check --engine vllm --model all, or "
              "--model ARCH, --format json reports)", file=sys.stderr)
        return 2
    reports = []
    for path in args:
        try:
            with open(path, encoding="utf-8") as f:
                reports.append(json.load(f))
        except (OSError, ValueError) as e:
            print(f"cannot read the report {path}: {e}", file=sys.stderr)
            return 2
    sys.stdout.write(markdown(reports))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["ALL", "ARCHS", "Arch", "CHECKED", "DEFAULT", "NOT_YET", "SUPPORTED", "VLLM_LIST", "labelled", "lookup", "markdown",
           "split_label", "step_loop", "table"]
