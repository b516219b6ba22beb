"""What the emulated runtime watches of a captured training step.

A training step captured whole (forward, ``backward()``, ``optimizer.step()`` in one
``torch.cuda.graph``, as PyTorch's documentation shows) keeps three things from its
capture that the program can change behind the graph's back, and each replay then
computes with the capture's version, silently:

- **the learning rate, when it is a Python float.** The optimizer's kernels take it as
  a launch argument (``param.add_(grad, alpha=-lr)``, Adam's ``step_size``), so the graph
  holds the capture's value; a scheduler that sets ``param_groups[i]["lr"]`` to another
  float changes nothing the replay reads. A tensor learning rate (``lr=torch.tensor(..)``
  with ``capturable=True``) is read at each replay, and schedulers ``fill_`` it in place.
- **the ``.grad`` tensors.** With ``zero_grad(set_to_none=True)`` before the capture, the
  captured ``backward()`` allocates each parameter's ``.grad`` from the graph's pool and
  every replay refills it in place. ``zero_grad(set_to_none=True)`` after the capture
  (the default of ``zero_grad()``) re-binds ``.grad`` to ``None``: the replay still
  writes the capture's tensors, and code that reads ``.grad`` (clipping, logging,
  accumulation) sees ``None`` or a tensor no replay writes.
- **autocast's weight cache.** Under ``autocast`` with ``cache_enabled=True`` (the
  default), the lower-precision copy of a weight is made once per autocast region and
  reused; made during a capture, it is graph memory that the optimizer's updates never
  reach, and reused from before a capture it is a tensor the region frees on exit.
  PyTorch's requirement: ``torch.autocast(..., cache_enabled=False)`` around captures.

``Watch`` is one graph's view of these: the optimizers stepped during its capture (a
global optimizer step pre-hook) with their float learning rates and the ``.grad`` tensors
the capture made, checked before each replay. The line that changed them is found by
wrapping what changes them (``LRScheduler.step``, ``zero_grad``); autocast regions are
followed by wrapping ``autocast.__enter__``/``__exit__``. Each hazard is announced once per
graph as a ``protocol.TrainingHazardEvent`` (``on_training_hazard``). ``patches()`` gives
``runtime.emulated.emulate_cuda`` what it installs for the block.
"""

from __future__ import annotations

import collections
import functools
import weakref
from typing import Any, Callable, Iterator

import torch
from torch.utils.weak import WeakIdKeyDictionary

from capturelint.runtime import frames, protocol

_capturing: list["Watch"] = []  # the captures under way, innermost last
_rebound_at: WeakIdKeyDictionary = WeakIdKeyDictionary()  # parameter -> the zero_grad line that set .grad to None
_lr_changed_at: WeakIdKeyDictionary = WeakIdKeyDictionary()  # optimizer -> (line, scheduler class) of its last step
_autocasts: list[tuple[Any, protocol.Frame]] = []  # autocast regions entered, innermost last


def _float_lrs(optimizer: Any) -> list[tuple[int, float]]:
    return [(i, float(g["lr"])) for i, g in enumerate(optimizer.param_groups) if isinstance(g.get("lr"), (int, float))]


class Watch:
    """One capture's training state (the module docstring), made at ``capture_begin``."""

    def __init__(self, graph: Any) -> None:
        self.graph = weakref.ref(graph)
        self.begun_at = frames.user_frame(3)
        self.steps: list[tuple[Any, protocol.Frame, list[tuple[int, float]]]] = []  # optimizer (weak), step line, lrs
        self.grads: list[tuple[Any, int]] = []  # parameter (weak), the storage of the .grad the capture made
        self.reported: set[tuple[protocol.TrainingHazard, Any]] = set()

    def info(self) -> protocol.GraphInfo | None:
        graph = self.graph()
        return graph.where[0] if graph is not None else None

    def stepped(self, optimizer: Any) -> None:
        if not any(ref() is optimizer for ref, _, _ in self.steps):
            self.steps.append((weakref.ref(optimizer), frames.user_frame(4), _float_lrs(optimizer)))

    def ended(self, allocated: Any) -> None:
        """At capture end: the ``.grad`` tensors of the stepped optimizers' parameters that
        the capture allocated (``allocated``: the graph's storages)."""
        for ref, _, _ in self.steps:
            optimizer = ref()
            for group in optimizer.param_groups if optimizer is not None else ():
                for p in group["params"]:
                    if p.grad is not None and p.grad.untyped_storage()._cdata in allocated:
                        self.grads.append((weakref.ref(p), p.grad.untyped_storage()._cdata))
                        if p in _rebound_at:  # a zero_grad before the capture re-bound nothing it made
                            del _rebound_at[p]

    def before_replay(self, replay_frame: protocol.Frame) -> None:
        info = self.info()
        if info is None or not protocol.has_observers():
            return
        for ref, step_at, lrs in self.steps:
            optimizer = ref()
            if optimizer is None:
                continue
            for i, lr in lrs:
                now = optimizer.param_groups[i].get("lr") if i < len(optimizer.param_groups) else None
                key = (protocol.TrainingHazard.BAKED_LR, (id(optimizer), i))
                if isinstance(now, (int, float)) and float(now) != lr and key not in self.reported:
                    self.reported.add(key)
                    changed = _lr_changed_at.get(optimizer)
                    protocol.announce("on_training_hazard", protocol.TrainingHazardEvent(
                        protocol.TrainingHazard.BAKED_LR, step_at, changed[0] if changed else replay_frame, info,
                        f"{type(optimizer).__name__}.param_groups[{i}]['lr']", repr(lr), repr(float(now)),
                        changed_by=changed[1] if changed else ""))
        rebound = []
        for ref, sid in self.grads:
            p = ref()
            if p is not None and (p.grad is None or p.grad.untyped_storage()._cdata != sid):
                rebound.append((p, sid))
        key = (protocol.TrainingHazard.GRAD_REBOUND, None)
        if rebound and key not in self.reported:
            self.reported.add(key)
            p, sid = rebound[0]
            at = _rebound_at.get(p)
            protocol.announce("on_training_hazard", protocol.TrainingHazardEvent(
                protocol.TrainingHazard.GRAD_REBOUND, self.begun_at, at if at is not None else replay_frame, info,
                "", "the capture's tensor", "None" if p.grad is None else "another tensor", count=len(rebound),
                changed_by="zero_grad" if at is not None else "", storage=p.untyped_storage()._cdata))

    def autocast_cached(self, entered_at: protocol.Frame) -> None:
        info = self.info()
        key = (protocol.TrainingHazard.AUTOCAST_CACHE, None)
        if info is not None and key not in self.reported:
            self.reported.add(key)
            protocol.announce("on_training_hazard", protocol.TrainingHazardEvent(
                protocol.TrainingHazard.AUTOCAST_CACHE, entered_at, self.begun_at, info, "torch.autocast",
                "cache_enabled=True", "cache_enabled=False"))


def capture_begun(graph: Any) -> Watch:
    """``capture_begin``: a new watch, and an autocast region with its cache on already
    around the capture is a hazard of it."""
    watch = Watch(graph)
    _capturing.append(watch)
    cached = [at for autocast, at in _autocasts if getattr(autocast, "_enabled", False)
              and getattr(autocast, "_cache_enabled", False)]
    if cached:
        watch.autocast_cached(cached[-1])
    return watch


def capture_ended(watch: Watch, allocated: Any) -> None:
    if watch in _capturing:
        _capturing.remove(watch)
    watch.ended(allocated)


# ------------------------------------------------------------------- the patches


def _step_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
    if _capturing:
        _capturing[-1].stepped(optimizer)


def _wrap_zero_grad(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def zero_grad(self: Any, set_to_none: bool = True) -> Any:
        if set_to_none:
            at = frames.user_frame(2)
            params = (p for g in self.param_groups for p in g["params"]) if hasattr(self, "param_groups") else (
                self.parameters() if isinstance(self, torch.nn.Module) else ())
            for p in params:
                if p.grad is not None:
                    _rebound_at[p] = at
        return original(self, set_to_none)

    return zero_grad


def _wrap_scheduler_step(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def step(self: Any, *args: Any, **kwargs: Any) -> Any:
        optimizer = getattr(self, "optimizer", None)
        before = _float_lrs(optimizer) if optimizer is not None else []
        result = original(self, *args, **kwargs)
        if optimizer is not None and _float_lrs(optimizer) != before:  # not the constructor's first step
            _lr_changed_at[optimizer] = (frames.user_frame(2), type(self).__name__)
        return result

    return step


def _wrap_enter(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def __enter__(self: Any) -> Any:
        result = original(self)
        at = frames.user_frame(2)
        _autocasts.append((self, at))
        if _capturing and getattr(self, "_enabled", False) and getattr(self, "_cache_enabled", False):
            _capturing[-1].autocast_cached(at)
        return result

    return __enter__


def _wrap_exit(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def __exit__(self: Any, *exc: Any) -> Any:
        for i in range(len(_autocasts) - 1, -1, -1):
            if _autocasts[i][0] is self:
                del _autocasts[i]
                break
        return original(self, *exc)

    return __exit__


def patches() -> Iterator[tuple[Any, str, Any]]:
    """(owner, attribute, value) for what ``emulate_cuda`` installs for the block: the
    optimizer step pre-hook (in a copy of torch's table of global hooks), ``zero_grad``
    of optimizers and modules, the schedulers' ``step``, autocast's ``__enter__``/``__exit__``."""
    import torch.optim.lr_scheduler as lr_scheduler
    import torch.optim.optimizer as optimizer

    hooks = collections.OrderedDict(optimizer._global_optimizer_pre_hooks)
    hooks[object()] = _step_hook
    yield optimizer, "_global_optimizer_pre_hooks", hooks
    yield torch.optim.Optimizer, "zero_grad", _wrap_zero_grad(torch.optim.Optimizer.zero_grad)
    yield torch.nn.Module, "zero_grad", _wrap_zero_grad(torch.nn.Module.zero_grad)
    for cls in (c for c in vars(lr_scheduler).values()
                if isinstance(c, type) and issubclass(c, lr_scheduler.LRScheduler) and "step" in vars(c)):
        yield cls, "step", _wrap_scheduler_step(vars(cls)["step"])
    autocast = torch.amp.autocast_mode.autocast
    yield autocast, "__enter__", _wrap_enter(autocast.__enter__)
    yield autocast, "__exit__", _wrap_exit(autocast.__exit__)


__all__ = ["Watch", "capture_begun", "capture_ended", "patches"]
