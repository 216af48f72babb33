"""A model's files: fingerprint.py (sha256 of weight files and folders, the ids runs record) and
packaged_gguf.py (pretrained models that a pip package ships as GGUF, converted to a Hugging Face
folder). Standard library only at import (transformers inside the conversion), so the light floors
(params, run spec) can record weight ids."""
