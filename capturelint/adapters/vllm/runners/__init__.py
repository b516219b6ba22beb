"""The step loops of a vLLM check: each builds the tiny model, captures its graphs as a
model runner does, and runs the workload's steps (``generate``)."""
