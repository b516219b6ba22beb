"""Who holds a bare graph's inputs, and which holder the program re-bound (rule CL108).

**Idea.** A program feeds a CUDA graph through names: ``self.static_x``, a global, a
list slot, a closure variable. The graph reads the tensor the name held at capture. A
program that re-binds the name to a new tensor (``self.static_x = batch``) while the
captured tensor stays alive elsewhere (a list, a closure, ``make_graphed_callables``'
static inputs) frees no memory, so the emulator's freed-input check (CL104) stays
silent, and every replay reads the old tensor, never the new one.

**What is built.** ``discover`` runs at the end of a bare graph's capture. It walks the
program's objects from the running frames of engine or model code (their locals, then
their modules' globals), breadth first, through instance attributes, ``nn.Module``
parameters, buffers and submodules, lists, tuples, dicts and closure cells, and records
every slot that holds a tensor over one of the graph's input storages, with the path the
program knows it by (``runner.static_x``, ``runner.model.0.weight``,
``runner.inputs[0]``, ``global x of module prog``). No roots are given: the walk starts
where the program is. ``self`` is named after its class (``runner`` for a ``Runner``).
At each replay, ``Holders.rebound`` reads every slot again: one that now holds another
tensor of the captured one's shape and dtype, while the captured tensor is alive and
was not written since the previous replay, is re-bound. "Not written" is read off the
captured tensor's version counter, which every in-place write through it or a view of
it bumps.

**The re-binding line.** CL108 names it, and so does CL104 when the re-bound tensor
was freed (``Holders.replaced``). Python has no cheap hook on an assignment, so the line is
found in the source: ``rebinding_line`` reads the functions running at the replay, the
replay's caller outwards, and takes the assignment to the holder's name (``.static_x =``,
``x =``) nearest before the running line (else after it: a loop); failing that, the one
assignment to the attribute in the methods of the holder's class (``__init__`` aside).
The rule also names the line that allocated the new tensor, from the tracer's
allocation frames.

**Cost.** Nothing per op: a walk bounded by ``MAX_OBJECTS`` objects at capture end,
and one lookup per recorded slot at each replay.

**Frames.** Reading a frame's locals leaves a snapshot of them on the frame, which
would keep a re-bound local's old tensor alive. The frames read at capture are held
while they run, their snapshots refreshed at every replay before freed inputs are
looked for (``Holders.refresh``), and let go (refreshed once more) when they end.

Limitations: objects reachable only through types of torch, of the standard library or
of installed packages other than ``nn.Module`` (and ``types.SimpleNamespace``), or
beyond ``MAX_OBJECTS`` objects from the running frames, are not walked; a list or dict
slot has no name to search the source for, so only the allocation line is named.
"""

from __future__ import annotations

import ast
import collections
import dataclasses
import inspect
import itertools
import linecache
import sys
import textwrap
import types
import weakref
from typing import Any, Callable, Collection, Iterator

import torch

from capturelint.runtime import frames
from capturelint.runtime.protocol import Frame

MAX_OBJECTS = 20_000
"""Containers and objects visited by one walk, at most."""

MAX_ITEMS = 4_096
"""Items of one list, tuple or dict looked at, at most."""

_MODULE_SLOTS = ("_parameters", "_buffers", "_modules")  # an nn.Module's children, named as attributes


@dataclasses.dataclass(eq=False)
class Holder:
    """A slot that held a graph input at capture.

    ``label`` names it in messages; ``anchor`` is where its path starts (a weak
    reference to an object, a running frame, or a module's globals) and ``steps`` the
    path from there (``("attr", name)``, ``("item", key)``, ``("cell", i)``,
    ``("local", name)``). ``name`` is the name an assignment re-binds it by (``None``
    for a list or dict slot); ``owner`` the class whose methods may assign it."""

    label: str
    anchor: Any
    steps: tuple[tuple[str, Any], ...]
    storage: int
    shape: tuple[int, ...]
    dtype: torch.dtype
    mutable: bool
    name: str | None
    owner: type | None

    def value(self) -> Any:
        """What the slot holds now (``_GONE`` when it no longer exists)."""
        anchor = self.anchor
        obj = anchor() if isinstance(anchor, weakref.ref) else anchor
        if obj is None:
            return _GONE
        try:
            for kind, key in self.steps:
                if kind == "attr":
                    obj = vars(obj)[key]
                elif kind == "item":
                    obj = obj.get(key, _GONE) if isinstance(obj, dict) else obj[key]  # no defaultdict insert
                    if obj is _GONE:
                        return _GONE
                elif kind == "cell":
                    obj = obj.__closure__[key].cell_contents
                else:  # a frame's local
                    obj = obj.f_locals[key]
        except (KeyError, IndexError, TypeError, ValueError, AttributeError):
            return _GONE
        return obj


_GONE = object()


class Holders:
    """The holders of one graph's inputs (``discover``) and what was reported of them."""

    def __init__(self, holders: list[Holder], running: list[Any], versions: list[tuple[int, Any, int]]):
        self._holders = holders
        self._frames = running
        self._versions = versions  # (storage, weak reference to the captured tensor, its version)
        self._reported: set[str] = set()

    def __len__(self) -> int:
        return len(self._holders)

    def names(self) -> dict[int, tuple[str, ...]]:
        """The holders' labels by storage, in the order found (shortest paths first)."""
        out: dict[int, list[str]] = {}
        for h in self._holders:
            out.setdefault(h.storage, []).append(h.label)
        return {sid: tuple(dict.fromkeys(labels)) for sid, labels in out.items()}

    def only(self, storages: Collection[int]) -> Holders:
        """These holders restricted to ``storages`` (the frames stay held)."""
        keep = set(storages)
        return Holders([h for h in self._holders if h.storage in keep], self._frames,
                       [v for v in self._versions if v[0] in keep])

    def refresh(self) -> None:
        """Before a replay looks for freed inputs: refresh the locals snapshot of every
        frame read at capture, and let go of the frames that have ended."""
        if not self._frames:
            return
        running, _ = frames.running_frames()
        ended = []
        for frame in self._frames:
            try:
                frame.f_locals  # noqa: B018 - reading it refreshes the snapshot
            except Exception:
                pass
            if id(frame) not in running:
                ended.append(frame)
        if ended:
            gone = {id(f) for f in ended}
            self._frames = [f for f in self._frames if id(f) not in gone]
            self._holders = [h for h in self._holders if id(h.anchor) not in gone]

    def rebound(self, alive: Callable[[int], bool]) -> Iterator[tuple[Holder, torch.Tensor, tuple[str, ...]]]:
        """Each holder re-bound since the previous replay (see the module docstring),
        once, with the tensor it holds now and the other holders that still hold the
        captured one."""
        written = set()
        versions = []
        for storage, ref, version in self._versions:
            t = ref()
            now = _version(t) if t is not None else None
            if now is not None and now != version:
                written.add(storage)
            versions.append((storage, ref, now if now is not None else version))
        self._versions = versions
        now = {id(h): h.value() for h in self._holders}

        def holds(h: Holder, storage: int) -> bool:
            v = now[id(h)]
            return isinstance(v, torch.Tensor) and _storage(v) == storage

        for h in self._holders:
            v = now[id(h)]
            if h.label in self._reported or not h.mutable or not isinstance(v, torch.Tensor):
                continue
            if _storage(v) in (h.storage, None) or tuple(v.shape) != h.shape or v.dtype != h.dtype:
                continue
            if h.storage in written or not alive(h.storage):
                continue
            self._reported.add(h.label)
            yield h, v, self._held_by(h, [o.label for o in self._holders if o is not h and holds(o, h.storage)])

    def replaced(self, storage: int) -> tuple[Holder, torch.Tensor] | None:
        """The holder that held ``storage`` at capture and holds another tensor now
        (the program re-bound it; the captured tensor may be gone), with that tensor;
        ``None`` when no holder of it was re-bound."""
        for h in self._holders:
            v = h.value() if h.storage == storage and h.mutable else None
            if isinstance(v, torch.Tensor) and _storage(v) not in (storage, None):
                return h, v
        return None

    def _held_by(self, h: Holder, known: list[str]) -> tuple[str, ...]:
        """Who holds ``h``'s captured tensor now: the holders found at capture that
        still do, and those a new walk from the running frames finds (a list that
        logged it after the capture). The frames the walk read are refreshed from now
        on, as the capture's are."""
        now = discover([h.storage])
        ids = {id(f) for f in self._frames}
        self._frames += [f for f in now._frames if id(f) not in ids]
        return tuple(dict.fromkeys(known + [o.label for o in now._holders if o.label != h.label]))


def _storage(t: torch.Tensor) -> int | None:
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):  # sparse, meta-less wrappers: no storage to compare
        return None


def _version(t: torch.Tensor) -> int | None:
    try:
        return t._version
    except RuntimeError:  # an inference tensor has no version counter
        return None


# ------------------------------------------------------------------ the walk

_user_types: dict[type, bool] = {}


def _user_type(tp: type) -> bool:
    """Whether instances of ``tp`` are the program's objects, worth walking: an
    ``nn.Module``, a ``SimpleNamespace``, or a class defined in engine or model code."""
    known = _user_types.get(tp)
    if known is None:
        if issubclass(tp, (torch.nn.Module, types.SimpleNamespace)):
            known = True
        else:
            module = sys.modules.get(tp.__module__)
            file = getattr(module, "__file__", None)
            known = bool(file) and not frames.hidden_file(file)
        _user_types[tp] = known
    return known


def _walkable(value: Any) -> str | None:
    """How the walk goes into ``value``: ``"items"``, ``"attrs"``, ``"cells"`` or not at all."""
    if isinstance(value, (list, tuple, dict)):
        return "items"
    if isinstance(value, (type, types.ModuleType, torch.Tensor)):
        return None
    if isinstance(value, types.FunctionType):
        return "cells" if value.__closure__ and not frames.hidden_code(value.__code__) else None
    if _user_type(type(value)) and isinstance(getattr(value, "__dict__", None), dict):
        return "attrs"
    return None


def _anchor(value: Any, anchor: Any, steps: tuple) -> tuple[Any, tuple]:
    """A weakly held object starts a new path; anything else continues the old one."""
    if isinstance(value, (list, tuple, dict)):
        return anchor, steps
    try:
        return weakref.ref(value), ()
    except TypeError:
        return anchor, steps


def discover(storages: Collection[int]) -> Holders:
    """The slots that hold a tensor over one of ``storages`` now, found from the
    running frames of engine or model code (see the module docstring)."""
    running = frames.program_frames()  # outermost first: an outer frame's name for an object is the program's
    holders: list[Holder] = []
    tensors: dict[int, Any] = {}  # storage -> a weak reference to a tensor held over it
    seen: set[int] = set()
    queue: collections.deque = collections.deque()

    def reach(value: Any, anchor: Any, steps: tuple, label: str, root: str | None, name: str | None,
              owner: type | None, mutable: bool) -> None:
        if isinstance(value, torch.Tensor):
            sid = _storage(value)
            if sid is not None and sid in storages:
                holders.append(Holder(root or label, anchor, steps, sid, tuple(value.shape), value.dtype, mutable,
                                      name, owner))
                if sid not in tensors:
                    try:
                        tensors[sid] = weakref.ref(value)
                    except TypeError:
                        pass
            return
        if id(value) in seen or len(seen) >= MAX_OBJECTS:
            return
        try:
            how = _walkable(value)
        except Exception:  # a type whose module or attributes cannot be read plainly
            how = None
        if how is None:
            return
        seen.add(id(value))
        queue.append((value, how, *_anchor(value, anchor, steps), label))

    globals_seen: set[int] = set()
    roots: list[tuple[Any, str, Any, tuple, str | None]] = []
    for frame in running:
        code = frame.f_code
        if code.co_name != "<module>":
            for n, v in frame.f_locals.items():
                label = type(v).__name__.lower() if n == "self" else n
                roots.append((v, label, frame, (("local", n),), f"local {n} of {code.co_name}()"))
    for frame in running:
        g = frame.f_globals
        if id(g) in globals_seen:
            continue
        globals_seen.add(id(g))
        module = g.get("__name__", "?")
        for n, v in list(g.items()):
            if not n.startswith("__"):
                roots.append((v, n, g, (("item", n),), f"global {n} of module {module}"))
    for value, label, anchor, steps, root in roots:
        reach(value, anchor, steps, label, root, steps[0][1], None, True)

    while queue:
        value, how, anchor, steps, label = queue.popleft()
        try:
            _walk(value, how, anchor, steps, label, reach)
        except Exception:  # an object whose attributes or items cannot be read plainly: not walked further
            continue
    return Holders(holders, running, [(sid, ref, _version(ref()) or 0) for sid, ref in tensors.items() if ref() is not None])


def _walk(value: Any, how: str, anchor: Any, steps: tuple, label: str, reach: Callable) -> None:
    """Reach everything ``value`` holds, as ``_walkable`` said to walk it."""
    if how == "items":
        items = value.items() if isinstance(value, dict) else enumerate(value)
        mutable = not isinstance(value, tuple)
        for k, v in list(itertools.islice(items, MAX_ITEMS)):
            reach(v, anchor, steps + (("item", k),), f"{label}[{k!r}]", None, None, None, mutable)
    elif how == "attrs":
        module = isinstance(value, torch.nn.Module)
        for k, v in list(vars(value).items()):
            if not module or not k.startswith("_"):
                reach(v, anchor, steps + (("attr", k),), f"{label}.{k}", None, k, type(value), True)
            elif k in _MODULE_SLOTS and isinstance(v, dict):  # parameters, buffers, submodules: as attributes
                for name, child in list(itertools.islice(v.items(), MAX_ITEMS)):
                    reach(child, anchor, steps + (("attr", k), ("item", name)), f"{label}.{name}", None, str(name),
                          type(value), True)
    else:  # a closure's cells
        names = value.__code__.co_freevars
        for i, cell in enumerate(value.__closure__):
            try:
                v = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            reach(v, anchor, steps + (("cell", i),), names[i], f"closure variable {names[i]} of {value.__qualname__}()",
                  names[i], None, True)


# ------------------------------------------------------------ the re-binding line

_assignments: dict[Any, tuple[tuple[tuple[int, str], ...], tuple[tuple[int, str], ...]]] = {}


def _assigned_names(code: Any) -> tuple[tuple[int, str], ...]:
    """``(line, name)`` of every assignment in ``code``'s function: ``x = ...`` gives
    ``x``, ``a.b.x = ...`` gives ``x``; read once per code object."""
    return _statements(code)[0]


def _filled_names(code: Any) -> tuple[tuple[int, str], ...]:
    """``(line, name)`` of every statement in ``code``'s function that puts a value into
    a container: ``x.append(v)`` (``extend``, ``insert``, ``add``, ``update``,
    ``setdefault``) and ``x[k] = v`` give ``x``, ``self.cache.append(v)`` gives ``cache``."""
    return _statements(code)[1]


_FILLING = frozenset({"append", "extend", "insert", "add", "update", "setdefault"})


def _named(node: ast.AST) -> str | None:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None


def _statements(code: Any) -> tuple[tuple[tuple[int, str], ...], tuple[tuple[int, str], ...]]:
    """The assignments and the container fillings of ``code``'s function (read once)."""
    found = _assignments.get(code)
    if found is not None:
        return found
    out: list[tuple[int, str]] = []
    filled: list[tuple[int, str]] = []
    try:
        if code.co_name == "<module>":  # getsourcelines gives a module's first statement only
            lines, start = linecache.getlines(code.co_filename), 1
        else:
            lines, start = inspect.getsourcelines(code)
        tree = ast.parse(textwrap.dedent("".join(lines)))
    except (OSError, TypeError, SyntaxError, IndentationError):
        tree, start = None, 0
    if tree is not None:
        offset = max(start, 1) - 1
        top = tree.body[0] if tree.body and isinstance(tree.body[0], (ast.FunctionDef, ast.AsyncFunctionDef)) else tree
        for node in _own_nodes(top if code.co_name != "<module>" else tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _FILLING:
                name = _named(node.func.value)
                if name is not None:
                    filled.append((offset + node.lineno, name))
            if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store):
                name = _named(node.value)
                if name is not None:
                    filled.append((offset + node.lineno, name))
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            else:
                continue
            for target in targets:
                for t in ast.walk(target):
                    if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Store):
                        out.append((offset + t.lineno, t.id))
                    elif isinstance(t, ast.Attribute) and isinstance(t.ctx, ast.Store):
                        out.append((offset + t.lineno, t.attr))
    found = _assignments[code] = (tuple(sorted(out)), tuple(sorted(filled)))
    return found


def _own_nodes(node: ast.AST) -> Iterator[ast.AST]:
    """The nodes of ``node``'s body, not those of the functions and classes it defines."""
    stack = list(ast.iter_child_nodes(node))
    while stack:
        n = stack.pop()
        yield n
        if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            stack.extend(ast.iter_child_nodes(n))


def rebinding_line(holder: Holder) -> Frame | None:
    """The assignment that most likely re-bound ``holder`` (the module docstring), or
    ``None``: a list or dict slot, or no assignment to its name was found."""
    if holder.name is None:
        return None
    for f in reversed(frames.program_frames()):  # the replay's caller outwards
        lines = [line for line, n in _assigned_names(f.f_code) if n == holder.name]
        before = [line for line in lines if line < f.f_lineno]
        if lines:
            return frames.code_frame(f.f_code, before[-1] if before else lines[0])
    if holder.owner is None or not _user_type(holder.owner):
        return None
    candidates = []
    for cls in holder.owner.__mro__:
        if not _user_type(cls) or cls.__module__.startswith("torch."):
            continue
        for attr, fn in vars(cls).items():
            if attr != "__init__" and isinstance(fn, types.FunctionType) and not frames.hidden_code(fn.__code__):
                candidates += [(fn.__code__, line) for line, n in _assigned_names(fn.__code__) if n == holder.name]
    return frames.code_frame(*candidates[0]) if len(candidates) == 1 else None


# ------------------------------------------------- what the captured code stored (CL116)


def _slot_name(h: Holder) -> tuple[str | None, bool]:
    """The name the program stores ``h`` by (``hidden`` of ``model.hidden``, ``cache`` of
    ``cache[0]``), and whether ``h`` is a container's slot."""
    if h.name is not None:
        return h.name, False
    steps = list(h.steps)
    while len(steps) > 1 and steps[-1][0] == "item":
        steps.pop()
    key = steps[-1][1] if steps else None
    if steps and steps[-1][0] == "cell":
        key = h.label.split("[", 1)[0]
    return (key if isinstance(key, str) else None), True


def stored(found: Holders, made: dict[int, tuple[tuple[Any, int], ...]]) -> list[tuple[Holder, Frame]]:
    """The holders (of graph memory, found at capture end) that the captured code filled
    itself, each with the line that did: the assignment to the holder's name, or the
    call that put the tensor in its container, in a function that made the tensor
    (``made``: storage -> ``frames.user_codes()`` at its allocation) and has returned since. A
    holder the code running the capture filled (``static_y = model(static_x)`` in the
    ``with`` block: the program's own handle on the graph's output) is not one, nor
    one whose filling line is in none of those functions."""
    running = {id(f.f_code) for f in frames.program_frames()}
    out = []
    for h in found._holders:
        if not h.mutable or h.steps[:1] and h.steps[0][0] == "local" and len(h.steps) == 1:
            continue
        name, slot = _slot_name(h)
        if name is None:
            continue
        for code, line in made.get(h.storage, ()):
            lines = [n_line for n_line, n in (_filled_names(code) if slot else _assigned_names(code)) if n == name]
            if not lines:
                continue
            if id(code) not in running:
                after = [n_line for n_line in lines if n_line >= line]
                out.append((h, frames.code_frame(code, after[0] if after else lines[0])))
            break
    return out


def emptied(h: Holder) -> str | None:
    """How the program changed ``h`` since the capture filled it: ``"re-bound"`` (it holds
    another object), ``"removed"`` (its container no longer has the slot), or ``None``
    (it still holds the captured tensor, or its owner is gone)."""
    v = h.value()
    if isinstance(v, torch.Tensor) and _storage(v) == h.storage:
        return None
    if v is not _GONE:
        return "re-bound"
    parent = Holder(h.label, h.anchor, h.steps[:-1], h.storage, h.shape, h.dtype, h.mutable, h.name, h.owner)
    return "removed" if h.steps and h.steps[-1][0] == "item" and parent.value() is not _GONE else None


__all__ = ["MAX_ITEMS", "MAX_OBJECTS", "Holder", "Holders", "discover", "emptied", "rebinding_line", "stored"]
