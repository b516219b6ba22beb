"""Naming for the tracer: the tensors its roots hold, and the module scope an op runs in.

``roots`` name external tensors: an ``nn.Module`` contributes its parameters and
buffers, a mapping or an object its tensor attributes (two levels deep), a ``(name,
tensor)`` iterable its pairs (``objects.named_tensors``). The names the roots give when
tracing begins are static; roots are walked again at each capture and each shadowed
step (``root_names``), so a tensor the engine allocates later is named by the attribute
that holds it then. Module forward hooks keep the stack of scopes (a module's name under
its root, or its class under the enclosing scope) that an op's record carries.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.modules.module as module_hooks

from capturelint.objects import module_scopes, named_tensors
from capturelint.records import StorageId, Stream


class Naming:
    """The roots' tensor names and the module scope stack; ``install`` at the start of
    tracing, ``remove`` at its end."""

    def __init__(self, roots: dict[str, Any]):
        self.roots = roots
        self.static_names: dict[StorageId, tuple[str, ...]] = {}
        self.scope_stack: list[str] = []
        self._static_alive: list[Any] = []
        self._module_names: dict[int, str] = {}
        self._hooks: list[Any] = []

    def install(self) -> None:
        """Name what the roots hold now, and follow module scopes from here on."""
        self._index_roots()
        self._hooks = [
            module_hooks.register_module_forward_pre_hook(self._pre_hook),
            module_hooks.register_module_forward_hook(self._post_hook),
        ]

    def remove(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def _index_roots(self) -> None:
        names: dict[StorageId, list[str]] = {}
        for root_name, root in self.roots.items():
            for name, t in named_tensors(root_name, root):
                st = t.untyped_storage()
                self._static_alive.append(st)
                names.setdefault(st._cdata, []).append(name)
            for prefix, module in module_scopes(root_name, root):
                for name, m in module.named_modules():
                    self._module_names.setdefault(id(m), f"{prefix}.{name}" if name and prefix else name or prefix)
        self.static_names = {sid: tuple(v) for sid, v in names.items()}

    def root_names(self, stream: Stream) -> dict[StorageId, list[str]]:
        """Names of the tensors the roots hold now that they did not hold when tracing
        began (a runner's per-step buffer, a module's buffer replaced after capture)."""
        names: dict[StorageId, list[str]] = {}
        for root_name, root in self.roots.items():
            for name, t in named_tensors(root_name, root):
                st = t.untyped_storage()
                sid = st._cdata
                if name in self.static_names.get(sid, ()):
                    continue
                stream._alive.append(st)
                names.setdefault(sid, []).append(name)
        return names

    def _pre_hook(self, module: torch.nn.Module, args: Any) -> None:
        name = self._module_names.get(id(module))
        if name is None:
            name = (self.scope_stack[-1] + "." if self.scope_stack else "") + type(module).__name__
        self.scope_stack.append(name)

    def _post_hook(self, module: torch.nn.Module, args: Any, out: Any) -> None:
        if self.scope_stack:
            self.scope_stack.pop()

    @property
    def scope(self) -> str:
        """The innermost module scope running now ("" outside every module)."""
        return self.scope_stack[-1] if self.scope_stack else ""
