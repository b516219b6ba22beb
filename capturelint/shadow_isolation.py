"""Shadow isolation: a shadow step leaves no trace, and each break's Python runs once.

The shadow has no side effects on tensors: before an op writes a storage that existed
before the shadow began, ``ShadowIsolation`` copies the storage; after the shadow it
restores every copy and every random generator, so the replay starts from exactly the
state the shadow started from.

**Each break's Python runs once per step.** The shadow's outermost break calls are the
step's calls (host state a break keeps, a counter, a scheduling object planned per step,
advances once, as in an untraced run): the tracer records each one (``ShadowBreak``:
its inputs, the storages it wrote and the values it left there, the random generators it
advanced, its result), and when the replay reaches that break the runtime asks for the
record (``protocol.run_or_reuse``) and re-applies it instead of running the break again.
Writes to the break's arguments the step made land in the replay's arguments (the
capture-time tensors). In storages that existed before the shadow only the bytes the
call changed are re-applied, not the whole storage: one storage may hold what other
code wrote too (all of DeepSeek V4's KV caches view one buffer, and a captured segment
of the shadow may have written another layer's cache in it, which the replay must
write itself or not at all). A write to a tensor the shadow made that is not an
argument (reached through an object) has no counterpart in the replay and is not
re-applied. The record is reused only when the replay feeds the break exactly what the
shadow fed it, compared value by value: its arguments and the storages it read before
writing them, and, whole, each storage from before the shadow that it wrote, as it was
when the call first wrote it (a read after its own write of one region may read
another region that code before the break wrote). Then the call would compute the
same, and the replay's tensors evolve as an untraced replay's. When the replay diverged
before the break (a stale input, a baked branch, a cache the captured code left
unwritten) or its breaks differ from the shadow's, the replay runs the break on its own
inputs, as the untraced program does, so the divergence still reaches the output and
the comparison; only then does a break's host state advance a second time in the step.

Kept apart from the dispatch mode (``capturelint.tracer``), as PyTorch's CUDA sanitizer
keeps its state classes apart from its mode.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

from capturelint.objects import break_leaves, max_abs_diff, random_states, restore_random_states
from capturelint.records import StorageId, Stream
from capturelint.runtime import protocol as rt
from capturelint.runtime.schema import OpInfo


class ShadowBreak:
    """One outermost eager break call of a shadow step, kept for the replay of that
    step (``replayed`` hands it to the runtime as ``protocol.RecordedBreak``).

    Recorded: the values of its tensor arguments and of the storages that existed
    before the shadow which it read before writing (its inputs, at entry or first
    read), the storages it wrote (those from before the shadow as they were at its
    first write to them), and, at exit, the values it left in its arguments, the bytes
    it changed in those storages (its effects) and what it returned."""

    def __init__(self, name: str, args: list[torch.Tensor], rng: list[tuple[Any, Any]],
                 leaves: list[tuple[str, Any]] = (), origins: dict[StorageId, Any] | None = None):
        self.name = name
        # what it was handed, objects walked (``objects.break_leaves``: a metadata object's
        # host values, and which memory from before the shadow its tensors are), for the
        # replay's call, which is handed what the capture handed it
        self.leaves = [(path, _leaf(v, origins or {})) for path, v in leaves]
        self.rng = rng  # the generators' states at entry; at exit, those the call advanced
        self.args = args
        self.args_in = [t.detach().clone() for t in args]
        self.arg_sids = [t.untyped_storage()._cdata for t in args]
        self.arg_storages = set(self.arg_sids)
        self.args_read: set[StorageId] = set()  # argument storages read before any write
        self.read: dict[StorageId, tuple[torch.Tensor, torch.Tensor]] = {}  # external storage -> (view read, its value then)
        self.written: dict[StorageId, tuple[Any, Any]] = {}  # storage -> (storage, its copy at the first write if it existed before the shadow)
        self.args_out: list[torch.Tensor | None] = []
        self.changed: list[tuple[Any, torch.Tensor, torch.Tensor]] = []  # (storage, byte offsets, their values at exit)
        self.result: Any = None

    def uses(self, info: OpInfo, args: tuple, kwargs: dict, stream: Stream) -> None:
        """An op inside the call: note the storages it writes, and the values of those
        that existed before the shadow that it reads before writing them."""
        written = {t.untyped_storage()._cdata: t.untyped_storage() for t in info.written(args, kwargs)}
        if info.reads_values:
            for t in tree_flatten((args, kwargs))[0]:
                if not isinstance(t, torch.Tensor):
                    continue
                st = t.untyped_storage()
                sid = st._cdata
                origin = stream.origins.get(sid)
                if sid in written or sid in self.written:
                    continue
                if sid in self.arg_storages:
                    self.args_read.add(sid)
                elif sid not in self.read and (origin is None or origin.external):
                    self.read[sid] = (t, t.detach().clone())
        for sid, st in written.items():
            if sid not in self.written:
                origin = stream.origins.get(sid)
                self.written[sid] = (st, st.clone() if origin is None or origin.external else None)

    def exit(self, result: Any) -> None:
        self.rng = [(gen, gen.get_state()) for gen, state in self.rng if not torch.equal(gen.get_state(), state)]
        made = {sid for sid, (st, before) in self.written.items() if before is None}  # written memory the step made
        self.args_out = [t.detach().clone() if t.untyped_storage()._cdata in made else None for t in self.args]
        self.changed = []
        for st, before in self.written.values():
            if before is not None:
                now = storage_bytes(st)
                at = (now != storage_bytes(before)).nonzero().flatten()
                if at.numel():
                    self.changed.append((st, at, now[at]))
        self.result = tree_map(lambda v: v.detach().clone() if isinstance(v, torch.Tensor) else v, result)
        self.args = []  # the shadow's own tensors, released with it

    def input_error(self, args: list[torch.Tensor], leaves: list[tuple[str, Any]]) -> float:
        """How far the replay's inputs to this call (the arguments and storages it read
        before writing them, the storages from before the shadow that it wrote, the host
        values and tensors inside the objects it was handed) are from the shadow's; NaN
        where both hold NaN is equal."""
        if len(args) != len(self.args_in) or [p for p, _ in leaves] != [p for p, _ in self.leaves]:
            return float("inf")
        for (_, mine), (_, theirs) in zip(self.leaves, leaves):
            if isinstance(mine, _Memory):  # memory from before the shadow: the replay must hand the break the same
                if not isinstance(theirs, torch.Tensor) or theirs.untyped_storage()._cdata != mine.sid:
                    return float("inf")
            elif mine is _MADE:  # memory the step made: the replay hands the capture's
                if not isinstance(theirs, torch.Tensor):
                    return float("inf")
            elif isinstance(theirs, torch.Tensor) or not (mine == theirs or mine != mine and theirs != theirs):
                return float("inf")  # a host value baked at capture (NaN equals NaN)
        pairs = [(t, value) for t, value, shadow in zip(args, self.args_in, self.arg_sids)
                 if shadow in self.args_read]
        for t, shadow in zip(args, self.arg_sids):
            if self.written.get(shadow, (None, None))[1] is not None and t.untyped_storage()._cdata != shadow:
                return float("inf")  # the shadow wrote memory from before it; the replay hands the break other memory
        for st, before in self.written.values():
            if before is not None and not torch.equal(storage_bytes(st), storage_bytes(before)):
                return float("inf")
        return max((input_diff(t, value) for t, value in pairs + list(self.read.values())), default=0.0)

    def replayed(self, args: list[torch.Tensor]) -> rt.RecordedBreak:
        def apply() -> None:
            restore_random_states(self.rng)
            with torch.no_grad():
                for st, at, values in self.changed:
                    storage_bytes(st)[at] = values
                for dst, value in zip(args, self.args_out):
                    if value is not None:
                        dst.copy_(value)

        return rt.RecordedBreak(self.result, apply)


def storage_bytes(st: Any) -> torch.Tensor:
    """Storage ``st`` as a flat tensor of its bytes (no copy)."""
    return torch.empty(0, dtype=torch.uint8, device=st.device).set_(st)


class _Memory:
    """A tensor handed to a break whose storage existed before the shadow."""

    __slots__ = ("sid",)

    def __init__(self, sid: StorageId):
        self.sid = sid


_MADE = object()  # a tensor handed to a break whose storage the step made


def _leaf(value: Any, origins: dict[StorageId, Any]) -> Any:
    if not isinstance(value, torch.Tensor):
        return value
    sid = value.untyped_storage()._cdata
    origin = origins.get(sid)
    return _Memory(sid) if origin is None or origin.external else _MADE


def input_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest difference between ``a`` and ``b``; NaN where both hold NaN is equal."""
    if a.shape != b.shape:
        return float("inf")
    both_nan = a.isnan() & b.isnan() if a.is_floating_point() else None
    diff = (a.detach().double() - b.double()).abs()
    if both_nan is not None:
        diff = diff.masked_fill(both_nan, 0.0)
    return max_abs_diff([diff], [torch.zeros_like(diff)])


class ShadowIsolation:
    """The state a shadow step must leave as it found: copies of the storages it wrote
    that existed before it (copy before write), the random generators, and its break
    calls for the replay (``ShadowBreak``)."""

    def __init__(self) -> None:
        self.cow: dict[StorageId, tuple[Any, Any]] | None = None  # while a shadow runs
        self.rng: list[tuple[Any, Any]] = []
        self.call: ShadowBreak | None = None  # the shadow's break call under way
        self.calls: list[ShadowBreak] = []  # the shadow's break calls, for its replay

    @property
    def active(self) -> bool:
        """Whether a shadow runs (its writes are copied before they land)."""
        return self.cow is not None

    def begin(self) -> None:
        self.cow = {}
        self.calls, self.call = [], None

    def save_random(self, roots: dict[str, Any]) -> None:
        self.rng = random_states(roots)

    def copy_before_write(self, info: OpInfo, args: tuple, kwargs: dict, stream: Stream) -> None:
        for t in info.written(args, kwargs):
            st = t.untyped_storage()
            sid = st._cdata
            origin = stream.origins.get(sid)
            if (origin is None or origin.external) and sid not in self.cow:
                self.cow[sid] = (st, st.clone())

    def undo(self) -> None:
        """The shadow ended: every storage it wrote and every generator as it began."""
        self.call = None
        with torch.no_grad():
            for st, saved in self.cow.values():
                st.copy_(saved)
        self.cow = None
        restore_random_states(self.rng)
        self.rng = []

    def break_exit(self, result: Any) -> None:
        record, self.call = self.call, None
        if record is not None:
            record.exit(result)
            self.calls.append(record)

    def reuse(self, call: rt.BreakCall) -> rt.RecordedBreak | None:
        """The replay's call of a break reuses the shadow's call of it (see
        ``protocol.run_or_reuse``) when the replay feeds it exactly what the shadow fed
        it; otherwise the replay runs it on its own inputs, as an untraced replay would,
        so a replay that feeds a break wrong values still diverges from the shadow."""
        if call.phase is not rt.Phase.REPLAY or not self.calls:
            return None
        record = self.calls.pop(0)
        if record.name != call.name:  # the replay left the shadow's path: it runs its breaks itself
            self.calls.clear()
            return None
        args = list(rt.flatten_tensors((call.args, call.kwargs)))
        if record.input_error(args, list(break_leaves(call.named_arguments()))) != 0.0:
            # the replay diverged before the break, or hands it the capture's host values:
            # it runs on its own inputs
            return None
        return record.replayed(args)
