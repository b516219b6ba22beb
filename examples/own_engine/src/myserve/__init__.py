"""myserve: a tiny serving engine that replays its model's forward from a CUDA graph."""

from myserve.model import TinyModel
from myserve.runner import GraphRunner

__all__ = ["GraphRunner", "TinyModel"]
