"""vLLM's family (``--engine vllm``): vLLM's own DeepSeek V4 attention, run on a CPU.

- ``plan``: the adapter (``capturelint.adapters.registry.Adapter``): its plan, its
  configurations, running them;
- ``install``: which vLLM runs (the version gate) and the CPU shim that lets it run;
- ``layers``: the compressed layers' caches and metadata;
- ``invariants``: the declared invariants it ships;
- ``runners/``: the step loops: vLLM's own model runners (``real``), their capture
  conditions reproduced (``reproduced``), and the speculative-decoding loops (``spec``);
- ``kernels/``: CPU references for vLLM's kernels, and Triton's interpreter.

Importing this package imports nothing (vLLM takes seconds to import): each room
imports what it needs.
"""
