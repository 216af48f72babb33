"""Measurements of the block-sparse kernel (kernels/): timing against dense SDPA and
FlexAttention, the config sweep, the offline compile report, the tail simulator. See README.md.

Kept out of kernels/ so that the kernel package holds the product only; these tools import the
kernel, never the other way round. Each module runs as `python -m benchmarks.<name>`.
"""
