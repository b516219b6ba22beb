"""What an emulated graph keeps of the memory it reads, and the poison it leaves.

A CUDA graph holds raw pointers: the tensors it reads but does not own stay the
program's, and memory the program frees is reused. The emulated graph holds aliases
over that memory (``BorrowedTensors``), counts them apart from the program's own
references (``graph_aliases``, ``graph_owned``), and before each replay poisons what
nothing outside the graphs holds any more (``poison_freed``) and announces the holders
the program re-bound (``announce_rebound``). See ``runtime.emulated``'s docstring,
**Capture-time values are garbage**, **Freed inputs are reused memory** and
**Re-bound holders are watched**.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_map

from capturelint.runtime import frames, holders, protocol

StorageId = int


# ------------------------------------------------------------------------ poison


def poison_value(dtype: torch.dtype) -> Any:
    """The value a poisoned storage holds for ``dtype`` (see ``runtime.emulated``'s docstring)."""
    if dtype.is_floating_point or dtype.is_complex:
        return float("nan")
    if dtype is torch.bool:
        return True
    return 0


def poison_storage(storage: torch.UntypedStorage, dtype: torch.dtype) -> None:
    """Fill the whole of ``storage``, read as ``dtype``, with the poison value."""
    with _disable_current_modes(), torch.no_grad():
        poison_unguarded(storage, dtype)


def poison_unguarded(storage: torch.UntypedStorage, dtype: torch.dtype) -> None:
    """``poison_storage`` where no mode is active and grad is off (a capture's end)."""
    n = storage.nbytes() // dtype.itemsize
    if n:
        torch.empty(0, dtype=dtype, device=storage.device).set_(storage, 0, (n,), (1,)).fill_(poison_value(dtype))


def map_tensors(fn: Callable[[torch.Tensor], Any], obj: Any) -> Any:
    """``tree_map(fn, obj)`` for an op's arguments (tuples, lists, dicts of tensors and
    scalars), without pytree's per-leaf overhead; containers without a tensor are
    returned as they are."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, (tuple, list)):
        mapped = [map_tensors(fn, x) for x in obj]
        if all(a is b for a, b in zip(mapped, obj)):
            return obj
        return type(obj)(mapped) if type(obj) in (tuple, list) else tree_map(fn, obj)
    if isinstance(obj, dict):
        if not obj:
            return obj
        return {k: map_tensors(fn, v) for k, v in obj.items()}
    return obj


def alias_of(t: torch.Tensor) -> torch.Tensor:
    """A new tensor over ``t``'s memory that holds no reference to ``t`` itself."""
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage(), t.storage_offset(), t.size(), t.stride())


# A storage is referenced by every tensor over it and by its one Python object. The
# graphs' aliases are counted here so that "nothing else holds it" can be told.
graph_aliases: dict[StorageId, int] = {}
# Storages allocated during a capture: graph-pool memory, alive as long as its graph.
graph_owned: dict[StorageId, int] = {}


def outside_references(sid: StorageId) -> int:
    return torch._C._storage_Use_Count(sid) - 1 - graph_aliases.get(sid, 0)


def _alive(sid: StorageId) -> bool:
    """Whether something outside the graphs holds borrowed storage ``sid``."""
    return outside_references(sid) > 0


class BorrowedTensors:
    """Tensors a graph reads but does not own, held as aliases over their memory, as a
    GPU graph holds raw pointers (and vLLM's runtime weak references to break
    arguments): ``freed()`` tells which of them nothing outside the graphs holds."""

    def __init__(self) -> None:
        self._aliases: dict[StorageId, int] = {}
        self._storages: dict[StorageId, tuple[torch.UntypedStorage, torch.dtype]] = {}
        self._memo: dict[int, torch.Tensor] = {}

    def borrow(self, t: Any) -> Any:
        """An alias of ``t`` (any other value is returned as it is)."""
        if not isinstance(t, torch.Tensor):
            return t
        alias = self._memo.get(id(t))
        if alias is None:
            st = t.untyped_storage()
            sid = st._cdata
            with _disable_current_modes(), torch.no_grad():
                alias = alias_of(t)
            self._memo[id(t)] = alias
            self._aliases[sid] = self._aliases.get(sid, 0) + 1
            graph_aliases[sid] = graph_aliases.get(sid, 0) + 1
            self._storages.setdefault(sid, (st, t.dtype))
        return alias

    def done(self) -> None:
        """Borrowing is over: the original tensors are no longer referenced here."""
        self._memo.clear()

    def storages(self) -> list[StorageId]:
        """The storages borrowed, in the order first borrowed."""
        return list(self._storages)

    def freed(self) -> list[tuple[StorageId, torch.UntypedStorage, torch.dtype]]:
        return [
            (sid, st, dt) for sid, (st, dt) in self._storages.items()
            if sid not in graph_owned and outside_references(sid) <= 0
        ]

    def release(self) -> None:
        for sid, n in self._aliases.items():
            left = graph_aliases.get(sid, 0) - n
            if left > 0:
                graph_aliases[sid] = left
            else:
                graph_aliases.pop(sid, None)
        self._aliases, self._storages, self._memo = {}, {}, {}

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:
            pass



def poison_freed(borrowed: BorrowedTensors, info: protocol.GraphInfo, segment: int, poisoned: set[StorageId],
                 found: holders.Holders | None = None) -> None:
    """Before a replay: poison every borrowed storage the program has freed, as the
    caching allocator would have reused it, and announce each once, with the holder
    the program re-bound away from it and the line that did, where the capture found
    the holders (``found``: a bare graph's)."""
    for sid, st, dtype in borrowed.freed():
        poison_storage(st, dtype)
        if sid not in poisoned:
            poisoned.add(sid)
            replaced = found.replaced(sid) if found is not None else None
            if replaced is None:
                event = protocol.StaleInputEvent(info, segment, sid, str(dtype).removeprefix("torch."))
            else:
                holder, now = replaced
                event = protocol.StaleInputEvent(info, segment, sid, str(dtype).removeprefix("torch."), holder.label,
                                                 now.untyped_storage()._cdata, holders.rebinding_line(holder))
            protocol.announce("on_stale_input", event)


def announce_rebound(found: holders.Holders, info: protocol.GraphInfo, segment: int, replay: int) -> None:
    """Before a replay: announce each holder of an input that the program re-bound
    while the captured tensor stays alive and unwritten (``runtime.holders``), once."""
    for holder, now, held_by in found.rebound(_alive):
        event = protocol.HeldInputEvent(
            info, segment, holder.storage, str(holder.dtype).removeprefix("torch."), holder.shape, holder.label,
            now.untyped_storage()._cdata, held_by, holders.rebinding_line(holder), replay, frames.user_frame(2),
        )
        protocol.announce("on_held_input", event)


def announce_host_state(stored: list[tuple[holders.Holder, protocol.Frame]], info: protocol.GraphInfo,
                        replay: int) -> list[tuple[holders.Holder, protocol.Frame]]:
    """Before a replay: announce, once per graph, the holders the captured code filled
    (``holders.stored``) that the program has re-bound or emptied since (CL116), and
    return what is left to watch (nothing once announced)."""
    changed = [(h, at, how) for h, at in stored if (how := holders.emptied(h)) is not None]
    if not changed:
        return stored
    holder, at, how = changed[0]
    line = holders.rebinding_line(holder) if how == "re-bound" else None
    replay_at = frames.user_frame(3)
    known = line is not None and line != at  # a class's one assignment may be the captured one itself
    protocol.announce("on_training_hazard", protocol.TrainingHazardEvent(
        protocol.TrainingHazard.HOST_STATE, at, line if known else replay_at, info, holder.label,
        f"replay {replay}", how, count=len(changed), changed_by="re-binding" if known else "", storage=holder.storage))
    return []
