"""CPU references, in plain torch, for the kernels the DeepSeek V4 attention calls:
the table of them all, registering them, and the error for one not covered.

The references live by kernel family: vLLM's ``_C`` ops (``c_ops``: the q/kv insert
kernels and ``weak_ref_tensor``), FlashMLA's sparse attention (``flashmla``), vLLM's
Triton kernels of the attention (``triton_ops``), the compressed layers' kernels
(``compressed``), over the ``fp8_ds_mla`` layout and math they share (``fp8_ds_mla``)
and the ``torch.library`` plumbing (``library``).

``register_reference_kernels``
    Defines every op of the sliding-window layer's families in its namespace (``_C``,
    ``_flashmla_C``, ``capturelint_vllm``) with vLLM's schemas (written arguments
    annotated ``Tensor(a!)``) where the namespace lacks it; idempotent.

Limits: only these ops; any other ``_C`` op vLLM calls is not covered
(``missing_kernel_error`` words the failure).
"""

from __future__ import annotations

from capturelint.adapters.vllm.kernels import c_ops, flashmla, triton_ops
from capturelint.adapters.vllm.kernels.library import Impls, register_ops

IMPLS: Impls = {**c_ops.IMPLS, **flashmla.IMPLS, **triton_ops.IMPLS}

#: The ops this module has a reference for, as ``namespace::name``.
REFERENCE_KERNELS: tuple[str, ...] = tuple(IMPLS)


def register_reference_kernels() -> tuple[str, ...]:
    """Register every reference in ``REFERENCE_KERNELS`` where its namespace lacks the op.

    Ops vLLM's own libraries already provide are left alone. Idempotent: a second call
    registers nothing new. Returns the qualified names (``namespace::name``) whose op is
    a reference here (the same tuple on every call).
    """
    return register_ops(IMPLS)


def missing_kernel_error(name: str) -> str:
    """One line for an op vLLM calls and this module does not cover; ``name`` is
    ``namespace::op`` or a bare ``_C`` op name."""
    namespace, _, op = name.rpartition("::")
    return (
        f"vLLM calls {namespace or '_C'}.{op}, which capturelint has no CPU reference for; "
        f"references exist for {', '.join(REFERENCE_KERNELS)} "
        "(capturelint/adapters/vllm/kernels/)"
    )


__all__ = ["IMPLS", "REFERENCE_KERNELS", "missing_kernel_error", "register_reference_kernels"]
