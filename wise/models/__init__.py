"""Recurrent-depth backbones: one architecture, configured per checkpoint family."""
from wise.models.checkpoint import load_checkpoint, save_checkpoint
from wise.models.config import PRESETS, RecurrentConfig
from wise.models.recurrent import RecurrentDepthModel, causal_attention, init_weights

__all__ = ["PRESETS", "RecurrentConfig", "RecurrentDepthModel", "causal_attention", "init_weights",
           "load_checkpoint", "save_checkpoint"]
