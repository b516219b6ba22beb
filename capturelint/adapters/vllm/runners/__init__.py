"""The step loops of a vLLM check, one per kind of model runner: each builds the tiny
model (``model.build_model``) for a ``workload.RunSpec``, captures its graphs as a model
runner does, and runs the workload's steps.

A step loop is a class ``Loop(spec, graphs=True)`` whose instances offer ``capture()``
(the graphs only), ``generate()`` (capture, then every step: the logits compared with
the eager twin's, which is the same loop with ``graphs=False``), ``roots()`` (the objects
that hold its tensors, by name) and ``model``:

- ``real.VllmRunnerLoop``: vLLM's own ``GPUModelRunner`` (V1 or V2) drives the model;
- ``reproduced.ReproducedLoop``: the model runners' capture conditions, reproduced;
- ``spec.MTPLoop``, ``spec.DSparkLoop``: speculative decoding's verify and draft steps.

"Runner" is kept for the model runners themselves (``capturelint.options.Runner`` names
which one; ``VllmRunnerLoop.runner`` is vLLM's).
"""
