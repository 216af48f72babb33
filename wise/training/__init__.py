"""Training the project's small recurrent-depth backbone on the generated benchmarks.

    from wise.training import TrainConfig, train
    train(TrainConfig(max_steps=2000), out="data/models/wise-small", device="cuda")

Only torch, tokenizers, safetensors, numpy and tqdm are needed (no ray, dvc or duckdb), so the
same code runs on a bare GPU machine.
"""
from wise.training.batches import Batch, BatchStream, batch_budget, make_batch
from wise.training.config import TrainConfig
from wise.training.loop import (batch_loss, build_model, recurrent_forward, sample_recurrence,
                                train)

__all__ = ["Batch", "BatchStream", "TrainConfig", "batch_budget", "batch_loss", "build_model",
           "make_batch", "recurrent_forward", "sample_recurrence", "train"]
