"""The CUDA device emulated on the CPU (capturelint/runtime/device.py, installed by
``emulate_cuda()``): programs written for a GPU run unmodified, what they see, and
that everything is restored after the block."""

from __future__ import annotations

import textwrap
import threading
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack

from capturelint.cli import main
from capturelint.runtime.device import DEVICE_NAME, CudaOnCpuMode
from capturelint.runtime.emulated import EmulatedCUDAGraph, emulate_cuda

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="asserts what a CPU-only torch does outside the block")

DEVICE = torch.device("cuda:0")  # made at import, before any emulation: a name, not memory


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))
        self.register_buffer("shift", torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x) + self.shift


def _no_cuda_on_cpu_torch() -> None:
    """What a CPU-only torch does with the GPU idioms: each fails."""
    with pytest.raises((AssertionError, RuntimeError), match="not compiled with CUDA|CUDA"):
        torch.zeros(1, device="cuda")
    with pytest.raises((AssertionError, RuntimeError)):
        torch.randn(2).cuda()
    with pytest.raises((AssertionError, RuntimeError)):
        torch.cuda.current_device()
    assert torch.cuda.is_available() is False
    assert torch.cuda.device_count() == 0


# ============================================================ the idioms, unmodified


def test_a_module_moved_with_cuda_is_captured_after_side_stream_warm_up_and_replays_as_eager():
    with emulate_cuda() as on, torch.no_grad():
        assert on is True
        torch.manual_seed(0)
        model = Net().cuda().eval()
        static_x = torch.randn(8, 16, device="cuda")

        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                model(static_x)
        torch.cuda.current_stream().wait_stream(s)

        g = torch.cuda.CUDAGraph()
        assert isinstance(g, EmulatedCUDAGraph)
        with torch.cuda.graph(g):
            static_y = model(static_x)

        for _ in range(3):
            batch = torch.randn(8, 16, device="cuda")
            static_x.copy_(batch)
            g.replay()
            torch.cuda.synchronize()
            assert torch.equal(static_y, model(batch))
        assert static_y.shape == (8, 4)


def test_make_graphed_callables_on_a_module_moved_to_cuda_matches_eager():
    with emulate_cuda(), torch.no_grad():
        torch.manual_seed(1)
        model = Net().to("cuda").eval()
        x = torch.randn(8, 16, device="cuda")
        graphed = torch.cuda.make_graphed_callables(model, (x,))
        for _ in range(3):
            batch = torch.randn(8, 16, device="cuda:0")
            assert torch.equal(graphed(batch), model(batch))


def test_a_module_level_device_and_non_blocking_moves():
    host = torch.arange(6.0).reshape(2, 3)
    with emulate_cuda():
        moved = host.to(DEVICE, non_blocking=True)
        assert torch.equal(moved, host)
        assert host.to(DEVICE, torch.float16).dtype == torch.float16
        assert torch.equal(host.to(device=DEVICE, non_blocking=True), host)
        assert torch.equal(host.cuda(non_blocking=True), host) and torch.equal(host.cuda(0), host)
        assert torch.equal(host.to(0), host)  # a bare index means a CUDA device to Tensor.to
        pinned = host.pin_memory()
        assert torch.equal(pinned, host) and pinned is not host
        staged = torch.empty(2, 3, pin_memory=True)
        staged.copy_(host, non_blocking=True)
        assert torch.equal(staged, host)
        model = Net().to(DEVICE, non_blocking=True)
        assert model(torch.randn(3, 16, device=DEVICE)).shape == (3, 4)


def test_factories_take_every_spelling_of_the_cuda_device():
    with emulate_cuda():
        made = [
            torch.zeros(2, 3, device="cuda"),
            torch.ones(2, 3, device="cuda:0"),
            torch.randn(2, 3, device=torch.device("cuda")),
            torch.rand(2, 3, device=DEVICE),
            torch.empty(2, 3, device=0),
            torch.full((2, 3), 7.0, device="cuda"),
            torch.arange(6, device="cuda").reshape(2, 3),
            torch.tensor([[1, 2, 3], [4, 5, 6]], device="cuda"),
            torch.as_tensor([[1, 2, 3], [4, 5, 6]], dtype=torch.float32, device="cuda"),
            torch.zeros_like(torch.empty(2, 3), device="cuda"),
            torch.empty(1).new_zeros(2, 3, device="cuda"),
            nn.Linear(3, 2, device="cuda").weight,
        ]
        with torch.device("cuda"):
            made.append(torch.zeros(2, 3))
        torch.set_default_device("cuda")
        try:
            made.append(torch.ones(2, 3))
        finally:
            torch.set_default_device(None)
        assert torch.device("cuda").type == "cuda"  # a device object is a name: it stays what it says
    assert all(t.shape == (2, 3) for t in made)
    assert float(made[5].sum()) == 42.0 and made[6].tolist() == [[0, 1, 2], [3, 4, 5]]


def test_the_torch_cuda_queries_answer_for_one_device():
    with emulate_cuda():
        assert torch.cuda.is_available() is True
        torch.cuda.set_device(0)
        torch.cuda.set_device("cuda:0")
        with torch.cuda.device(0):
            assert torch.cuda.current_device() == 0
        torch.cuda.synchronize()
        assert torch.cuda.device_count() == 1
        assert torch.cuda.get_device_name() == torch.cuda.get_device_name(0) == DEVICE_NAME
        assert torch.cuda.get_device_capability() == (8, 0) and torch.cuda.is_bf16_supported()
        assert torch.cuda.get_device_properties(0).total_memory > 0
        free, total = torch.cuda.mem_get_info()
        assert 0 < free <= total
        x = torch.randn(1024, device="cuda")
        assert torch.cuda.memory_allocated() == torch.cuda.max_memory_allocated() == 0
        assert torch.cuda.memory_reserved() == torch.cuda.max_memory_reserved() == 0
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        assert torch.cuda.memory_stats() == {} and DEVICE_NAME in torch.cuda.memory_summary()
        x.record_stream(torch.cuda.current_stream())
        torch.cuda.nvtx.range_push("step")
        torch.cuda.nvtx.range_pop()
        with torch.cuda.nvtx.range("step"):
            torch.cuda.nvtx.mark("here")
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cuda.matmul.allow_tf32
        done = torch.cuda.Event(enable_timing=True)
        done.record()
        done.synchronize()
        assert torch.cuda.graph_pool_handle() != torch.cuda.graph_pool_handle()


def test_a_second_device_is_an_invalid_ordinal_as_on_a_machine_with_one_gpu():
    with emulate_cuda():
        for make in (lambda: torch.zeros(1, device="cuda:1"), lambda: torch.randn(2).to("cuda:1"),
                     lambda: torch.randn(2).cuda(1), lambda: torch.cuda.set_device(1)):
            with pytest.raises(RuntimeError, match="invalid device ordinal 1: capturelint emulates one CUDA device"):
                make()


def test_the_emulated_device_draws_from_the_cpu_generator():
    with emulate_cuda():
        torch.cuda.manual_seed(5)
        a = torch.randn(4, device="cuda")
        torch.cuda.manual_seed_all(5)
        assert torch.equal(torch.randn(4, device="cuda"), a)
        state = torch.cuda.get_rng_state()
        b = torch.randn(4, device="cuda")
        torch.cuda.set_rng_state(state)
        assert torch.equal(torch.randn(4, device="cuda"), b)
        with torch.random.fork_rng():
            torch.randn(100)
        assert torch.equal(torch.cuda.get_rng_state(), torch.get_rng_state())
        assert torch.cuda.initial_seed() == torch.initial_seed() == 5


def test_cuda_autocast_is_cpu_autocast_in_cudas_dtype():
    with emulate_cuda():
        a, b = torch.randn(4, 4, device="cuda"), torch.randn(4, 4, device="cuda")
        with torch.autocast("cuda"):
            assert (a @ b).dtype == torch.float16
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            assert (a @ b).dtype == torch.bfloat16
        with torch.autocast("cuda", enabled=False):
            assert (a @ b).dtype == torch.float32
    with pytest.warns(UserWarning, match="CUDA is not available"):
        with torch.autocast("cuda"):  # restored: a CPU-only torch disables it
            assert (a @ b).dtype == torch.float32


def test_tensors_are_what_they_are_cpu_tensors():
    """The documented seam: memory is the CPU's, and tensors say so (code that branches
    on the device takes its CPU path)."""
    with emulate_cuda():
        x = torch.zeros(3, device="cuda")
        assert x.device == torch.device("cpu") and x.is_cuda is False and x.get_device() == -1
        assert x.cuda() is x  # already on the (one) device: no copy


# ==================================================================== restoration


def test_after_the_block_a_cpu_only_torch_refuses_the_gpu_again():
    _no_cuda_on_cpu_torch()
    originals = {n: getattr(torch.cuda, n) for n in ("is_available", "set_device", "manual_seed", "memory_allocated")}
    with pytest.raises(KeyError):
        with emulate_cuda():
            torch.zeros(1, device="cuda")
            raise KeyError("boom")
    _no_cuda_on_cpu_torch()
    assert {n: getattr(torch.cuda, n) for n in originals} == originals
    assert "record_stream" not in vars(torch.Tensor)
    assert not any(isinstance(m, CudaOnCpuMode) for m in _get_current_function_mode_stack())


def test_nested_blocks_keep_emulating_until_the_outermost_exits():
    with emulate_cuda():
        with emulate_cuda() as inner:
            assert inner is True
            torch.zeros(1, device="cuda")
        torch.zeros(1, device="cuda")
        assert torch.cuda.is_available() and torch.cuda.CUDAGraph is EmulatedCUDAGraph
        assert sum(isinstance(m, CudaOnCpuMode) for m in _get_current_function_mode_stack()) == 1
    _no_cuda_on_cpu_torch()


def test_a_mode_the_program_leaves_open_survives_the_block():
    class Counting(TorchFunctionMode):
        calls = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            Counting.calls += 1
            return func(*args, **(kwargs or {}))

    counting = Counting()
    with emulate_cuda():
        counting.__enter__()
        torch.zeros(1, device="cuda")
    try:
        assert _get_current_function_mode_stack() == [counting]
        torch.zeros(1)
        assert Counting.calls == 2
    finally:
        counting.__exit__(None, None, None)
    _no_cuda_on_cpu_torch()


def test_threads_rewrite_devices_once_they_enter_the_block_themselves():
    seen: dict[str, object] = {}

    def worker() -> None:
        try:
            torch.zeros(1, device="cuda")
            seen["bare"] = "ran"
        except (AssertionError, RuntimeError):
            seen["bare"] = "refused"
        with emulate_cuda() as on:
            seen["entered"] = (on, torch.zeros(2, device="cuda").shape)

    with emulate_cuda():
        t = threading.Thread(target=worker)
        t.start()
        t.join(timeout=60)
        assert not t.is_alive()
        # the worker's exit did not end the emulation of this thread's block
        assert torch.cuda.is_available() and torch.zeros(1, device="cuda").shape == (1,)
    assert seen == {"bare": "refused", "entered": (True, (2,))}
    _no_cuda_on_cpu_torch()


# ======================================================== through check --target

GPU_PROGRAM = '''
    """A server written for a GPU, with nothing of capturelint but the Target."""
    import torch
    from torch import nn

    from capturelint.target import Target

    DEVICE = torch.device("cuda:0")


    class Server:
        def __init__(self, in_place):
            assert torch.cuda.is_available(), "this program needs a GPU"
            torch.cuda.set_device(0)
            torch.cuda.manual_seed(0)
            self.in_place = in_place
            self.model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16)).cuda().eval()
            self.static_x = torch.zeros(8, 16, device="cuda")
            self.graph = None

        def capture(self):
            self.graph = torch.cuda.CUDAGraph()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    self.model(self.static_x)
            torch.cuda.current_stream().wait_stream(side)
            with torch.cuda.graph(self.graph):
                self.static_y = self.model(self.static_x)

        def batches(self):
            g = torch.Generator().manual_seed(1)
            return [torch.randn(8, 16, generator=g).pin_memory().to(DEVICE, non_blocking=True) for _ in range(4)]

        def serve(self):
            with torch.no_grad():
                if self.graph is None:
                    self.capture()
                out = []
                for batch in self.batches():
                    if self.in_place:
                        self.static_x.copy_(batch, non_blocking=True)
                    else:
                        self.static_x = batch.clone()
                    self.graph.replay()
                    out.append(self.static_y.clone())
                torch.cuda.synchronize()
                return out

        def eager(self):
            with torch.no_grad():
                return [self.model(b) for b in self.batches()]


    def _targets(in_place):
        server = Server(in_place)
        return [Target(run=server.serve, roots={"server": server}, eager=server.eager, runner="gpu", mode="cudagraph")]


    def targets():
        return _targets(True)


    def stale_targets():
        return _targets(False)
'''


@pytest.fixture
def gpu_program(tmp_path: Path) -> Path:
    path = tmp_path / "gpu_server.py"
    path.write_text(textwrap.dedent(GPU_PROGRAM))
    return path


def test_check_target_runs_a_program_written_for_a_gpu(capsys, gpu_program):
    code = main(["check", "--target", f"{gpu_program}:targets"])
    out, err = capsys.readouterr()
    assert (code, err) == (0, ""), out + err
    assert "no findings" in out
    _no_cuda_on_cpu_torch()


def test_check_target_finds_the_hazard_in_a_program_written_for_a_gpu(capsys, gpu_program):
    code = main(["check", "--target", f"{gpu_program}:stale_targets"])
    out, err = capsys.readouterr()
    assert code == 1 and err == "", out + err
    assert "CL104" in out and "server.static_x" in out


def test_a_target_whose_module_level_code_uses_the_device_is_checked(tmp_path, capsys):
    """``check --target`` imports the file under the emulated device: a program that
    builds its model with ``.cuda()`` at module level runs as written."""
    from capturelint.cli import main

    path = tmp_path / "gpu_prog.py"
    path.write_text(textwrap.dedent('''
        import torch
        from torch.cuda import CUDAGraph
        from capturelint.target import Target

        DEVICE = torch.device("cuda")
        model = torch.nn.Linear(8, 8).cuda().eval()
        static_x = torch.zeros(4, 8, device=DEVICE)

        @torch.no_grad()
        def run():
            g = CUDAGraph()
            model(static_x)
            with torch.cuda.graph(g):
                y = model(static_x)
            outs = []
            for step in range(3):
                static_x.copy_(torch.full((4, 8), float(step), device=DEVICE))
                g.replay()
                outs.append(y.clone())
            return outs

        @torch.no_grad()
        def eager():
            return [model(torch.full((4, 8), float(step), device=DEVICE)) for step in range(3)]

        def targets():
            return Target(run=run, eager=eager, runner="gpu", mode="module-level")
    '''))
    assert main(["check", "--target", f"{path}:targets"]) == 0
    out, err = capsys.readouterr()
    assert "no findings in 1 configuration: replay matches eager execution" in out and err == ""
