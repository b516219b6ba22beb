"""Which eager break a vLLM run's divergence from its eager twin enters at, when no
structural rule explains it (CL901's location).

**The class.** V1 pads a batch to its capture size (3 tokens run in the graph of 4)
and keeps the real counts in the attention metadata; its eager twin runs the 3 tokens
unpadded. Code in an eager break that branches on the real count against the rows it
is handed (``if num_real < q.shape[0]``) takes one path in the graph run and another in
the twin. The shadow of a replay is the same padded step run eagerly, so it takes the
graph run's path too: replay equals shadow op by op and value by value, every condition
of the replay model holds, and only the twin sees the difference (docs/rules.md,
"CL901's location"). No rule over the capture and its shadow can name it; this probe
finds where it enters instead.

**How.** During the eager twin (``plan.configuration``'s ``twin``) and, where the
twin's output differs from the checked run's, one untraced graph run, every call of a vLLM eager break inside a workload step (``bridge.real_rows``)
is recorded with its tensor arguments' real rows before and after the call (the break
writes its results into caller-owned buffers) and its return value: replays through the
functions ``BreakableCUDAGraphCapture.add_eager`` recorded, eager calls through the
decorated methods of the model's classes. Then, step by step, the calls of the two runs
are paired by break and occurrence, and the first graph-run call whose inputs equal the
twin's while its outputs do not is where the divergence enters (descending into the
breaks it calls, so a nested break is named rather than the one around it). A
divergence whose first differing call already had other inputs entered in captured code
(or before the first break): the probe names nothing then.
"""

from __future__ import annotations

import contextlib
import dataclasses
import linecache
from typing import Any, Callable, Iterator

import torch

from capturelint.runtime import frames
from capturelint.runtime.protocol import Frame

# inputs and outputs within this of each other (relative to their size) are the same
TOLERANCE = 1e-3


@dataclasses.dataclass(frozen=True)
class BreakCall:
    """One call of an eager break in one workload step: the break (``name``, its
    ``frame``: where it is defined), its nesting ``depth``, the step's real rows and the
    rows its tensors had, and its tensors' real rows before and after (``None`` until it
    returned)."""

    name: str
    frame: Frame
    step: int
    depth: int
    real: int
    rows: int
    inputs: tuple[torch.Tensor, ...]
    outputs: tuple[torch.Tensor, ...] | None = None
    written: frozenset[int] = frozenset()  # the arguments the call wrote: output buffers, not inputs


@dataclasses.dataclass(frozen=True)
class BreakDivergence:
    """Where a run's divergence from its eager twin enters: the break that, handed what
    the twin's was handed, computed something else (``frame``: its definition), in
    ``step``, with ``real`` real rows of ``rows``."""

    name: str
    frame: Frame
    step: int
    real: int
    rows: int

    @property
    def padded(self) -> bool:
        return self.rows > self.real


class BreakProbe:
    """Records the eager-break calls of the runs made inside ``recording`` (module
    docstring); ``run(fn)`` records one run's calls, ``divergence`` compares two."""

    def __init__(self) -> None:
        self._calls: list[BreakCall] | None = None
        self._step = -1
        self._real: int | None = None
        self._depth = 0

    @contextlib.contextmanager
    def recording(self, models: list[Any]) -> Iterator[BreakProbe]:
        """Patch vLLM's break machinery and the eager breaks of ``models``' classes for
        the block; everything is put back after."""
        from vllm.compilation import breakable_cudagraph as bc

        from capturelint.adapters.vllm import bridge

        undo: list[Callable[[], None]] = []
        try:
            add_eager = bc.BreakableCUDAGraphCapture.add_eager

            def recorded_add_eager(capture: Any, fn: Callable[[], Any]) -> Any:
                return add_eager(capture, self._replayed(fn))

            bc.BreakableCUDAGraphCapture.add_eager = recorded_add_eager
            undo.append(lambda: setattr(bc.BreakableCUDAGraphCapture, "add_eager", add_eager))
            real_rows = bridge.real_rows

            @contextlib.contextmanager
            def stepping(n: int) -> Iterator[None]:
                self._step, self._real = self._step + 1, n
                try:
                    with real_rows(n):
                        yield
                finally:
                    self._real = None

            bridge.real_rows = stepping
            undo.append(lambda: setattr(bridge, "real_rows", real_rows))
            for cls, name, method in _breaks(models, bc.eager_break_during_capture):
                setattr(cls, name, self._eager(method))
                undo.append(lambda cls=cls, name=name, method=method: setattr(cls, name, method))
            yield self
        finally:
            for u in reversed(undo):
                u()

    def run(self, fn: Callable[[], Any]) -> tuple[Any, list[BreakCall]]:
        """``fn()``'s result and the break calls of its workload steps."""
        self._calls, self._step = [], -1
        try:
            return fn(), self._calls
        finally:
            self._calls = None

    def _eager(self, method: Callable[..., Any]) -> Callable[..., Any]:
        probe = self

        def called(*args: Any, **kwargs: Any) -> Any:
            return probe._record(method.__wrapped__, lambda: method(*args, **kwargs), args, kwargs)

        called.__wrapped__ = method.__wrapped__  # type: ignore[attr-defined]
        return called

    def _replayed(self, fn: Callable[[], Any]) -> Callable[[], Any]:
        """The function a capture records for a break (``lambda: fn(*weak_args,
        **weak_kwargs)``), recording each call it makes within a step."""
        cells = dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in fn.__closure__ or ())))
        inner, args, kwargs = cells.get("fn"), cells.get("weak_args", ()), cells.get("weak_kwargs", {})
        if inner is None:
            return fn
        return lambda: self._record(inner, fn, args, kwargs)

    def _record(self, inner: Any, call: Callable[[], Any], args: tuple, kwargs: dict) -> Any:
        if self._calls is None or self._real is None or _capturing():
            return call()  # outside a workload step, or a break a (FULL) capture records: no call of the step
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor) and a.dim() > 0]
        rows = max((t.shape[0] for t in tensors), default=0)
        code = getattr(inner, "__code__", None)
        frame = frames.code_frame(code, _def_line(code)) if code is not None else Frame("", 0, str(inner))
        at = len(self._calls)
        self._calls.append(BreakCall(getattr(inner, "__qualname__", str(inner)), frame, self._step, self._depth,
                                     self._real, rows, _rows(tensors, self._real)))
        self._depth += 1
        try:
            result = call()
        finally:
            self._depth -= 1
        returned = [r for r in (result if isinstance(result, (tuple, list)) else (result,)) if isinstance(r, torch.Tensor)]
        before = self._calls[at].inputs
        outputs = _rows([*tensors, *returned], self._real)
        written = frozenset(i for i, (a, b) in enumerate(zip(before, outputs)) if not _same((a,), (b,), exact=True))
        self._calls[at] = dataclasses.replace(self._calls[at], outputs=outputs, written=written)
        return result


def divergence(graph: list[BreakCall], eager: list[BreakCall]) -> BreakDivergence | None:
    """The first break call of ``graph`` handed what ``eager``'s paired call was handed
    that computed something else (a nested one rather than the break around it), or
    ``None``: no call differs, or the first that differs was handed other inputs (the
    divergence entered elsewhere). Calls are paired within a step by break and
    occurrence."""
    twin = _paired(eager)
    seen: dict[tuple[int, str], int] = {}
    keyed = []
    for c in graph:
        n = seen[(c.step, c.name)] = seen.get((c.step, c.name), -1) + 1
        keyed.append((c, twin.get((c.step, c.name, n))))
    for i, (c, e) in enumerate(keyed):
        if e is None or _same(c.outputs, e.outputs):
            continue
        if not _same(c.inputs, e.inputs, skip=c.written | e.written):
            return None  # other inputs: the divergence entered before this break
        found = c
        for inner, e_inner in keyed[i + 1:]:  # the breaks it called
            if inner.step != c.step or inner.depth <= c.depth:
                break
            if e_inner is not None and not _same(inner.outputs, e_inner.outputs):
                if _same(inner.inputs, e_inner.inputs, skip=inner.written | e_inner.written):
                    found = inner
                break
        return BreakDivergence(found.name, found.frame, found.step, found.real, found.rows)
    return None


def _paired(calls: list[BreakCall]) -> dict[tuple[int, str, int], BreakCall]:
    out: dict[tuple[int, str, int], BreakCall] = {}
    seen: dict[tuple[int, str], int] = {}
    for c in calls:
        n = seen[(c.step, c.name)] = seen.get((c.step, c.name), -1) + 1
        out[(c.step, c.name, n)] = c
    return out


def _rows(tensors: list[torch.Tensor], real: int) -> tuple[torch.Tensor, ...]:
    """Each tensor's first ``real`` rows, copied (a tensor of fewer rows, whole)."""
    out = []
    for t in tensors:
        with torch.no_grad():
            out.append((t[:real] if t.shape[0] >= real else t).detach().clone())
    return tuple(out)


def _same(a: tuple[torch.Tensor, ...] | None, b: tuple[torch.Tensor, ...] | None, skip: frozenset[int] = frozenset(),
          exact: bool = False) -> bool:
    """Whether two calls' tensors are the same values, but those at ``skip`` (what an
    output buffer held before the call is no input: ``torch.empty`` of each run);
    ``exact``: bit for bit. Rows past the real ones were cut before; tensors of other
    shapes are not compared."""
    if a is None or b is None or len(a) != len(b):
        return True  # nothing to compare: not evidence of a difference
    for i, (x, y) in enumerate(zip(a, b)):
        if i in skip or x.shape != y.shape or x.dtype != y.dtype:
            continue
        if exact:  # bit for bit (any dtype, NaN too)
            if not torch.equal(x.contiguous().view(-1).view(torch.uint8), y.contiguous().view(-1).view(torch.uint8)):
                return False
            continue
        if x.is_floating_point():
            x, y = x.double(), y.double()
            if not torch.equal(torch.isnan(x), torch.isnan(y)):
                return False
            x, y = torch.nan_to_num(x), torch.nan_to_num(y)
            if x.numel() and (x - y).abs().max().item() > TOLERANCE * (1.0 + y.abs().max().item()):
                return False
        elif not torch.equal(x, y):
            return False
    return True


def _capturing() -> bool:
    """Whether a CUDA graph capture is recording (the emulated device's, under the
    check); a CPU build of torch without the emulation has none."""
    try:
        return torch.cuda.is_current_stream_capturing()
    except (RuntimeError, AssertionError):  # torch built without CUDA, not emulated
        return False


def _def_line(code: Any) -> int:
    """The ``def`` line of ``code``'s function (``co_firstlineno`` is its first
    decorator's: ``@eager_break_during_capture``)."""
    for line in range(code.co_firstlineno, code.co_firstlineno + 20):
        if linecache.getline(code.co_filename, line).lstrip().startswith(("def ", "async def ")):
            return line
    return code.co_firstlineno


def _breaks(models: list[Any], decorator: Callable[..., Any]) -> list[tuple[type, str, Any]]:
    """The eager breaks of the classes of ``models``' modules: methods made by vLLM's
    ``eager_break_during_capture`` (its wrapper's code object)."""
    marker = decorator(lambda: None).__code__
    out, seen = [], set()
    for model in models:
        for module in model.modules():
            for cls in type(module).__mro__:
                for name, attr in list(vars(cls).items()):
                    if (cls, name) in seen or getattr(attr, "__code__", None) is not marker:
                        continue
                    seen.add((cls, name))
                    out.append((cls, name, attr))
    return out


__all__ = ["BreakCall", "BreakDivergence", "BreakProbe", "divergence"]
