"""capturelint: checks that CUDA-graph replay computes what eager execution computes."""

__version__ = "0.1.0"
