"""Plain PyTorch programs, the user's own code: the two adapters that take a program as
its author wrote it rather than an engine family capturelint knows.

- ``target``: a user's engine named by ``--target FILE:FUNCTION`` or the ``targets``
  setting (``capturelint check``), its ``Target`` objects built by the user's function;
- ``script``: a whole program run as ``__main__`` (``capturelint run SCRIPT.py``).

They share nothing but what every adapter shares (``adapters.common``); neither
imports the other.
"""
