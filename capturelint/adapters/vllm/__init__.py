"""vLLM's family (``--engine vllm``): vLLM's own DeepSeek V4 attention, run on a CPU.

Rooms, by job:

- ``plan``: the adapter (``capturelint.adapters.registry.Adapter``): its plan, its
  configurations, running them;
- ``install``: which vLLM runs (the version gate) and the CPU shim that lets it run
  (``cpu_shim``: the emulated device, the reference kernels, the patches);
- ``bridge``: vLLM's breakable runtime announcing what it does (``RuntimeBridge``, one
  method per hook);
- ``model``: the tiny DeepSeek V4 around vLLM's attention, and its ``VllmConfig``;
- ``workload``: the serving workload (requests joining and leaving) and ``RunSpec``, one
  configuration;
- ``layers``: the compressed layers' caches and metadata;
- ``invariants``: the declared invariants it ships;
- ``archs``: the architectures ``--model`` knows, checked or not, and the table;
  ``families``: the families run whole on vLLM's own runners, one module each
  (``generic``: vLLM's ``Attention``);
- ``runners/``: the step loops, one per kind of model runner: vLLM's own
  (``real.VllmRunnerLoop``), their capture conditions reproduced
  (``reproduced.ReproducedLoop``), speculative decoding (``spec.MTPLoop``,
  ``spec.DSparkLoop``);
- ``kernels/``: CPU references for vLLM's kernels, by kernel family (``c_ops``,
  ``flashmla``, ``triton_ops``, ``compressed``, over ``fp8_ds_mla`` and ``library``;
  ``reference`` registers them), and Triton's interpreter (``interpreter``).

Importing this package imports nothing (vLLM takes seconds to import): each room
imports what it needs.
"""
