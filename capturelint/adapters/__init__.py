"""Adapters: everything specific to one engine family.

An adapter turns a user's request into ``capturelint.pipeline.Configuration``\\ s: how
to build and run a configuration, which objects hold its tensors, how to read its
forward context (a probe returning a generic summary and named tensors), how to name
scopes, and an eager twin where it can build one. The check pipeline and the rules
know no engine; a new engine family is one adapter module plus its tests.

- ``registry``: the adapters keyed by engine name, the ``Adapter`` interface, and what
  the commands ask of them (the commands import nothing else of this package);
- ``common``: what adapters share (the plan and its resolution, running it,
  capturelint's forward-context conventions); it imports no adapter, and no adapter
  imports another;
- ``bundled/``: the bundled DeepSeek V4 engine (``capturelint.engine``), a package;
- ``vllm/``: vLLM's own attention, ``--engine vllm``, a package (its rooms in its
  ``__init__``);
- ``plain/``: plain PyTorch programs, the user's own code: ``target`` (``--target``, the
  ``targets`` setting) and ``script`` (``capturelint run``), a package.
"""
