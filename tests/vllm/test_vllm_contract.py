"""Contract tests: every piece of vLLM's model runners (and of its metadata builders and
Triton kernels) that ``capturelint/adapters/vllm/runners/reproduced.py`` and the
references of ``capturelint/adapters/vllm/kernels/`` stand in for, read from the installed vLLM's source.

Each row of ``CONTRACT`` names a vLLM function (file under the ``vllm`` package and
qualified name, found with ``ast``: nothing of vLLM is imported), the shim that
reproduces it, the facts of its source the shim relies on (lines that must still be
there, compared without their indentation), and the sha256 of the whole function as
vLLM 0.33.0 has it. A changed fact says which rule the shim copies no longer holds; a
changed hash alone says the function changed: re-read it against the shim, then update
the hash here. The integrator extends the table (one row per stood-in function).
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
from pathlib import Path
from typing import NamedTuple

import pytest

RUNNERS = "capturelint/adapters/vllm/runners/reproduced.py"
KERNELS = "capturelint/adapters/vllm/kernels/triton_ops.py"
LAYERS = "capturelint/adapters/vllm/layers.py"
COMPRESSED = "capturelint/adapters/vllm/kernels/compressed.py"


class Contract(NamedTuple):
    file: str  # under the vllm package
    qualname: str  # Class.method or function
    shim: str  # what stands in for it
    facts: tuple[str, ...]  # lines of its source the shim relies on
    sha256: str  # of its source (ast segment, as vLLM 0.33.0 has it)


CONTRACT: tuple[Contract, ...] = (
    # ---- Model Runner V1 (v1/worker/gpu_model_runner.py)
    Contract("v1/worker/gpu_model_runner.py", "GPUModelRunner.capture_model", f"{RUNNERS} ReproducedLoop.capture", (
        "for (",
        ") in self.cudagraph_dispatcher.get_capture_descs():",
    ), "f4823db6c420e412f43d5af884493932f127d85e863d61d58781fd83b98152d3"),
    Contract("v1/worker/gpu_model_runner.py", "GPUModelRunner._warmup_and_capture", f"{RUNNERS} ReproducedLoop.capture (V1)", (
        "force_attention = cudagraph_runtime_mode == CUDAGraphMode.FULL",
        "cudagraph_runtime_mode=CUDAGraphMode.NONE,",
        "force_attention=force_attention,",
        "is_graph_capturing=True,",
    ), "8e8c0ae94c226bf91f7c72db05feea75ad16f5bc67215e9e97fe840594b07a10"),
    Contract("v1/worker/gpu_model_runner.py", "GPUModelRunner._dummy_run",
             f"{RUNNERS} ReproducedLoop.dummy_batch and ReproducedLoop.capture (V1)", (
        "max_query_len = self.uniform_decode_query_len if uniform_decode else num_tokens",
        "num_reqs = min(max_num_reqs, cdiv(num_tokens, max_query_len))",
        "num_reqs = min(num_tokens, max_num_reqs)",
        "num_scheduled_tokens_list[-1] += num_tokens % num_reqs",
        "sm.fill_(-1)",
        "if force_attention or cudagraph_runtime_mode == CUDAGraphMode.FULL:",
        "seq_lens = max_query_len  # type: ignore[assignment]",
        "pad_attn = cudagraph_runtime_mode == CUDAGraphMode.FULL",
        "num_tokens_padded=num_tokens_padded if pad_attn else None,",
    ), "34f0dd3b447f7a365faf19a6e320a6ec6372a6335f4af3228c12c6555ab35b18"),
    Contract("v1/worker/gpu_model_runner.py", "GPUModelRunner._determine_batch_execution_and_padding",
             f"{RUNNERS} ReproducedLoop.step_batch (V1 dispatch)", (
        "uniform_decode = self._is_uniform_decode(",
        "cudagraph_mode, batch_descriptor = dispatch_cudagraph(",
    ), "10568f0f2bbf3223312aeabfd32f0226c937d03713bcf470ef7b66837d3a92c7"),
    Contract("v1/worker/gpu_model_runner.py", "GPUModelRunner._is_uniform_decode", f"{RUNNERS} uniform_decode", (
        "(max_num_scheduled_tokens == uniform_decode_query_len)",
        "and (num_tokens == max_num_scheduled_tokens * num_reqs)",
    ), "6f1a58c1f3aaaaf63e9a7a3f00478d5cb9fd5b514b3df77430df3ed32352c75f"),
    Contract("v1/worker/gpu_model_runner.py", "GPUModelRunner.execute_model", f"{RUNNERS} ReproducedLoop.step_batch (V1 padding)", (
        "pad_attn = cudagraph_mode == CUDAGraphMode.FULL",
        "if pad_attn or has_separate_kv_update",
        "else num_tokens_unpadded,",
        "num_tokens_padded=num_tokens_padded if pad_attn else None,",
        "num_reqs_padded=num_reqs_padded if pad_attn else None,",
    ), "d2d938ab66d17641ea6d80b04602377db31782252f238ec52325359c8b511467"),
    Contract("v1/worker/gpu_model_runner.py", "GPUModelRunner._build_attention_metadata",
             f"{RUNNERS} Buffers.fill (padded request rows)", (
        "blk_table_tensor[num_reqs:num_reqs_padded].fill_(NULL_BLOCK_ID)",
        "num_actual_tokens=num_tokens_padded,",
        "num_reqs=num_reqs_padded,",
    ), "9149aa497886bb6e5d759619bf8055cd9913c4d82fb59d65ad3851ac79024e79"),
    Contract("v1/attention/backend.py", "AttentionBackend",
             f"{RUNNERS} ReproducedLoop.step_batch (V1 slots: has_separate_kv_update is False for DeepSeek V4's "
             "backends)", (
        "forward_includes_kv_cache_update: bool = True",
    ), "34f6dd22fc352c7bb951012abc818a325ad45ae271a68b790574c799dd7fde8a"),
    # ---- Model Runner V2 (v1/worker/gpu/)
    Contract("v1/worker/gpu/cudagraph_utils.py", "CudaGraphManager.capture", f"{RUNNERS} ReproducedLoop.capture (V2)", (
        "forward_fn = create_forward_fn(desc, warmup=True)",
        "forward_fn(CUDAGraphMode.NONE)",
        "forward_fn = create_forward_fn(desc, warmup=False)",
        "forward_fn(CUDAGraphMode.PIECEWISE)",
    ), "8be255879fcb2e5398acb5bc9625a8b7bd09d8a6e6f18aca705d72921a1a505a"),
    Contract("v1/worker/gpu/cudagraph_utils.py", "prepare_inputs_to_capture", f"{RUNNERS} ReproducedLoop.dummy_batch (V2)", (
        "if full_cudagraph and max_query_len is None:",
        "max_query_len = num_tokens",
        "slot_mappings = block_table_provider.get_dummy_slot_mappings(num_tokens)",
        "CUDAGraphMode.NONE,",
        "for_capture=full_cudagraph,",
    ), "e4ebddcea1f7f534ee51a1255d19b570868478519f8f3acb0466c15b5557cfa4"),
    Contract("v1/worker/gpu/cudagraph_utils.py", "CudaGraphManager._init_candidates",
             f"{RUNNERS} ReproducedLoop.step_batch (V2 dispatch: V1's CudagraphDispatcher stands in)", (
        "num_reqs = None",
        "if mixed_mode == CUDAGraphMode.FULL:",
        "num_reqs = min(num_tokens, self.max_num_reqs)",
        "uniform_token_count=decode_query_len,",
    ), "7b0069dd710cc2261d8b83d95687db1bc4eca9a9426c7322a13c717d4a9cb6bd"),
    Contract("v1/worker/gpu/cudagraph_utils.py", "CudaGraphManager.dispatch", f"{RUNNERS} ReproducedLoop.step_batch (V2 dispatch)", (
        "for desc in self._candidates[key]:",
    ), "971b00ab53725f7d808d101876387b6a608a8752800dba00d3c14ed36bd301f9"),
    Contract("v1/worker/gpu/model_states/default.py", "DefaultModelState.prepare_attn",
             f"{RUNNERS} ReproducedLoop.metadata (V2 padded vs real counts)", (
        "if cudagraph_mode == CUDAGraphMode.FULL:",
        "num_reqs = input_batch.num_reqs_after_padding",
        "num_tokens = input_batch.num_tokens_after_padding",
        "num_reqs = input_batch.num_reqs",
        "num_tokens = input_batch.num_tokens",
    ), "be05d7e505d5ae43ac1a92612934217e1255b80a1c1956e361131655753b5773"),
    Contract("v1/worker/gpu/model_runner.py", "GPUModelRunner.prepare_attn", f"{RUNNERS} ReproducedLoop.step_batch (V2 slots)", (
        "num_tokens_padded=input_batch.num_tokens_after_padding,",
    ), "9686a3b33dd6b3f86a5ec72dc21e8058bbd5db7ec2c0dcab9c34a24a9bd75ac4"),
    Contract("v1/worker/gpu/block_table.py", "BlockTables.compute_slot_mappings", f"{RUNNERS} Buffers.fill (V2 slots)", (
        "return slot_mappings[:, :num_tokens_padded]",
    ), "35387dddbea0c3fc3dbc2bf88a6c6205c8bd126b4d64ce0432a6d5dd6032e9c5"),
    Contract("v1/worker/gpu/block_table.py", "BlockTables.get_dummy_slot_mappings", f"{RUNNERS} Buffers.fill (dummy)", (
        "self.slot_mappings.fill_(PAD_SLOT_ID)",
    ), "fbeefc3733ec8146345a5d6b4c4146eb78c2d8783a9e70f3cb374bb85016a16c"),
    Contract("v1/worker/gpu/input_batch.py", "InputBatch.make_dummy", f"{RUNNERS} ReproducedLoop.dummy_batch (V2)", (
        "num_scheduled_tokens[-num_extra:] += 1",
        "input_buffers.seq_lens[: num_reqs - num_extra] = base_tokens",
        "input_buffers.query_start_loc[num_reqs + 1 :] = num_tokens",
        "input_ids = input_buffers.input_ids[:num_tokens].zero_()",
        "positions = input_buffers.positions[:num_tokens].zero_()",
    ), "987fd4ed5dbb40449729f8320db93163bc45b73751e00ac195f0a7be2be8915a"),
    # ---- the SWA metadata builder (v1/attention/backends/mla/sparse_swa.py)
    Contract("v1/attention/backends/mla/sparse_swa.py", "DeepseekSparseSWAMetadataBuilder.build",
             f"{RUNNERS} ReproducedLoop.metadata", (
        "split_decodes_and_prefills(",
        "is_valid_token = self.is_valid_token[: slot_mapping.shape[0]]",
        "torch.ge(slot_mapping, 0, out=is_valid_token)",
        "self.decode_swa_lens[num_decode_tokens:] = 0",
        "decode_swa_indices=decode_swa_indices[:num_decode_tokens],",
        "tile_sched = self.build_tile_scheduler(num_decode_tokens)",
        "common_attn_metadata.max_query_len, self.decode_threshold",
    ), "3236e2be90c0d4f4b52a07cdbe294e3345073666911fdbd2decb736dac42b182"),
    Contract("v1/attention/backends/mla/sparse_swa.py", "DeepseekSparseSWAMetadataBuilder._build_deepseek_v4_metadata",
             f"{RUNNERS} ReproducedLoop.metadata (prefill fields)", (
        'result["prefill_seq_lens"] = seq_lens[num_decodes:]',
        'result["prefill_gather_lens"] = pfx_gather_lens',
    ), "02a04f0c70da8d3e891264376171d6f62bfb94f442d6e1c3ee4fc4c785c205de"),
    Contract("v1/attention/backends/mla/sparse_swa.py", "ComputePrefillMetadataKernel.kernel",
             f"{RUNNERS} ReproducedLoop.metadata (prefill_gather_lens)", (
        "gather_len = query_len + tl.minimum(visible_prefix, window_size - 1)",
    ), "f1fa213a5110b79e7c183fbdffe8101474531e770fe233604b49c88919b7ccc0"),
    Contract("v1/attention/backends/mla/sparse_swa.py", "_compute_swa_indices_and_lens_kernel",
             f"{RUNNERS} swa_indices_and_lens", (
        "pos = prefix_len + token_idx - query_start",
        "start_pos = tl.maximum(pos - (window_size - 1) - left_add, 0)",
        "slot_ids = tl.where(offset < swa_len, slot_ids, -1)",
    ), "baa102ea4ef4cecf6a95586d95bba9bb2b11d211d2c1e3a7551ec2fbccf6da91"),
    Contract("v1/attention/ops/metadata.py", "compute_token_to_req_indices", f"{RUNNERS} ReproducedLoop.metadata (token map)", (
        "CUDA graph. Tokens at or past ``num_mapped_tokens`` are mapped to 0.",
    ), "e17740f4b2e84c3f6801b88687609ee1afebbbd5e6e14fce91c1ffea57ba5d7a"),
    # ---- the prefill path's Triton kernels (models/deepseek_v4/common/ops/cache_utils.py)
    Contract("models/deepseek_v4/common/ops/cache_utils.py", "dequantize_and_gather_k_cache",
             f"{KERNELS} DequantizeAndGatherKCache", (
        "if has_cutedsl():",
        "_DEQUANTIZE_AND_GATHER_K_CACHE_KERNEL(",
    ), "3c17492a1767383161e7451918bfc7c917801a5219718e404394537ef54fd515"),
    Contract("models/deepseek_v4/common/ops/cache_utils.py", "DequantizeAndGatherKCacheKernel.kernel",
             f"{KERNELS} reference_dequantize_and_gather_k_cache", (
        "start_pos = seq_len - gather_len",
        "output_row_ptr = (",
        "out_ptr + batch_idx * out_stride0 + (offset + i) * out_stride1",
    ), "831548724b8ab2bcc15b4824a94b6f957013c6771eb0a29a2e9f01a4fe28c0af"),
    Contract("models/deepseek_v4/common/ops/cache_utils.py", "combine_topk_swa_indices", f"{KERNELS} CombineTopkSwaIndices", (
        "combined_indices.fill_(-1)",
        "_COMBINE_TOPK_SWA_INDICES_KERNEL(",
    ), "fd23dee5ab1ccab02b03fc4eb3488df3d1ea4ebb99d289a5f6e75297677c7eb7"),
    Contract("models/deepseek_v4/common/ops/cache_utils.py", "CombineTopkSwaIndicesKernel.kernel",
             f"{KERNELS} reference_combine_topk_swa_indices", (
        "topk_len = tl.minimum((pos + 1) // COMPRESS_RATIO, TOP_K)",
        "swa_start = tl.maximum(pos - (WINDOW_SIZE - 1) - left_add, 0)",
        "topk_indices + M * batch_idx,",
        "M * batch_idx + N + swa_start + swa_offset - gather_start,",
    ), "d76d190b02c79c0c51caca60267356a4ba88f6a31719e149565371a96ee5d6d8"),
    # ---- the compressed layers' metadata builders (layers.LayerMetadata) and what the workload relies on
    Contract("models/deepseek_v4/sparse_mla.py", "DeepseekV4SparseMLAMetadataBuilder.build",
             f"{LAYERS} LayerMetadata.build (compressed attention)", (
        "slot_mapping = get_compressed_slot_mapping(",
        "cm.block_table_tensor.clamp_(min=0),",
        "if self.compress_ratio == 128:",
        "max_query_len=cm.max_query_len,",
        "block_table=cm.block_table_tensor,",
    ), "87dced6cc63f68de2676c8c668462c267e69753f328376fd7ebdd2d296e18f8c"),
    Contract("models/deepseek_v4/sparse_mla.py", "DeepseekV4SparseMLAMetadataBuilder._build_c128a_metadata",
             f"{LAYERS} LayerMetadata.build (C128A)", (
        "decode_threshold=self.reorder_batch_threshold or 1,",
        "cm.positions[:num_total],",
        "cm.block_table_tensor[:num_decodes],",
        'result["c128a_prefill_topk_indices"] = prefill_local',
    ), "20b7512ab96a13e7ba42bf4c542399b6e6e58fecf7af0c9ea707262bd1194e3d"),
    Contract("models/deepseek_v4/compressor.py", "CompressorMetadataBuilder.build",
             f"{LAYERS} LayerMetadata._state", (
        "block_table=common_attn_metadata.block_table_tensor.clamp_(min=0),",
        "slot_mapping=common_attn_metadata.slot_mapping,",
        "if self.block_size == 8 and not async_spec_decode",
    ), "84b4f89ffa93b05b5fdbad57a9116f792b025caa6580900d8fa490a44eec8694"),
    Contract("models/deepseek_v4/compressor.py", "_get_c128_boundary", f"{LAYERS} LayerMetadata.build (c128_boundary)", (
        "start % 128 + query_start_loc[i + 1] - query_start_loc[i] >= 128",
    ), "0e2ab7700204c3cc73eecdb3e0d4b74d16c3c774f7067fc90876231283976d0d"),
    Contract("models/deepseek_v4/compressor.py", "DeepseekCompressor._compress_norm_rope_store",
             f"{COMPRESSED} CompressNormRopeStoreKernel (addressable)", (
        "num_actual = slot_mapping.shape[0]",
    ), "2e567c27360db43c74e3eacd80c30ee962ec64fc43e0650c2dd8fb35794f24e9"),
    Contract("v1/attention/backends/mla/compressor_utils.py", "get_compressed_slot_mapping",
             f"{COMPRESSED} compress_norm_rope_store (PAD past the view)", (
        "out.fill_(-1)",
        "compressed_slot_mapping = out[:num_tokens]",
    ), "1ab65db011897945d9d7ef5fb99b122de8f3646688009f0d0d8dab291f9894e7"),
    Contract("v1/attention/backends/mla/indexer.py", "DeepseekV32IndexerMetadataBuilder.build",
             f"{LAYERS} LayerMetadata.build (indexer)", (
        "seq_lens // self.compress_ratio if self.compress_ratio > 1 else seq_lens",
        "if metadata is not None:",
        "decode_lens = self.decode_lens_buffer[:num_decodes]",
        "block_table = common_attn_metadata.block_table_tensor[:num_decodes, ...]",
    ), "8be8e4ca9ebba095e15f26a4b169b3d229c18af387a5a189bf976d436ef5b45a"),
    Contract("v1/attention/backends/mla/indexer.py", "build_prefill_chunk_metadata",
             f"{LAYERS} LayerMetadata._indexer_prefill", (
        "if total_seq_lens == 0:",
    ), "95d0780aa9a926060ff323d84b8b7ebac500399ff9d1e5309eaa42cb7735e04b"),
    Contract("models/deepseek_v4/attention.py", "DeepseekV4Indexer.forward", f"{LAYERS} INDEX_TOPK, the workload", (
        "indexer_metadata.max_seq_len // self.compress_ratio <= self.topk_tokens",
        "and not torch.cuda.is_current_stream_capturing()",
    ), "06e35b9060f63abb3678de017a203e7f4b845e152edd3fac0e6ebb8eecbcc9b3"),
    Contract("v1/attention/backends/mla/indexer.py", "BuildPrefillChunkMetadataKernel.kernel",
             f"{COMPRESSED} build_prefill_chunk_metadata", (
        "tl.store(cu_compressed_seq_len_ks_ptr + out_pos, row_start, mask=mask)",
        "global_ctx = start_pos + 1 + offset",
        "len_per_token = global_ctx // COMPRESS_RATIO",
        "tl.store(token_to_seq_ptr + seq_start + offset, batch_idx, mask=mask)",
    ), "90d838c6a153528d2278190e459177efc3174ac320c5e5fb2c94224d36deb4cb"),
    Contract("utils/deep_gemm.py", "fp8_fp4_mqa_logits", f"{COMPRESSED} fp8_mqa_logits", (
        "Compressed logits of shape [M, max_seqlen_k]: row ``i`` holds K",
        "positions ``[cu_seqlen_ks[i], cu_seqlen_ke[i])`` starting at column",
    ), "d5fd7b1e2c1127ef6ed394085aa5dd22a29cbd94ce08e17e21aa058dedbaf720"),
    Contract("model_executor/layers/sparse_attn_indexer.py", "as_fp32_logits", f"{COMPRESSED} fp8_mqa_logits (fp32)", (
        "if logits.dtype == torch.float32:",
        "return logits",
    ), "fe42443f549e579c4d3ad2866013594ecba7563f299a37ef67a128fae83c36d9"),
    Contract("model_executor/layers/sparse_attn_indexer.py", "sparse_attn_indexer",
             f"{COMPRESSED} top_k_per_row_prefill (row starts 0)", (
        "row_ends = cu_seqlen_ke - cu_seqlen_ks",
        "torch.zeros_like(row_ends) if row_starts is None else row_starts,",
        "ops.cp_gather_indexer_k_quant_cache(",
    ), "9362147cce22311ea3bf5d37646c768e505768d73292ecc82f2e2d59995624d8"),
    Contract("v1/worker/gpu/block_table.py", "BlockTables.gather_block_tables",
             f"{RUNNERS} ReproducedLoop.metadata (V2 block tables)", (
        "return tuple(bt[:num_reqs_padded] for bt in out)",
    ), "5a6a762b454a94c1e5c189d1df4c37b3702504ad07f2643d290cbd105b6515f3"),
    Contract("v1/worker/gpu/model_runner.py", "GPUModelRunner.prepare_inputs", f"{RUNNERS} ReproducedLoop.step_batch (V2 rows)", (
        "num_reqs_padded = batch_desc.num_reqs or num_reqs",
    ), "1fd182d1b6d7f689917f00f644474e112ee5b67d59a6e013b46e620933f93fbb"),
)


def _vllm_root() -> Path:
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("vLLM is not installed")
    return Path(list(spec.submodule_search_locations)[0])


def source_of(path: Path, qualname: str) -> str:
    """The source of ``qualname`` (``Class.method`` or ``function``) in ``path``, as
    ``ast`` delimits it (decorators left out)."""
    text = path.read_text()
    node: ast.AST = ast.parse(text)
    for part in qualname.split("."):
        found = [n for n in ast.iter_child_nodes(node)
                 if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == part]
        if not found:
            raise LookupError(f"{qualname} is not in {path}")
        node = found[0]
    return ast.get_source_segment(text, node) or ""


def problems(contract: Contract, root: Path) -> list[str]:
    """What no longer holds of ``contract`` in the vLLM package at ``root``: its
    function gone, a fact missing, or (facts intact) its hash changed."""
    try:
        source = source_of(root / contract.file, contract.qualname)
    except LookupError:
        return [f"vLLM's {contract.qualname} is gone from {contract.file}: re-check {contract.shim}"]
    lines = {line.strip() for line in source.splitlines()}
    missing = [fact for fact in contract.facts if fact.strip() not in lines]
    if missing:
        return [f"vLLM's {contract.qualname} ({contract.file}) no longer says {missing}: the rule {contract.shim} "
                "copies changed; re-check it"]
    digest = hashlib.sha256(source.encode()).hexdigest()
    if digest != contract.sha256:
        return [f"vLLM's {contract.qualname} ({contract.file}) changed (sha256 {digest}): re-check {contract.shim} "
                "against it, then update its sha256 in this table"]
    return []


@pytest.mark.parametrize("contract", CONTRACT, ids=lambda c: c.qualname)
def test_the_vllm_code_a_shim_stands_in_for_is_unchanged(contract: Contract):
    assert problems(contract, _vllm_root()) == []


def test_the_contract_covers_each_function_once():
    assert len({(c.file, c.qualname) for c in CONTRACT}) == len(CONTRACT)


def test_a_changed_rule_names_the_shim_to_recheck(tmp_path: Path):
    """V2 building PIECEWISE metadata with padded counts (a changed line), a comment
    added (the hash), the method renamed (gone): each is reported with the shim."""
    contract = next(c for c in CONTRACT if c.qualname == "DefaultModelState.prepare_attn")
    original = (_vllm_root() / contract.file).read_text()
    target = tmp_path / contract.file
    target.parent.mkdir(parents=True)
    for edit, expected in (
        (("num_reqs = input_batch.num_reqs\n", "num_reqs = input_batch.num_reqs_after_padding\n"), "no longer says"),
        (("max_query_len = input_batch.max_query_len\n", "max_query_len = input_batch.max_query_len  # x\n"),
         "changed (sha256"),
        (("def prepare_attn(", "def prepare_attention("), "is gone"),
    ):
        assert edit[0] in original
        target.write_text(original.replace(edit[0], edit[1], 1))
        (message,) = problems(contract, tmp_path)
        assert expected in message and "ReproducedLoop.metadata" in message, message


def test_deepseek_v4s_backends_keep_the_kv_update_in_forward():
    """V1 sizes a PIECEWISE step's slot mapping by its real tokens unless a backend
    updates the KV cache outside ``forward`` (``has_separate_kv_update``,
    gpu_model_runner.py:4040-4046); ``ReproducedLoop.step_batch`` relies on DeepSeek V4's
    backends keeping ``AttentionBackend``'s default (True)."""
    root = _vllm_root()
    files = [root / "v1/attention/backends/mla/sparse_swa.py", *sorted((root / "models/deepseek_v4").rglob("*.py"))]
    overriding = [str(p.relative_to(root)) for p in files if "forward_includes_kv_cache_update" in p.read_text()]
    assert overriding == [], f"{overriding} set forward_includes_kv_cache_update: re-check {RUNNERS} ReproducedLoop.step_batch"
