"""Analysis on top of the engine: answer metrics, paired statistics, scoring of prompts, the logit
lens, and the constructed model's expected outcomes (calibration oracle)."""
