"""The documentation corpus (wise.doc_corpus: prose, sources, documents; pipelines.real.corpus):
code and doctest lines dropped, prose kept; pins read and a differing install refused in one line
naming the package; whole distributions per split; the same input gives the same documents and
sha256 whatever the worker count; comment blocks kept as prose only, the stdlib read without its test
suites. Fixtures are tiny (a few docstrings, two small distributions, two stdlib files)."""
from __future__ import annotations

import pytest

from wise.doc_corpus.documents import SPLITS, assign_splits, deduplicate, file_documents, sha256_text
from wise.doc_corpus.prose import is_prose, prose_paragraphs
from wise.doc_corpus.sources import (check_installed, comment_blocks_of, docstrings_of, pinned_distributions,
                                     stdlib_files)

# Two small stdlib modules with docstrings and comment blocks: the stdlib part of a build in these tests.
STDLIB_SAMPLE = ("bisect.py", "textwrap.py")


def _stdlib_sample() -> list[tuple[str, str]]:
    return [f for f in stdlib_files() if f[1] in STDLIB_SAMPLE]

NUMPY_STYLE = '''Compute the running mean of a sequence, one value per position of the input.

The mean at a position covers every value up to and including it, so the last entry is
the mean of the whole sequence.

Parameters
----------
values : array_like
    The numbers to average; an empty sequence gives an empty result.
axis : int, optional
    Axis along which the mean is taken when the input has more than one dimension.

Returns
-------
ndarray
    The running means, in the same order as the input values.

See Also
--------
numpy.cumsum : Cumulative sum of the elements along a given axis.

Examples
--------
>>> running_mean([1, 2, 3])
array([1. , 1.5, 2. ])
>>> for x in range(3):
...     print(x)
0

Notes
-----
For long inputs this is computed with a single cumulative sum, which is the reason it
stays linear in the length of the input. A typical call looks like this::

    out = np.cumsum(values) / np.arange(1, len(values) + 1)
    return out

.. code-block:: python

    result = running_mean(data, axis=0)
'''

GOOGLE_STYLE = '''Load a model from a folder on the local disk and move it to the given device.

Args:
    folder (str): The folder that holds the configuration and the weights of the model.
    device: Where the weights are placed once they have been read from the disk.

Returns:
    The model, in evaluation mode and ready to answer the first request it gets.

Example:
    model = load("data/models/x", device="cpu")
'''


def test_cleaning_drops_doctests_code_and_entry_lines_and_keeps_the_prose():
    text = "\n\n".join(prose_paragraphs(NUMPY_STYLE, 6))
    for kept in ("Compute the running mean", "so the last entry is the mean of the whole sequence",
                 "The numbers to average", "Axis along which the mean is taken", "The running means, in the same",
                 "which is the reason it stays linear in the length of the input. A typical call looks like this:"):
        assert kept in text, kept
    for dropped in (">>>", "...", "print(x)", "array([1.", "np.cumsum(values)", "np.arange", "result = running_mean",
                    "values : array_like", "axis : int", "ndarray", "numpy.cumsum", "code-block", "Parameters", "----"):
        assert dropped not in text, dropped
    google = "\n\n".join(prose_paragraphs(GOOGLE_STYLE, 6))
    assert "The folder that holds the configuration" in google and "folder (str)" not in google
    assert "Where the weights are placed" in google and "The model, in evaluation mode" in google
    assert "load(" not in google and "Args" not in google


def test_inline_markup_becomes_its_text_and_code_paragraphs_are_not_prose():
    doc = "Return the :class:`~torch.nn.Module` that ``forward`` calls, as described in `the guide <https://x.y>`_."
    assert prose_paragraphs(doc, 6) == ["Return the Module that forward calls, as described in the guide."]
    doc = "Load it with [`~PreTrainedModel.from_pretrained`] and get back a `list[str]` of the names it read."
    assert prose_paragraphs(doc, 6) == ["Load it with from_pretrained and get back a list[str] of the names it read."]
    assert not is_prose("x = torch.zeros(3, 4); y = x.sum(dim=0) if flag else None", 6)
    assert not is_prose("torch.nn.Module, torch.nn.Linear, torch.nn.Conv2d, torch.nn.ReLU, torch.nn.GELU", 6)
    assert not is_prose("Too short to train on.", 6)
    assert is_prose("The weights are read once and then shared by every worker of the pool.", 6)


def test_docstrings_of_finds_modules_classes_functions_and_guarded_definitions():
    source = b'''"""Module doc."""
class A:
    """Class doc."""
    def f(self):
        """Method doc."""
        def inner():
            """Inner doc."""
if True:
    def g():
        """Guarded doc."""
x = """not a docstring"""
'''
    assert docstrings_of(source) == [("<module>", "Module doc."), ("A", "Class doc."), ("A.f", "Method doc."),
                                     ("A.f.inner", "Inner doc."), ("g", "Guarded doc.")]
    assert docstrings_of(b"def broken(:\n") == []


def test_file_documents_skip_test_suites_and_number_repeated_names(tmp_path):
    pkg = tmp_path / "site-packages" / "pkg"
    (pkg / "tests").mkdir(parents=True)
    body = '"""' + GOOGLE_STYLE.splitlines()[0] + '"""\n'
    (pkg / "mod.py").write_text(f"def f():\n    {body}\ndef f():\n    {body}\n")
    (pkg / "tests" / "test_mod.py").write_text(f"def test_f():\n    {body}\n")
    docs = file_documents(str(pkg / "mod.py"), "pkg", 6)
    assert [d["doc_id"] for d in docs] == ["pkg:pkg/mod.py:f", "pkg:pkg/mod.py:f#2"]
    assert file_documents(str(pkg / "tests" / "test_mod.py"), "pkg", 6) == []


def test_deduplication_keeps_each_paragraph_once():
    one = "A paragraph that two distributions copied from each other word for word."
    docs = [{"doc_id": "a:1", "distribution": "a", "source": "docstring",
             "paragraphs": [one, "Only in a, and long enough."]},
            {"doc_id": "b:1", "distribution": "b", "source": "docstring", "paragraphs": [one.upper()]}]
    kept, dropped = deduplicate(docs, 10)
    assert [d["doc_id"] for d in kept] == ["a:1"] and dropped == {"duplicate_paragraphs": 1, "short_documents": 1}
    assert kept[0]["text"] == one + "\n\nOnly in a, and long enough."


def test_whole_distributions_per_split_and_the_split_follows_the_seed():
    tokens = {f"dist{i}": 1000 * (i + 1) for i in range(30)}
    split = assign_splits(tokens, 0, 0.1, 0.1)
    assert set(split) == set(tokens) and set(split.values()) == set(SPLITS)  # one split per distribution
    total = sum(tokens.values())
    for s, fraction in (("test", 0.1), ("heldout", 0.1)):
        assert sum(t for d, t in tokens.items() if split[d] == s) <= fraction * total
    assert split == assign_splits(dict(reversed(tokens.items())), 0, 0.1, 0.1)
    assert split != assign_splits(tokens, 1, 0.1, 0.1)
    with pytest.raises(ValueError, match=r"leaves \['heldout'\] empty"):
        assign_splits({"big": 100, "small": 1}, 0, 0.001, 0.5)


def _pyproject(tmp_path, deps: list[str]):
    path = tmp_path / "pyproject.toml"
    path.write_text("[project]\nname = 'x'\ndependencies = [" + ", ".join(repr(d) for d in deps) + "]\n")
    return path


def test_pins_are_read_and_a_changed_pin_is_refused_in_one_line(tmp_path):
    from importlib.metadata import version

    numpy = version("numpy")
    pins = pinned_distributions(_pyproject(tmp_path, [f"numpy=={numpy}", "tqdm", "PyYAML>=6", "Markdown==3.11.3"]))
    assert pins == {"markdown": "3.11.3", "numpy": numpy}
    check_installed({"numpy": numpy})
    with pytest.raises(RuntimeError) as err:
        check_installed({"numpy": "0.0.1"})
    msg = str(err.value)
    assert "\n" not in msg and "numpy==0.0.1" in msg and f"{numpy} is installed" in msg
    with pytest.raises(RuntimeError, match=r"^pyproject.toml pins no-such-dist==1.0 but it is not installed"):
        check_installed({"no-such-dist": "1.0"})
    with pytest.raises(ValueError, match="no dependency is pinned exactly"):
        pinned_distributions(_pyproject(tmp_path, ["tqdm"]))


def test_the_same_pins_give_the_same_documents_whatever_the_worker_count():
    from importlib.metadata import version

    from pipelines.real.corpus import build_documents

    pins = {"markdown": version("markdown"), "gguf": version("gguf")}
    one, dists, dropped = build_documents(pins, 1, 6, 200, _stdlib_sample())
    two, _, _ = build_documents(pins, 2, 6, 200, _stdlib_sample())
    assert one == two and {d["distribution"] for d in one} == {"markdown", "gguf", "python"}
    sources = {d["source"] for d in one}
    assert {"docstring", "comment", "stdlib_docstring", "stdlib_comment", "pydoc_topics"} <= sources, sources
    assert any(d["doc_id"] == "python:textwrap.py:#comments" for d in one)
    assert [sha256_text(d["text"]) for d in one] == [sha256_text(d["text"]) for d in two]
    assert len({d["doc_id"] for d in one}) == len(one) and dropped["documents_before_dedup"] >= len(one)
    assert not any(">>>" in d["text"] for d in one)


def test_the_stage_refuses_a_changed_pin_before_writing_anything(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from params_files import default_params
    from pipelines.real.corpus import run_real_corpus

    monkeypatch.chdir(tmp_path)
    pyproject = _pyproject(tmp_path, ["scipy==0.1.0", "numpy==0.0.1"])
    with pytest.raises(RuntimeError) as err:
        run_real_corpus(SimpleNamespace(real_model=default_params().real_model), pyproject)
    assert "\n" not in str(err.value) and str(err.value).startswith("pyproject.toml pins numpy==0.0.1 but ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pyproject.toml"]


def _stand_in_stage(tmp_path, monkeypatch):
    """Stage real_corpus without a model: a word-level stand-in for the SmolLM2 tokenizer (EOS id 1), the pins
    gguf and markdown, a sample of the standard library."""
    from importlib.metadata import version

    from tokenizers import Tokenizer, models, pre_tokenizers

    import pipelines.real.corpus as stage

    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "<eos>": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    monkeypatch.setattr(stage, "tokenizer_file", lambda folder: tmp_path / "tokenizer.json")
    monkeypatch.setattr(stage, "eos_id", lambda path: 1)
    monkeypatch.setattr(stage, "pinned_distributions", lambda path: {n: version(n) for n in ("gguf", "markdown")})
    monkeypatch.setattr(stage, "stdlib_files", _stdlib_sample)


def test_the_stage_writes_whole_distributions_per_split_and_the_same_bytes_twice(tmp_path, monkeypatch):
    """run_real_corpus on two small pins and the language reference, with a word-level stand-in for the
    SmolLM2 tokenizer (so no model is needed): one split per distribution, the manifest adds up, every
    document ends with EOS in its split's array, and a second build writes identical files."""
    import dataclasses
    import json
    from types import SimpleNamespace

    import numpy as np
    import pyarrow.parquet as pq

    import pipelines.real.corpus as stage
    from params_files import default_params

    _stand_in_stage(tmp_path, monkeypatch)
    sizes = dict(heldout_fraction=0.3, test_fraction=0.05)  # gguf (tiny) to test, markdown to held-out
    params = SimpleNamespace(real_model=dataclasses.replace(default_params().real_model, **sizes))
    digests = []
    for build in ("a", "b"):
        (tmp_path / build).mkdir()
        monkeypatch.chdir(tmp_path / build)
        manifest = stage.run_real_corpus(params, tmp_path / "unused.toml")
        rows = pq.read_table("data/real/corpus.parquet").to_pylist()
        splits_of = {}
        for r in rows:
            splits_of.setdefault(r["distribution"], set()).add(r["split"])
        assert splits_of.keys() == {"gguf", "markdown", "python"} and all(len(s) == 1 for s in splits_of.values())
        for split, summary in manifest["splits"].items():
            ids = np.load(f"data/real/tokens_{split}.npy")
            mine = [r for r in rows if r["split"] == split]
            assert ids.dtype == np.uint16 and int((ids == 1).sum()) == len(mine) == summary["documents"]
            assert ids.size == sum(r["tokens"] for r in mine) + len(mine) and ids[-1] == 1
        assert json.loads(open("data/real/corpus_manifest.json").read()) == manifest
        digests.append([sha256_text(open(f"data/real/{f}", "rb").read().hex()) for f in sorted(
            ["corpus.parquet", "corpus_manifest.parquet", "corpus_manifest.json", "tokens_train.npy",
             "tokens_heldout.npy", "tokens_test.npy"])])
    assert digests[0] == digests[1]


COMMENTED = b'''#!/usr/bin/env python
# -*- coding: utf-8 -*-
# Copyright the authors of this package, who release it under the terms of the licence below.
#
# The second paragraph of the header says why the module exists at all in this form.
import os  # a trailing comment after code is never part of a block of prose at all
# noqa: E501
# The cache is read once at import time, so that every worker of the pool sees the same state.
# pylint: disable=unused-import
# It is rebuilt whenever the folder changes, which is checked by the time stamp of the folder.
def f():
    # x = compute(first, second); y = x.sum(axis=0) if flag else None
    return """
    # not a comment: this line is inside a string and so it is not a comment
    """
'''


def test_comment_blocks_skip_pragmas_trailing_comments_and_split_at_bare_lines():
    blocks = comment_blocks_of(COMMENTED)
    assert blocks == [
        "Copyright the authors of this package, who release it under the terms of the licence below.\n\n"
        "The second paragraph of the header says why the module exists at all in this form.",
        "The cache is read once at import time, so that every worker of the pool sees the same state.",
        "It is rebuilt whenever the folder changes, which is checked by the time stamp of the folder.",
        "x = compute(first, second); y = x.sum(axis=0) if flag else None"]
    assert comment_blocks_of(b"def broken(:\n    '''\n") == []
    paragraphs = [p for b in blocks for p in prose_paragraphs(b, 6)]
    assert len(paragraphs) == 4 and paragraphs[1].startswith("The second paragraph")  # blank '#' splits
    assert not any("compute(" in p for p in paragraphs)  # commented-out code is not prose


def test_file_documents_hold_the_comments_after_the_docstrings_and_dedup_spans_both(tmp_path):
    pkg = tmp_path / "site-packages" / "pkg"
    pkg.mkdir(parents=True)
    shared = "The weights are read once and then shared by every worker of the pool."
    header = "# Licensed under the terms of the licence that ships in the folder of this package."
    (pkg / "a.py").write_text(f'{header}\n"""{shared}"""\n# {shared}\n#\n# Unique to a, and long enough to read.\n')
    (pkg / "b.py").write_text(f"{header}\nimport os\n")
    docs = file_documents(str(pkg / "a.py"), "pkg", 6) + file_documents(str(pkg / "b.py"), "pkg", 6)
    assert [(d["doc_id"], d["source"]) for d in docs] == [
        ("pkg:pkg/a.py:<module>", "docstring"), ("pkg:pkg/a.py:#comments", "comment"),
        ("pkg:pkg/b.py:#comments", "comment")]
    kept, dropped = deduplicate(docs, 10)
    assert [d["doc_id"] for d in kept] == ["pkg:pkg/a.py:<module>", "pkg:pkg/a.py:#comments"]
    assert kept[1]["text"].count("Licensed under") == 1 and shared not in kept[1]["text"]
    assert dropped == {"duplicate_paragraphs": 2, "short_documents": 1}
    std = file_documents(str(pkg / "a.py"), "python", 6, "a.py")
    assert [(d["doc_id"], d["source"]) for d in std] == [
        ("python:a.py:<module>", "stdlib_docstring"), ("python:a.py:#comments", "stdlib_comment")]


def test_stdlib_files_leave_out_test_suites_and_site_packages(tmp_path):
    for rel in ("os.py", "json/__init__.py", "test/test_os.py", "idlelib/idle_test/test_x.py", "idlelib/run.py",
                "lib2to3/tests/data/x.py", "site-packages/pkg/mod.py", "json/__pycache__/x.py", "README.txt"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    assert stdlib_files(tmp_path) == [(str(tmp_path / r), r) for r in ("idlelib/run.py", "json/__init__.py", "os.py")]
    real = [rel for _, rel in stdlib_files()]
    assert "textwrap.py" in real and real == sorted(real)
    assert not any(part in ("test", "tests", "idle_test", "site-packages") for r in real for part in r.split("/"))
    with pytest.raises(FileNotFoundError, match="no .py files"):
        stdlib_files(tmp_path / "json" / "__pycache__" / "none")


def test_the_corpus_survey_counts_what_the_stage_writes(tmp_path, monkeypatch):
    """scripts.corpus_survey on the stage's own pins gives each distribution's tokens and split as the
    manifest run_real_corpus writes (same cleaning, dedup, tokenizer and split rule); no model needed."""
    import dataclasses
    from types import SimpleNamespace

    import pipelines.real.corpus as stage
    from params_files import default_params
    from scripts.corpus_survey import survey

    _stand_in_stage(tmp_path, monkeypatch)
    p = dataclasses.replace(default_params().real_model, heldout_fraction=0.3, test_fraction=0.05)
    monkeypatch.chdir(tmp_path)
    manifest = stage.run_real_corpus(SimpleNamespace(real_model=p), tmp_path / "unused.toml")
    tokens, split = survey(["gguf", "markdown"], p, tmp_path / "tokenizer.json")
    written = {d["distribution"]: (d["tokens"], d["split"]) for d in manifest["distributions"]}
    assert {name: (tokens[name], split[name]) for name in tokens} == written
    assert sum(tokens.values()) > 0 and len(set(split.values())) == 3
