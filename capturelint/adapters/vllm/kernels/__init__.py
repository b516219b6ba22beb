"""CPU references for the kernels vLLM's DeepSeek V4 attention calls, and Triton's
interpreter for the ones vLLM's own runners launch."""
