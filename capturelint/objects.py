"""What the tracer reads of the Python objects an engine hands it.

Walks over arbitrary engine objects, kept apart from the tracing itself:

- the **names** of tensors reachable from a root (``named_tensors``: parameters and
  buffers of modules, tensor attributes of objects, mapping entries, ``(name, tensor)``
  pairs), which adapters also use to name the tensors of a forward context;
- the **module scopes** a root's modules give the ops that run in them
  (``module_scopes``);
- the **arguments of a break** by path (``break_leaves``), compared between capture and
  replay;
- the **random generators** a shadow may advance, saved before it and restored after
  (``random_states``, ``restore_random_states``), so that the shadow has no side effects;
- how far a replay's **outputs** are from the shadow's (``max_abs_diff``, the numerical
  oracle's figure).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Iterator

import torch


def named_tensors(prefix: str, obj: Any, depth: int = 0, sep: str = ".") -> Iterator[tuple[str, torch.Tensor]]:
    """Tensors reachable from ``obj`` with readable paths, two levels deep."""
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
        return
    if depth > 2 or obj is None or isinstance(obj, (int, float, str, bool)):
        return
    if isinstance(obj, torch.nn.Module):
        for n, p in obj.named_parameters():
            yield f"{prefix}.{n}", p
        for n, b in obj.named_buffers():
            yield f"{prefix}.{n}", b
        return
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from named_tensors(f"{prefix}[{k!r}]", v, depth + 1, sep=".")
        return
    if isinstance(obj, (list, tuple)):
        if obj and all(isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str) for x in obj):
            for n, t in obj:
                yield from named_tensors(n, t, depth + 1)
            return
        for i, v in enumerate(obj):
            yield from named_tensors(f"{prefix}[{i}]", v, depth + 1)
        return
    if dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            yield from named_tensors(f"{prefix}.{f.name}", getattr(obj, f.name), depth + 1)
        return
    attrs = getattr(obj, "__dict__", None)
    if attrs:
        for k, v in attrs.items():
            if not k.startswith("__"):
                yield from named_tensors(f"{prefix}.{k}", v, depth + 1)


def module_scopes(name: str, root: Any) -> Iterator[tuple[str, torch.nn.Module]]:
    """The modules a root holds, with the scope prefix their ops get: a module root
    names its own submodules (``layers.0.attn``); an object root's module attributes
    are named by path (``server.model.0``)."""
    if isinstance(root, torch.nn.Module):
        yield "", root
        return
    attrs = root.items() if isinstance(root, dict) else getattr(root, "__dict__", {}).items()
    for key, value in attrs:
        if isinstance(value, torch.nn.Module):
            yield f"{name}.{key}", value


def break_leaves(named: list[tuple[str, Any]], depth: int = 0) -> Iterator[tuple[str, Any]]:
    """The values handed to a break, by path: tensors and plain scalars inside tuples,
    lists, dicts, NamedTuples, dataclasses and objects with attributes
    (``metadata.slot_mapping``, ``args[1]``). Other objects are not compared."""
    for path, v in named:
        if isinstance(v, torch.Tensor) or isinstance(v, (int, float, bool, str, type(None), torch.dtype, torch.device)):
            yield path, v
        elif depth >= 4 or callable(v) and not dataclasses.is_dataclass(v):
            continue
        elif isinstance(v, dict):
            yield from break_leaves([(f"{path}[{k!r}]", x) for k, x in v.items()], depth + 1)
        elif isinstance(v, tuple) and hasattr(v, "_fields"):
            yield from break_leaves([(f"{path}.{k}", getattr(v, k)) for k in v._fields], depth + 1)
        elif isinstance(v, (list, tuple)):
            yield from break_leaves([(f"{path}[{i}]", x) for i, x in enumerate(v)], depth + 1)
        elif dataclasses.is_dataclass(v):
            yield from break_leaves([(f"{path}.{f.name}", getattr(v, f.name)) for f in dataclasses.fields(v)], depth + 1)
        elif isinstance(v, torch.nn.Module):
            continue  # parameters and buffers are external and compared by the ops that read them
        elif hasattr(v, "__dict__"):
            yield from break_leaves(
                [(f"{path}.{k}", x) for k, x in vars(v).items() if not k.startswith("_")], depth + 1
            )


def random_states(roots: dict[str, Any]) -> list[tuple[Any, Any]]:
    """The state of every random generator a shadow may advance: the CPU default
    generator, the CUDA generators (where CUDA is initialised), and every
    ``torch.Generator`` reachable from the roots."""
    states: list[tuple[Any, Any]] = [(torch.random.default_generator, torch.random.default_generator.get_state())]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i in range(torch.cuda.device_count()):
            gen = torch.cuda.default_generators[i]
            states.append((gen, gen.get_state()))
    seen = {id(torch.random.default_generator)}
    for gen in _generators(roots):
        if id(gen) not in seen:
            seen.add(id(gen))
            states.append((gen, gen.get_state()))
    return states


def restore_random_states(states: list[tuple[Any, Any]]) -> None:
    """Rewinds every generator to its state in ``states`` (``random_states``)."""
    for gen, state in states:
        gen.set_state(state)


def _generators(obj: Any, depth: int = 0, seen: set[int] | None = None) -> Iterator[torch.Generator]:
    seen = set() if seen is None else seen
    if id(obj) in seen or depth > 3 or obj is None or isinstance(obj, (int, float, str, bool, torch.Tensor)):
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Generator):
        yield obj
        return
    if isinstance(obj, dict):
        values: Iterable[Any] = obj.values()
    elif isinstance(obj, (list, tuple)):
        values = obj
    elif isinstance(obj, torch.nn.Module):
        values = [v for k, v in vars(obj).items() if not k.startswith("_")] + list(obj.children())
    else:
        values = [v for k, v in getattr(obj, "__dict__", {}).items() if not k.startswith("__")]
    for v in values:
        yield from _generators(v, depth + 1, seen)


def max_abs_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    """The largest absolute difference between two lists of outputs, element by
    element; infinite when their lengths or shapes differ or a difference is NaN."""
    if len(a) != len(b):
        return float("inf")
    worst = 0.0
    for x, y in zip(a, b):
        if x.shape != y.shape:
            return float("inf")
        if x.numel():
            d = (x.detach().double() - y.double()).abs().max()
            worst = max(worst, float("inf") if torch.isnan(d) else float(d))
    return worst
