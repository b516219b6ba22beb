"""The one reader of op schemas: what a dispatcher call does to its arguments.

The tracer and the emulated primitive need the same few facts about every op overload
they see, all from its schema (``func._schema``), read once per overload (``op_info``):

- the argument layout by position and name, and which list arguments may hold tensors;
- which arguments the op **writes**: ``alias_info.is_write``, which covers in-place
  ops, ``out=`` tensors and custom ops' mutated arguments. The emulated capture undoes
  these writes at capture end; the tracer's shadow copies a storage before its first;
- which returns are **fresh** allocations (no alias info) rather than views of, or the
  very tensors of, the arguments;
- how a recorded call is **replayed** (``ReplayKind``);
- whether the op is **transparent**: ``aten::detach`` and the ops registered with
  ``protocol.register_transparent_op``, aliases with no kernel that stacked dispatch
  modes and runtimes add at capture only (registered at import, before any op runs);
- whether it **reads values** of its tensor arguments: views and aliases do not, nor
  do factories that take only a tensor's size, dtype and device (``empty_like``,
  ``new_zeros``). The tracer's watch over graph memory (rules CL109, CL110) counts the
  others as reads;
- whether it **decomposes**: a ``CompositeImplicitAutograd`` op (``aten.to.dtype``,
  ``reshape``, ``contiguous``, ``linear``) reaches a dispatch mode only where autograd
  is off, under ``torch.inference_mode()`` (where vLLM captures and runs its graphs).
  Its schema states what it *may* alias (``to`` returns ``self`` when nothing changes,
  a fresh tensor otherwise), so read as an alias its fresh result would be neither
  refreshed on replay nor counted as a read. A mode hands such a call to its
  decomposition (``func.decompose``, with the mode re-entered), whose ops are the ones
  it sees with autograd on.
"""

from __future__ import annotations

import enum
from typing import Any, Iterator

import torch

from capturelint.runtime import protocol


class ReplayKind(enum.Enum):
    """How a graph replays a recorded call."""

    SKIP = "skip"  # views and allocations: their outputs alias recorded storages
    REISSUE = "reissue"  # in-place and out= ops: re-run on the recorded tensors
    COPY_OUT = "copy_out"  # functional ops: re-run, copy results into recorded outputs


_ALLOC_OPS = {"aten::empty", "aten::empty_strided", "aten::empty_like", "aten::new_empty", "aten::new_empty_strided"}
# Ops that take a tensor for its size, dtype and device only, never its values.
_METADATA_OPS = _ALLOC_OPS | {
    "aten::zeros_like", "aten::ones_like", "aten::full_like", "aten::rand_like", "aten::randn_like",
    "aten::randint_like", "aten::new_zeros", "aten::new_ones", "aten::new_full",
}


class OpInfo:
    """What one op overload's schema says, computed once.

    ``name``: the overload as records name it (``aten.mul.Tensor``). ``args``: every
    argument as ``(position, name, kwarg_only, written)``. ``list_args``: the names of
    arguments typed as lists that may hold tensors. ``writes``: the written arguments as
    ``(position, name, kwarg_only)``. ``fresh``: per schema return, whether it is a fresh
    allocation. ``allocates``: ``fresh`` for ops whose fresh returns are new storages
    (empty for views and for ops that write an argument). ``replay``: the
    ``ReplayKind``. ``transparent``: see the module docstring. ``aliases``: its returns
    are views of (or the very tensors of) its arguments, and it writes none.
    ``reads_values``: it reads the values of its tensor arguments that it does not
    write (false for aliases and size-only factories). ``decomposes``: it has a
    ``CompositeImplicitAutograd`` kernel (see the module docstring).
    """

    __slots__ = ("name", "args", "list_args", "writes", "fresh", "allocates", "replay", "transparent", "aliases",
                 "reads_values", "decomposes", "wraps")

    def __init__(self, func: Any):
        schema = func._schema
        self.name = str(func)
        self.args = tuple(
            (pos, a.name, a.kwarg_only, a.alias_info is not None and a.alias_info.is_write)
            for pos, a in enumerate(schema.arguments)
        )
        self.list_args = frozenset(a.name for a in schema.arguments if _may_hold_tensors(str(a.type)))
        self.writes = tuple((pos, name, kwarg_only) for pos, name, kwarg_only, write in self.args if write)
        self.fresh = tuple(r.alias_info is None for r in schema.returns)
        self.allocates = self.fresh if any(self.fresh) and not self.writes else ()
        if schema.name in _ALLOC_OPS:
            self.replay = ReplayKind.SKIP
        elif self.writes:
            self.replay = ReplayKind.COPY_OUT if any(self.fresh) else ReplayKind.REISSUE
        elif schema.returns and not any(self.fresh):
            self.replay = ReplayKind.SKIP
        else:
            self.replay = ReplayKind.COPY_OUT
        self.transparent = protocol.is_transparent_op(func.name())
        self.aliases = self.transparent or (not self.writes and bool(schema.returns) and not any(self.fresh))
        self.reads_values = not self.aliases and schema.name not in _METADATA_OPS
        self.decomposes = torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd")
        self.wraps = protocol.wrapper_op(func.name())  # None, or whether it holds a break (protocol.register_wrapper_op)

    def records_through(self, breaks_eager: bool) -> bool:
        """Whether a capture records the ops this op's implementation runs rather than
        the op (``protocol.register_wrapper_op``), in a graph whose breaks are eager or not."""
        return self.wraps is not None and not (self.wraps and breaks_eager)

    def written(self, args: tuple, kwargs: dict) -> Iterator[torch.Tensor]:
        """The tensors the call ``func(*args, **kwargs)`` writes."""
        for pos, name, kwarg_only in self.writes:
            value = kwargs.get(name) if kwarg_only or pos >= len(args) else args[pos]
            for t in value if isinstance(value, (list, tuple)) else (value,):
                if isinstance(t, torch.Tensor):
                    yield t

    def fresh_outputs(self, out: Any) -> list[torch.Tensor]:
        """The freshly allocated tensors among the call's returns ``out``, in order. A
        ``Tensor[]`` return is one schema return whose elements are all fresh or all not."""
        returns = out if len(self.fresh) > 1 else (out,)
        tensors: list[torch.Tensor] = []
        for value, is_fresh in zip(returns, self.fresh):
            if is_fresh:
                items = value if isinstance(value, (tuple, list)) else (value,)
                tensors.extend(t for t in items if isinstance(t, torch.Tensor))
        return tensors


def _may_hold_tensors(kind: str) -> bool:
    return "Tensor" in kind and (kind.startswith("List[") or kind.endswith("[]"))


_infos: dict[Any, OpInfo] = {}


def op_info(func: Any) -> OpInfo:
    """The ``OpInfo`` of op overload ``func``, read once."""
    info = _infos.get(func)
    if info is None:
        info = _infos[func] = OpInfo(func)
    return info


def call_through(mode: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    """Run op ``func``'s backend kernel (its Python implementation) with dispatch mode
    ``mode`` back on its stack, so that the mode sees the ops the kernel runs instead
    of the op (``OpInfo.wraps``)."""
    first = next(t for t in protocol.flatten_tensors((args, kwargs)))
    keys = torch._C._after_ADInplaceOrView_keyset & torch._C._dispatch_keys(first)
    keys = keys.remove(torch._C.DispatchKey.Python).remove(torch._C.DispatchKey.PythonTLSSnapshot)
    with mode:
        return func.redispatch(keys, *args, **kwargs)
