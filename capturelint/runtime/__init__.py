"""Capture runtimes and the protocol the checker observes them through.

- ``protocol``: the vocabulary (segments, phases, break calls, graph descriptions,
  observers, host-sync events, frames); all the checker may know of a runtime.
- ``schema``: the one op-schema reader (writes, fresh allocations, replay kind), and
  ``frames``: the one frame walker (engine and model lines, not machinery); shared by
  the tracer and the emulated primitive.
- ``emulated``: ``torch.cuda.CUDAGraph`` and friends on a CPU, with a GPU's capture
  semantics; ``emulate_cuda()`` installs them in ``torch.cuda``, with
- ``device``: the CUDA device emulated on the CPU (device arguments naming ``cuda``
  mean the CPU; ``torch.cuda``'s device, memory and random-number queries answer).
- ``breakable``: capturelint's breakable runtime (eager breaks between captured
  segments, a wrapper keyed by batch descriptor), built on the primitive.
- ``forward_context``: the forward context the breakable runtime's wrapper reads.
"""
