"""The generation engine: supports and conditions, routing, the recurrence runner with its mechanism
observer, and decoding (prompt caches, appended rows, CUDA-graph replay)."""
