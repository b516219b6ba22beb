"""Adapters: everything specific to one engine family.

An adapter turns a user's request into ``capturelint.pipeline.Configuration``\\ s: how
to build and run a configuration, which objects hold its tensors, how to read its
forward context (a probe returning a generic summary and named tensors), how to name
scopes, and an eager twin where it can build one. The check pipeline and the rules
know no engine; a new engine family is one adapter module plus its tests.

- ``bundled``: the bundled DeepSeek V4 engine (``capturelint.engine``), and the
  conventions of capturelint's forward context (``attn_metadata`` dict-or-None,
  ``layers.N`` scopes) that it shares with vLLM.
- ``target``: a user's engine, named on the command line with ``--target``.
"""
