"""``python -m capturelint``: the ``capturelint`` program."""

from capturelint.cli import entry

if __name__ == "__main__":
    entry()
