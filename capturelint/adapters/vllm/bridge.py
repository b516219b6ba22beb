"""The bridge from vLLM's breakable runtime to capturelint's runtime protocol.

vLLM's own methods still do all the work; ``RuntimeBridge`` wraps seven of them, one
method of its own per hook, to announce graphs, segments and breaks
(``capturelint.runtime.protocol``), to make each segment's emulated primitive an owned
segment, and to hand the tracer a shadow of each replay step: the wrapper's runnable,
run eagerly with vLLM's ``eager_break_during_capture`` seeing a stand-in capture
(``ShadowCapture``) whose ``add_eager`` runs the break inline and announces it. On
replay, vLLM's recorded break call reuses the shadow's call of it
(``protocol.run_or_reuse``), so each break's Python runs once per step.

The hooks, on ``BreakableCUDAGraphCapture``: ``__enter__`` (a graph begins),
``_begin_segment`` / ``_end_segment`` (a captured segment), ``add_eager`` (an eager
break), ``current`` (the shadow's stand-in capture); on ``BreakableCUDAGraphWrapper``:
``_capture`` and ``_replay`` (a graph ends; a replay with its shadow). A wrapper an
adapter named (``_capturelint_name``: ``target``, ``mtp draft``) starts the label of
the graphs it captures. What a step's hooks share (the phase, the capturing wrapper's
name, the shadow's capture, the real rows) is per thread (``_state``).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any, Callable, Iterator

from capturelint.runtime import frames, protocol
from capturelint.runtime.breakable import positional_params
from capturelint.runtime.protocol import BreakCall, BreakOutputs, GraphInfo, Phase, SegmentInfo, SegmentKind

frames.register_runtime_file(__file__)

_state = threading.local()  # phase, owner, shadow, rows
_graph_ids = iter(range(1 << 50, 1 << 62))


class RuntimeBridge:
    """vLLM's breakable runtime, announcing what it does while installed
    (``installed()``); each hook method takes vLLM's object first."""

    CAPTURE_HOOKS = {"__enter__": "enter", "_begin_segment": "begin_segment", "_end_segment": "end_segment",
                     "add_eager": "add_eager"}
    WRAPPER_HOOKS = {"_capture": "capture", "_replay": "replay"}

    def __init__(self) -> None:
        from vllm.compilation import breakable_cudagraph as bc

        frames.register_runtime_file(bc.__file__)
        self.capture_cls, self.wrapper_cls = bc.BreakableCUDAGraphCapture, bc.BreakableCUDAGraphWrapper
        self.original: dict[tuple[type, str], Any] = {}  # (class, name) -> its own attribute, as vLLM defines it

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """The hooks in vLLM's classes for the block; vLLM's own methods after it."""
        hooks = [(self.capture_cls, name, _as_method(getattr(self, hook))) for name, hook in self.CAPTURE_HOOKS.items()]
        hooks += [(self.wrapper_cls, name, _as_method(getattr(self, hook))) for name, hook in self.WRAPPER_HOOKS.items()]
        hooks.append((self.capture_cls, "current", classmethod(_as_method(self.current))))
        for cls, name, hook in hooks:
            self.original[cls, name] = vars(cls)[name]
            setattr(cls, name, hook)
        try:
            yield
        finally:
            for (cls, name), value in self.original.items():
                setattr(cls, name, value)
            self.original.clear()

    def _vllm(self, cls: type, name: str) -> Any:
        """vLLM's own ``cls.name``, unwrapped from a classmethod."""
        value = self.original[cls, name]
        return value.__func__ if isinstance(value, classmethod) else value

    # ------------------------------------------------ BreakableCUDAGraphCapture

    def enter(self, capture: Any) -> Any:
        """A graph begins capturing: announced with its label (the forward context's mode
        and token count, after the capturing wrapper's name where an adapter gave one)."""
        mode, descriptor = _forward_mode()
        label = f"{mode}:{getattr(descriptor, 'num_tokens', '?')} tokens"
        owner = getattr(_state, "owner", None)
        label = f"{owner} {label}" if owner else label
        capture._capturelint_info = GraphInfo(next(_graph_ids), label, mode, mode != "FULL", BreakOutputs.DISCARD)
        capture._capturelint_index = 0
        _state.phase = Phase.CAPTURE
        protocol.announce("on_graph_begin", capture._capturelint_info, Phase.CAPTURE)
        return self._vllm(self.capture_cls, "__enter__")(capture)

    def begin_segment(self, capture: Any) -> None:
        """A captured segment begins: announced, its emulated primitive owned by it."""
        from capturelint.runtime.emulated import owned_by

        begin = self._vllm(self.capture_cls, "_begin_segment")
        info = getattr(capture, "_capturelint_info", None)
        if info is None:
            return begin(capture)
        index = capture._capturelint_index
        protocol.announce("on_segment_begin", SegmentInfo(info.id, index, SegmentKind.CAPTURED, None, Phase.CAPTURE))
        with owned_by(info, index):
            begin(capture)

    def end_segment(self, capture: Any) -> None:
        """A captured segment ends (when one was capturing): announced."""
        info = getattr(capture, "_capturelint_info", None)
        was = capture._capturing
        self._vllm(self.capture_cls, "_end_segment")(capture)
        if info is not None and was:
            index = capture._capturelint_index
            capture._capturelint_index += 1
            protocol.announce("on_segment_end", SegmentInfo(info.id, index, SegmentKind.CAPTURED, None, Phase.CAPTURE))

    def add_eager(self, capture: Any, fn: Callable[[], Any]) -> Any:
        """An eager break: vLLM records ``recorded_break`` for it, which announces the
        break whenever it runs (and, while capturing, the eager segment it is)."""
        add_eager = self._vllm(self.capture_cls, "add_eager")
        info = getattr(capture, "_capturelint_info", None)
        if info is None:
            return add_eager(capture, fn)
        target = _break_target(fn)
        recorded = functools.partial(self.recorded_break, capture, info, target, frames.user_frame(2), fn)
        return add_eager(capture, recorded)

    def recorded_break(self, capture: Any, info: GraphInfo, target: BreakTarget, frame: Any,
                       fn: Callable[[], Any]) -> Any:
        """What vLLM records and replays for a break: ``fn``, announced."""
        name, args, kwargs, params = target
        phase = getattr(_state, "phase", Phase.EAGER)
        if phase is not Phase.CAPTURE:
            return _run_break(name, args, kwargs, params, frame, phase, False, fn)
        segment = SegmentInfo(info.id, capture._capturelint_index, SegmentKind.EAGER, name, phase)
        protocol.announce("on_segment_begin", segment)
        result = _run_break(name, args, kwargs, params, frame, phase, False, fn)
        protocol.announce("on_segment_end", segment)
        capture._capturelint_index += 1
        return result

    def current(self, cls: Any) -> Any:
        """The active capture: the shadow's stand-in during a shadow step, else vLLM's."""
        shadow = getattr(_state, "shadow", None)
        return shadow if shadow is not None else self._vllm(self.capture_cls, "current")(cls)

    # ------------------------------------------------ BreakableCUDAGraphWrapper

    def capture(self, wrapper: Any, entry: Any, args: tuple, kwargs: dict) -> Any:
        """A wrapper captures a graph (its name, if any, labels it); the graph's end is
        announced with its output."""
        _state.owner = getattr(wrapper, "_capturelint_name", None)
        try:
            output = self._vllm(self.wrapper_cls, "_capture")(wrapper, entry, args, kwargs)
        finally:
            _state.phase = Phase.EAGER
            _state.owner = None
        info = getattr(entry.capture, "_capturelint_info", None)
        if info is not None:
            entry._capturelint_info = info
            protocol.announce("on_graph_end", info, Phase.CAPTURE, output)
        return output

    def replay(self, wrapper: Any, entry: Any, args: tuple, kwargs: dict) -> Any:
        """A replay, offered its shadow first (``shadow_step``), announced with its real rows."""
        replay = self._vllm(self.wrapper_cls, "_replay")
        info = getattr(entry, "_capturelint_info", None)
        if info is None:
            return replay(wrapper, entry, args, kwargs)
        if protocol.has_observers():
            protocol.announce("before_replay", info, functools.partial(shadow_step, info, wrapper.runnable, args, kwargs))
        protocol.announce("on_graph_begin", info, Phase.REPLAY)
        _state.phase = Phase.REPLAY
        try:
            output = replay(wrapper, entry, args, kwargs)
        finally:
            _state.phase = Phase.EAGER
        protocol.announce("on_graph_end", info, Phase.REPLAY, _real_rows(output))
        return output


def _as_method(hook: Callable[..., Any]) -> Callable[..., Any]:
    """``hook`` as a function a class can hold: a function binds to the instance it is
    looked up on (a bound method would not), which ``hook`` receives first."""

    def method(obj: Any, *args: Any, **kwargs: Any) -> Any:
        return hook(obj, *args, **kwargs)

    method.__name__ = method.__qualname__ = hook.__name__
    return method


BreakTarget = tuple[str, tuple, dict, tuple[str, ...]]  # name, args, kwargs, parameter names


def _break_target(fn: Callable[[], Any]) -> BreakTarget:
    """What vLLM's ``eager_break_during_capture`` wrapped in its replay lambda: the
    function, and the (weak-referenced) arguments it will be called with."""
    code = getattr(fn, "__code__", None)
    cells = dict(zip(code.co_freevars, (c.cell_contents for c in fn.__closure__ or ()))) if code is not None else {}
    target = cells.get("fn")
    args = tuple(cells.get("weak_args", ()))
    kwargs = dict(cells.get("weak_kwargs", {}))
    if target is None:
        return getattr(fn, "__qualname__", "eager"), (), {}, ()
    return target.__qualname__, args, kwargs, positional_params(target)


def _forward_mode() -> tuple[str, Any]:
    """The runtime mode and batch descriptor of vLLM's forward context."""
    from vllm.forward_context import get_forward_context, is_forward_context_available

    if not is_forward_context_available():
        return "NONE", None
    ctx = get_forward_context()
    return str(ctx.cudagraph_runtime_mode.name), ctx.batch_descriptor


def _run_break(name: str, args: tuple, kwargs: dict, params: tuple[str, ...], frame: Any, phase: Phase, inline: bool,
               fn: Callable[[], Any]) -> Any:
    """Run an eager break outside the (would-be) stream capture, announced."""
    call = BreakCall(name, args, kwargs, phase, inline, 0, params, frame)
    protocol.announce("on_break_enter", call)
    with protocol.suspended_capture():
        result = protocol.run_or_reuse(call, lambda *a, **k: fn(), args, kwargs) if phase is Phase.REPLAY else fn()
    protocol.announce("on_break_exit", call, result)
    return result


class ShadowCapture:
    """What vLLM's ``eager_break_during_capture`` sees during a shadow step: an active
    capture whose ``add_eager`` runs the break at once, outside the (would-be) stream
    capture, announced as the eager segment it is on replay. Nested breaks run inline,
    as in vLLM (``_capturing`` is False while a break runs)."""

    def __init__(self, info: GraphInfo):
        self.info = info
        self._capturing = True

    def add_eager(self, fn: Callable[[], Any]) -> Any:
        name, args, kwargs, params = _break_target(fn)
        self._capturing = False
        try:
            return _run_break(name, args, kwargs, params, frames.user_frame(2), Phase.EAGER, True, fn)
        finally:
            self._capturing = True


def shadow_step(info: GraphInfo, runnable: Callable, args: tuple, kwargs: dict) -> Any:
    """Run one replay step eagerly: ``is_current_stream_capturing()`` answers True in
    captured code (as it did at capture), False in eager breaks; in a FULL graph the
    breaks pass through (vLLM's FULL-mode bypass), as they did at capture."""
    previous = getattr(_state, "shadow", None)
    _state.shadow = ShadowCapture(info) if info.breaks_eager else None
    try:
        with protocol.capturing_as_on_gpu(True):
            return _real_rows(runnable(*args, **kwargs))
    finally:
        _state.shadow = previous


@contextlib.contextmanager
def real_rows(n: int) -> Iterator[None]:
    """The step in the block has ``n`` real tokens: the first ``n`` rows of the model's
    output. A batch padded to its capture size computes its padded rows from whatever
    the padding leaves (rows of ``torch.empty`` the attention does not write), and the
    runner discards them (vLLM keeps ``[:num_tokens]``); so a replay is compared with
    its shadow on the real rows only."""
    previous = getattr(_state, "rows", None)
    _state.rows = n
    try:
        yield
    finally:
        _state.rows = previous


def _real_rows(output: Any) -> Any:
    """``output[:n]`` for ``real_rows(n)``, taken outside any dispatch mode: the view is
    the comparison's, not an op of the step the tracer records."""
    from torch.utils._python_dispatch import _disable_current_modes

    n = getattr(_state, "rows", None)
    if n is None or not hasattr(output, "shape"):
        return output
    with _disable_current_modes():
        return output[:n]


__all__ = ["RuntimeBridge", "ShadowCapture", "real_rows", "shadow_step"]
