"""``python -m capturelint``: the ``capturelint`` program (``capturelint.launch``: the
signal handlers first, then the CLI)."""

from capturelint.launch import entry

if __name__ == "__main__":
    entry()
