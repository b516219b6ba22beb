"""The bundled DeepSeek V4 engine's family (``--engine bundled``, the default).

- ``plan``: the adapter (``capturelint.adapters.registry.Adapter``): its plan, its
  configurations, running them;
- ``invariants``: the declared invariants it ships.
"""
