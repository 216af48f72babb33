"""The project's byte-level BPE tokenizer, trained on generated benchmark text.

Special tokens have fixed ids: <bos>=0, <eos>=1, <pad>=2. Encoding adds <bos> in front (the
post-processor does it, as Llama tokenizers do); encode continuations with
`add_special_tokens=False`. Byte-level pre-tokenisation splits before spaces and punctuation,
so tokens(prompt) + tokens(" " + answer) == tokens(prompt + " " + answer): the answer can be
scored by teacher forcing on the same ids the model sees when it generates.

Saved as `tokenizer.json` (Hugging Face format) plus a small `tokenizer_config.json`, so both
`tokenizers.Tokenizer.from_file` and `transformers.AutoTokenizer.from_pretrained(folder)` load it.
Training is deterministic: the same texts give a byte-identical tokenizer.json.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from wise.atomic_files import write_bytes_atomic

SPECIAL_TOKENS = ("<bos>", "<eos>", "<pad>")
BOS_ID, EOS_ID, PAD_ID = 0, 1, 2
DEFAULT_VOCAB_SIZE = 2048


def train_tokenizer(texts: Iterable[str], vocab_size: int = DEFAULT_VOCAB_SIZE,
                    min_frequency: int = 2, split_digits: bool = False) -> Tokenizer:
    """Byte-level BPE over `texts`. No randomness is involved; the seed lives in the corpus.

    split_digits: every digit is its own token (as Llama and GSM8K-era tokenizers do), so "125"
    is 1, 2, 5 instead of whatever merges the corpus made ("12" + "5"); arithmetic then works on
    a fixed 10-symbol alphabet. Splitting happens at digit boundaries only, so the prompt/answer
    concatenation property above still holds."""
    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size must cover the 256 byte tokens and the specials, got {vocab_size}")
    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
                         if split_digits else byte_level)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),  # listed first, so they get ids 0, 1, 2
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte encodable
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", BOS_ID)])
    for token, expected in zip(SPECIAL_TOKENS, (BOS_ID, EOS_ID, PAD_ID)):
        assert tok.token_to_id(token) == expected, (token, tok.token_to_id(token))
    return tok


def _write_atomic(path: Path, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))  # ordinary permissions (mkstemp's are 0600)


def save_tokenizer(tok: Tokenizer, path: str | os.PathLike, max_length: int = 4096) -> Path:
    """Write `tokenizer.json` (and `tokenizer_config.json` beside it). `path` is a folder, or a
    file name ending in .json (then only that file is written). Returns the tokenizer.json path."""
    path = Path(path)
    if path.suffix != ".json":
        path.mkdir(parents=True, exist_ok=True)
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>",
            "add_bos_token": True, "model_max_length": max_length, "clean_up_tokenization_spaces": False,
        }
        _write_atomic(path / "tokenizer_config.json", json.dumps(config, indent=2) + "\n")
        path = path / "tokenizer.json"
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
    _write_atomic(path, tok.to_str(pretty=True))
    return path


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
    """Load from a tokenizer.json file or a folder holding one."""
    path = Path(path)
    return Tokenizer.from_file(str(path / "tokenizer.json" if path.is_dir() else path))
