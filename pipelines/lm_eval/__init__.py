"""The engine under EleutherAI's lm-evaluation-harness: model.py registers the ``wise`` model (the
``wise-lm-eval`` command line), pairs.py pairs two runs' samples (bootstrap, McNemar)."""
