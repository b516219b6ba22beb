"""The references' ``torch.library`` plumbing: each kernel module keeps a table of its
ops (qualified name ``namespace::name`` -> ``(schema, reference, fake)``), and
``register_ops`` defines them where their namespace lacks them, idempotently, sharing one
``torch.library`` fragment per namespace.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

OWN_NAMESPACE = "capturelint_vllm"  # the ops that stand for vLLM's Triton kernels

Impls = dict[str, tuple[str, Callable[..., Any], Callable[..., Any]]]  # qualified name -> (schema, reference, fake)

_libraries: dict[str, torch.library.Library] = {}
_registered: list[str] = []


def register(qualified: str, impls: Impls) -> None:
    """Define ``qualified`` (``namespace::name``) with its reference from ``impls``
    unless the namespace already has an op of that name (vLLM's own, or one registered
    here by an earlier call)."""
    if qualified in _registered:
        return
    namespace, name = qualified.split("::")
    if hasattr(getattr(torch.ops, namespace), name):
        return
    library = _libraries.get(namespace)
    if library is None:
        library = _libraries[namespace] = torch.library.Library(namespace, "FRAGMENT")
    schema, impl, fake = impls[qualified]
    library.define(name + schema)
    # Plain torch: the same code runs on whatever device the tensors are on.
    library.impl(name, impl, "CompositeExplicitAutograd")
    torch.library.register_fake(qualified, fake, lib=library)
    _registered.append(qualified)


def register_ops(impls: Impls) -> tuple[str, ...]:
    """Register the references of ``impls`` where their namespace lacks the op,
    idempotently. Returns the names whose op is a reference here, in registration order."""
    for qualified in impls:
        register(qualified, impls)
    return tuple(q for q in _registered if q in impls)


def own_op(name: str, impls: Impls) -> Any:
    """``torch.ops.capturelint_vllm.<name>``, registered from ``impls`` on first use."""
    register(f"{OWN_NAMESPACE}::{name}", impls)
    return getattr(getattr(torch.ops, OWN_NAMESPACE), name)


def no_result_fake(*args: Any, **kwargs: Any) -> None:
    """The fake of an op that only writes its arguments."""
    return None


__all__ = ["Impls", "OWN_NAMESPACE", "no_result_fake", "own_op", "register", "register_ops"]
