"""Engine configuration: bad input is one line and exit 2; defaults resolve by table."""

from __future__ import annotations

import json

import pytest

from capturelint.cli import main
from capturelint.engine.config import DEFAULT_RUNNER, EagerRegion, EngineConfig, Platform, Runner
from capturelint.runtime.forward_context import CUDAGraphMode
from capturelint.errors import CapturelintError


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--runner", "v3"], "--runner"),
        (["--mode", "SOMETIMES"], "--mode"),
        (["--eager-region", "medium"], "--eager-region"),
        (["--layers", "0"], "layers"),
        (["--layers", "-1"], "layers"),
        (["--steps", "0"], "steps"),
        (["--capture-sizes", "1,2"], "capture size"),
        (["--capture-sizes", "0,4"], "capture sizes"),
        (["--capture-sizes", "1,two"], "--capture-sizes"),
        (["--capture-sizes", "1,2,4,128"], "max_num_batched_tokens"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, args, needle):
    capsys.readouterr()
    assert main(["engine", "run", *args, "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("capturelint: error: ")
    assert needle in lines[0]
    assert "Traceback" not in captured.err


def test_capture_size_smaller_than_batch_says_what_to_do(capsys):
    assert main(["engine", "run", "--capture-sizes", "1,2", "--max-num-seqs", "3"]) == 2
    err = capsys.readouterr().err
    assert "smaller than the workload's decode batch of 3" in err
    assert "add a capture size >= 3" in err


def test_capture_sizes_do_not_matter_without_graphs():
    EngineConfig(cudagraph_mode="NONE", capture_sizes=(1,)).validate()


@pytest.mark.parametrize(
    "platform,runner",
    [("cuda", Runner.V2), ("rocm", Runner.V1), ("cpu", Runner.V2)],
)
def test_default_runner_by_platform(platform, runner):
    config = EngineConfig(platform=platform).validate()
    assert config.runner is None
    assert config.resolved_runner is runner
    assert DEFAULT_RUNNER[(config.architecture, Platform(platform))] is runner


def test_explicit_runner_wins_over_platform_default():
    assert EngineConfig(platform="rocm", runner="v2").resolved_runner is Runner.V2


def test_per_runner_region():
    assert EngineConfig(runner="v1").effective_eager_region is EagerRegion.WIDE
    assert EngineConfig(runner="v2").effective_eager_region is EagerRegion.NARROW
    assert EngineConfig(platform="rocm").effective_eager_region is EagerRegion.WIDE
    assert EngineConfig(runner="v1", eager_region="narrow").effective_eager_region is EagerRegion.NARROW


def test_cli_resolves_runner_from_platform(capsys):
    capsys.readouterr()
    args = ["engine", "run", "--platform", "rocm", "--layers", "1", "--steps", "2", "--json"]
    assert main(args) == 0
    config = json.loads(capsys.readouterr().out)["config"]
    assert config["runner"] == "v1"
    assert config["requested_runner"] is None
    assert config["effective_eager_region"] == "wide"


def test_strings_are_parsed_case_insensitively():
    config = EngineConfig(runner="V1", cudagraph_mode="piecewise", eager_region="WIDE", platform="ROCm")
    assert config.runner is Runner.V1
    assert config.cudagraph_mode is CUDAGraphMode.PIECEWISE
    assert config.eager_region is EagerRegion.WIDE
    assert config.platform is Platform.ROCM


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        (dict(runner="v9"), "unknown runner 'v9'"),
        (dict(cudagraph_mode="SOMETIMES"), "unknown CUDA-graph mode"),
        (dict(eager_region="medium"), "unknown eager region"),
        (dict(platform="tpu"), "unknown platform"),
        (dict(kernels="cutlass"), "unknown kernels"),
        (dict(graph_backend="xla"), "unknown graph backend"),
        (dict(architecture="LlamaForCausalLM"), "unknown architecture"),
        (dict(num_layers=-1), "layers must be a positive integer"),
        (dict(steps=0), "steps must be a positive integer"),
        (dict(compress_ratios=(1, 3, 16, 4)), "must be a positive divisor of block_size"),
        (dict(compress_ratios=(1, 4)), "2 entries for 4 layers"),
        (dict(rope_dim=7), "rope_dim must be even"),
        (dict(num_experts_per_tok=9), "exceeds num_experts"),
        (dict(max_blocks_per_request=1), "fewer than the 44 positions"),
        (dict(capture_sizes=()), "capture sizes are empty"),
    ],
)
def test_validate_messages(kwargs, needle):
    with pytest.raises(CapturelintError) as info:
        EngineConfig(**kwargs).validate()
    message = str(info.value)
    assert needle in message
    assert "\n" not in message


def test_default_ratios_cycle():
    assert EngineConfig(num_layers=6).layer_ratios == (1, 4, 16, 4, 1, 4)
    assert EngineConfig().padded_heads == 4
    assert EngineConfig(num_heads=6).padded_heads == 8


def test_eager_twin_changes_only_the_mode():
    config = EngineConfig(runner="v1", cudagraph_mode="FULL", fresh_metadata=True, seed=5)
    twin = config.eager_twin()
    assert twin.cudagraph_mode is CUDAGraphMode.NONE
    assert twin.runner is Runner.V1 and twin.fresh_metadata and twin.seed == 5


def test_host_sync_in_capture_is_one_line(capsys, monkeypatch):
    """A model that reads a value on the host inside a captured region cannot be
    captured; the command says so in one line instead of a traceback."""
    from capturelint.engine.dsv4.moe import MoE

    original = MoE.forward

    def forward_with_host_read(self, x):
        if x.sum().item() > 1e30:  # a data-dependent branch: needs the value on the host
            return x
        return original(self, x)

    monkeypatch.setattr(MoE, "forward", forward_with_host_read)
    capsys.readouterr()
    assert main(["engine", "run", "--mode", "FULL", "--layers", "1", "--steps", "2", "--json"]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err
    assert "graph capture failed" in lines[0] and "host synchronisation" in lines[0]
