"""A toy engine family for capturelint, of the shape of ``capturelint/adapters/vllm/``:
``plan`` is its adapter, ``options`` declares its options. Installed, its entry point
(``capturelint.adapters``: ``toy = "capturelint_toy"``) adds ``--engine toy``. Its
runners are ``tests/toy_engine.py``'s (on the path of the tests that use it): ``v1``
re-allocates its metadata tensor every step (a captured graph keeps reading the first
one: CL104), ``v2`` refreshes it in place (clean); ``--toy-fixed`` refreshes it in place
under both."""
