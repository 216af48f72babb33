"""Training the project's small recurrent-depth backbone on the generated benchmarks.

    from wise.training import TrainConfig
    from wise.training.run import train_checkpoint
    train_checkpoint(TrainConfig(max_steps=2000), out="data/models/wise-small", device="cuda")

- config.py: TrainConfig, the `train:` section of params.yaml, validated;
- batches.py: training batches generated on the fly, deterministic in (seed, batch);
- loop.py: the training loop (`train` writes the checkpoint files into a folder);
- run.py: a checkpoint folder built aside and published only when training succeeded;
- card.py: the model card, generated from the folder's artifacts;
- quality.py: the quality table of quality.json (markdown table, quality bars) the card shows.
Only torch, tokenizers, safetensors, numpy and tqdm are needed (no ray, dvc or duckdb), so the
same code runs on a bare GPU machine.
"""
from wise.training.batches import Batch, batch_budget, make_batch, training_stream
from wise.training.config import TrainConfig
from wise.training.loop import batch_loss, build_model, recurrent_forward, sample_recurrence, train

# run.py, card.py and quality.py are imported by their users (and card.py runs as `python -m`), not here
__all__ = ["Batch", "TrainConfig", "batch_budget", "batch_loss", "build_model",
           "make_batch", "recurrent_forward", "sample_recurrence", "train", "training_stream"]
