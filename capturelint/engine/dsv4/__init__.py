"""The bundled DeepSeek-V4-shaped model: kernels as ``dsv4`` custom ops, layers, model.

``ops`` registers the torch reference kernels (``torch.ops.dsv4.*``, docs/kernels.md);
``triton_kernels`` registers the Triton ones and is imported only when selected;
``attention`` holds the attention with its eager regions, compressor and indexer;
``moe`` the capturable mixture of experts; ``model`` the decoder and its weights.
"""
