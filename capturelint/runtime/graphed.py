"""``torch.cuda.graph`` and ``torch.cuda.make_graphed_callables``, emulated.

``graph`` is the context manager that captures into an ``EmulatedCUDAGraph`` on a
capture stream; ``make_graphed_callables`` builds graphed callables as PyTorch builds
them (``_Graphed``): a one-segment graph the callable's runtime owns, whose replays
are offered a shadow, and in training a backward graph announced as a bare one.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import inspect
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from capturelint.runtime import frames, protocol
from capturelint.runtime.cudagraph import EmulatedCUDAGraph, bare_ids, owned_by
from capturelint.runtime.pool import graph_pool_handle
from capturelint.runtime.protocol import HostSyncInCaptureError
from capturelint.runtime.streams import EmulatedStream, stream_stack


class graph:
    """``torch.cuda.graph``: ``with graph(g, pool=..., stream=...): ...`` captures into
    ``g`` on ``stream`` (default: one capture stream shared by every ``graph``, as in
    PyTorch), which is the current stream inside the block."""

    default_capture_stream: EmulatedStream | None = None

    def __init__(self, cuda_graph: Any, pool: Any = None, stream: Any = None, capture_error_mode: str = "global"):
        if graph.default_capture_stream is None:
            graph.default_capture_stream = EmulatedStream()
            graph.default_capture_stream._label = "torch.cuda.graph's capture stream"
        self.cuda_graph = cuda_graph
        self.pool = pool
        self.stream = stream if stream is not None else graph.default_capture_stream

    def __enter__(self) -> None:
        gc.collect()
        stream_stack.append(self.stream)
        try:
            self.cuda_graph.capture_begin(pool=self.pool)
        except BaseException:
            stream_stack.pop()
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            self.cuda_graph.capture_end(check_joined=exc[0] is None)
        finally:
            stream_stack.pop()


def make_graphed_callables(
    callables: Any, sample_args: Any, num_warmup_iters: int = 3, allow_unused_input: bool = False, pool: Any = None
) -> Any:
    """``torch.cuda.make_graphed_callables``, built as PyTorch builds it: ``sample_args``
    hold tensors only (nested in tuples, lists or dicts); every callable is warmed up,
    then each forward is captured on its sample arguments and, for a callable that
    trains (grad enabled, and a sample argument or a module parameter requiring grad),
    each backward in reverse order (``torch.autograd.grad`` of the outputs with respect
    to the arguments and parameters that require grad, on static output gradients), all
    into one memory pool. A module comes back as itself with its ``forward`` replaced
    (the original runs when its training flag differs from the capture's), a function
    as a new function. A call copies its arguments into the static inputs, replays the
    forward and returns the static outputs (``_Graphed``); in training it is an
    autograd function whose backward copies the incoming gradients into the static
    output gradients and replays the backward graph."""
    single = not isinstance(callables, tuple)
    fns = (callables,) if single else callables
    samples = (sample_args,) if single else sample_args
    where = frames.user_frame(2)
    flat = []
    for fn, args in zip(fns, samples):
        leaves, spec = tree_flatten(tuple(args))
        if not all(isinstance(a, torch.Tensor) for a in leaves):
            raise AssertionError(  # PyTorch's own check, in its words
                "In the beta API, sample_args for each callable must contain only Tensors. Other types are not allowed."
            )
        params = tuple(fn.parameters()) if isinstance(fn, torch.nn.Module) else ()
        surface = tuple(leaves) + params
        training = torch.is_grad_enabled() and any(t.requires_grad for t in surface)
        flat.append((tuple(args), leaves, spec, surface, training))
    mempool = graph_pool_handle() if pool is None else pool
    for fn, (args, _, _, surface, training) in zip(fns, flat):
        for _ in range(num_warmup_iters):
            outputs = [o for o in tree_flatten(fn(*args))[0] if isinstance(o, torch.Tensor) and o.requires_grad]
            if training and outputs:
                torch.autograd.grad(outputs, [t for t in surface if t.requires_grad],
                                    [torch.empty_like(o) for o in outputs], allow_unused=allow_unused_input)
    graphed = []
    for i, (fn, (args, leaves, spec, surface, training)) in enumerate(zip(fns, flat)):
        module = isinstance(fn, torch.nn.Module)
        name = type(fn).__name__ if module else getattr(fn, "__qualname__", type(fn).__name__)
        label = f"graphed {name}" + ("" if single else f"#{i}") + f"@{where.location}"
        g = _Graphed(fn, fn.forward if module else fn, label, leaves, spec)
        g.capture(mempool, args)
        graphed.append(g)
    for g, (_, _, _, surface, training) in reversed(list(zip(graphed, flat))):
        if training:  # backward graphs in reverse order, as PyTorch captures them
            g.capture_backward(mempool, surface, allow_unused_input)
    out = []
    for fn, g in zip(fns, graphed):
        if isinstance(fn, torch.nn.Module):
            fn.forward = g.forward
        out.append(fn if isinstance(fn, torch.nn.Module) else g)
    return out[0] if single else tuple(out)


class _Graphed:
    """One graphed callable: a one-segment captured graph whose replays are shadowed.

    It is the capture runtime of its callable: its primitive is an owned
    ``EmulatedCUDAGraph`` (``owned_by``), and it announces its capture and replays as a
    segmented graph of one captured segment, as a breakable runtime's graph does. Unlike
    a bare ``CUDAGraph`` it keeps Python that can re-run: before each replay it offers
    observers a shadow (``before_replay``), the callable run eagerly on the call's
    arguments as the graph reads them, the static inputs they were just copied into (an
    argument smaller than its sample, which ``copy_`` broadcasts, is seen with its own
    shape: a baked shape). The tracer undoes the shadow's tensor writes and random
    draws; ``_PythonState`` undoes what it can of its Python, so that host state evolves
    as in a run without shadows, where replays run no Python. Like torch's, it keeps its
    static input surface alive: the sample arguments and, for a module, its parameters
    as they were at capture (``static_surface``).
    """

    def __init__(self, fn: Any, run: Callable[..., Any], label: str, static_in: list[torch.Tensor], spec: Any):
        self.fn, self.run, self.static_in, self.spec = fn, run, static_in, spec
        self.static_surface = tuple(static_in) + (tuple(fn.parameters()) if isinstance(fn, torch.nn.Module) else ())
        self.info = protocol.GraphInfo(next(bare_ids), label, "FULL", False, protocol.BreakOutputs.DISCARD, True)
        self.training = fn.training if isinstance(fn, torch.nn.Module) else None
        self.graph: EmulatedCUDAGraph | None = None
        self.static_out: Any = None
        self.backward_graph: EmulatedCUDAGraph | None = None  # in training (``capture_backward``)
        self._autograd: Any = None

    def _segment(self, phase: protocol.Phase) -> protocol.SegmentInfo:
        return protocol.SegmentInfo(self.info.id, 0, protocol.SegmentKind.CAPTURED, None, phase)

    def capture(self, pool: Any, args: tuple) -> None:
        phase = protocol.Phase.CAPTURE
        with owned_by(self.info, 0):
            self.graph = EmulatedCUDAGraph()
        self.graph.pool_modelled = True  # the callables of one tuple share a pool (CL111)
        protocol.announce("on_graph_begin", self.info, phase)
        protocol.announce("on_segment_begin", self._segment(phase))
        try:
            with graph(self.graph, pool=pool):
                self.static_out = self.fn(*args)
        except HostSyncInCaptureError as e:
            raise HostSyncInCaptureError(dataclasses.replace(e.event, graph=self.info, segment=0)) from None
        protocol.announce("on_segment_end", self._segment(phase))
        protocol.announce("on_graph_end", self.info, phase, self.static_out)

    def capture_backward(self, pool: Any, surface: tuple[torch.Tensor, ...], allow_unused: bool) -> None:
        """Capture the backward graph: the gradients of the outputs that require grad
        with respect to the static input surface (the sample arguments, then a module's
        parameters) that requires grad, from static output gradients. It has no Python
        to re-run, so it is announced as a bare graph (labelled ``... backward``): its
        replays get no shadow, and the bare-graph rules watch its memory."""
        outputs = [o for o in tree_flatten(self.static_out)[0] if isinstance(o, torch.Tensor)]
        needs = [o for o in outputs if o.requires_grad]
        grad_outputs = [torch.empty_like(o) if o.requires_grad else None for o in outputs]
        wanted = [t for t in surface if t.requires_grad]
        grads: tuple = ()
        bwd = EmulatedCUDAGraph()
        bwd._where = frames.user_frame(3)
        bwd._info = protocol.GraphInfo(next(bare_ids), self.info.label.replace("@", " backward@", 1),
                                       str(protocol.CUDAGraphMode.FULL), False, protocol.BreakOutputs.DISCARD, False)
        if needs:
            with graph(bwd, pool=pool):
                grads = torch.autograd.grad(needs, wanted, [g for g in grad_outputs if g is not None],
                                            only_inputs=True, allow_unused=allow_unused)
        it = iter(grads)
        grad_inputs = tuple(next(it) if t.requires_grad and grads else None for t in surface)
        self.backward_graph = bwd if needs else None
        flat_out = tuple(outputs)
        n_user = len(self.static_in)
        graphed = self

        class Graphed(torch.autograd.Function):
            @staticmethod
            def forward(ctx: Any, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
                graphed._replay(inputs[:n_user])
                return tuple(o.detach() for o in flat_out)

            @staticmethod
            @torch.autograd.function.once_differentiable
            def backward(ctx: Any, *grads_in: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
                with torch.no_grad():
                    for static, grad in zip(grad_outputs, grads_in):
                        if static is not None and grad is not None and static.data_ptr() != grad.data_ptr():
                            static.copy_(grad)
                if graphed.backward_graph is not None:
                    graphed.backward_graph.replay()
                return tuple(b.detach() if b is not None else None for b in grad_inputs)

        params = tuple(surface[n_user:])
        spec = tree_flatten(self.static_out)[1]

        def functionalized(*args: Any) -> Any:
            leaves = self._leaves(args)
            return tree_unflatten(list(Graphed.apply(*leaves, *params)), spec)

        self._autograd = functionalized

    def forward(self, *args: Any) -> Any:
        """A graphed module's ``forward``: the graph, or the original ``forward`` when
        the module's training flag is not the one it was captured with."""
        if self.fn.training != self.training:
            return self.run(*args)
        return self(*args)

    def __call__(self, *args: Any) -> Any:
        if self._autograd is not None:
            return self._autograd(*args)
        return self._replay(self._leaves(args))

    def _leaves(self, args: tuple) -> list[torch.Tensor]:
        leaves = tree_flatten(args)[0]
        if len(leaves) != len(self.static_in) or not all(isinstance(a, torch.Tensor) for a in leaves):
            raise TypeError(
                f"graph {self.info.label} takes {len(self.static_in)} tensors, as its sample_args, but was called "
                f"with ({', '.join(type(a).__name__ for a in leaves)}); pass tensors in the sample's order and format"
            )
        return leaves

    def _replay(self, leaves: Any) -> Any:
        """Copy the arguments into the static inputs, offer the shadow, replay the forward."""
        with torch.no_grad():
            for dst, src in zip(self.static_in, leaves):
                if dst.data_ptr() != src.data_ptr():
                    dst.copy_(src)
        if protocol.has_observers():
            read = [_as_read(dst, src) for dst, src in zip(self.static_in, leaves)]
            protocol.announce("before_replay", self.info, functools.partial(self._shadow, tree_unflatten(read, self.spec)))
        phase = protocol.Phase.REPLAY
        protocol.announce("on_graph_begin", self.info, phase)
        protocol.announce("on_segment_begin", self._segment(phase))
        self.graph.replay()
        protocol.announce("on_segment_end", self._segment(phase))
        protocol.announce("on_graph_end", self.info, phase, self.static_out)
        return self.static_out

    def _shadow(self, args: tuple) -> Any:
        """The callable run eagerly as the replayed step: inside a capture as far as
        ``is_current_stream_capturing()`` tells, its objects' Python state put back."""
        state = _PythonState(self.fn)
        try:
            with protocol.capturing_as_on_gpu(True):
                return self.run(*args)
        finally:
            state.restore()


def _as_read(static: torch.Tensor, arg: torch.Tensor) -> torch.Tensor:
    """The argument ``arg`` as the graph reads it once copied into ``static``: ``static``
    itself or, where ``copy_`` broadcast a smaller argument, the view of ``static``
    that holds the argument's values (index 0 of the broadcast dimensions)."""
    if arg.shape == static.shape:
        return static
    lead = (0,) * (static.dim() - arg.dim())
    return static[lead + tuple(slice(0, n) for n in arg.shape)]


class _PythonState:
    """What a shadow's Python may change in the objects a graphed callable is bound to:
    a module and its submodules, a method's object (and its submodules if it is a
    module), and the modules a function refers to (closure or globals). Saved: their
    attribute bindings and the contents of the dicts, lists and sets they hold (a
    module's parameter, buffer and submodule tables among them); ``restore`` puts them
    back, so a counter the callable advances stays where a run without shadows leaves
    it (replays run no Python). Not saved: other objects, globals and closure variables
    themselves, containers nested deeper; a shadow changes them as the callable's Python
    does."""

    def __init__(self, fn: Any) -> None:
        self.saved = []
        for obj in _bound_objects(fn):
            attrs = vars(obj)
            contents = [(c, c.copy()) for c in attrs.values() if isinstance(c, (dict, list, set))]
            self.saved.append((attrs, dict(attrs), contents))

    def restore(self) -> None:
        # Put back unconditionally: comparing would call the values' __eq__ (tensors').
        for attrs, bindings, contents in self.saved:
            attrs.clear()
            attrs.update(bindings)
            for container, copy in contents:
                if isinstance(container, list):
                    container[:] = copy
                else:
                    container.clear()
                    container.update(copy)


def _bound_objects(fn: Any) -> list[Any]:
    """The objects ``_PythonState`` keeps for callable ``fn``."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    if isinstance(fn, torch.nn.Module):
        return list(fn.modules())
    if inspect.ismethod(fn):
        owner = fn.__self__
        return list(owner.modules()) if isinstance(owner, torch.nn.Module) else [owner] if hasattr(owner, "__dict__") else []
    code = getattr(fn, "__code__", None)
    if code is None:
        return []
    values = [fn.__globals__.get(n) for n in code.co_names]
    for cell in fn.__closure__ or ():
        try:
            values.append(cell.cell_contents)
        except ValueError:  # a cell not yet bound
            pass
    found: dict[int, Any] = {}
    for value in values:
        if isinstance(value, torch.nn.Module):
            found.update((id(m), m) for m in value.modules())
    return list(found.values())

