"""The weight dtypes a params file or a command line may name, and the torch dtype each means (one
map for every model family and entry point)."""
from __future__ import annotations

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
