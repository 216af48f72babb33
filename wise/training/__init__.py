"""Training the project's small recurrent-depth backbone on the generated benchmarks.

    from wise.training.config import TrainConfig
    from wise.training.run import train_checkpoint
    train_checkpoint(TrainConfig(max_steps=2000), out="data/models/wise-small", device="cuda")

- config.py: TrainConfig, the `train:` section of params.yaml, validated;
- batches.py: training batches generated on the fly, deterministic in (seed, batch);
- loop.py: the training loop (`train` writes the checkpoint files into a folder);
- run.py: a checkpoint folder built aside and published only when training succeeded;
- card.py: the model card, generated from the folder's artifacts;
- quality.py: the quality table of quality.json (markdown table, quality bars) the card shows;
- objective.py, steps.py: the loss, the learning-rate schedule and the one optimisation loop that
  this training and RecurTrace's (wise.looped.train) share.
Only torch, tokenizers, safetensors, numpy and tqdm are needed (no ray, dvc or duckdb), so the
same code runs on a bare GPU machine. This file imports nothing: a user of objective.py or steps.py
(RecurTrace's training) does not load the embedded model's training loop.
"""
