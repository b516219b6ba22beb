"""The bundled DeepSeek-V4-shaped model: kernels as ``dsv4`` custom ops, layers, model."""
