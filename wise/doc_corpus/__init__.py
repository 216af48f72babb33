"""The documentation corpus: running English prose from the docstrings of the distributions pinned in
pyproject.toml and from CPython's language reference (stage real_corpus, pipelines.real.corpus).

- ``sources``: the pins, the installed set checked against them, each distribution's files and
  license, the docstrings of a file (``ast``), the language reference's topics;
- ``prose``: a docstring reduced to its running prose (code, doctests and reference lists dropped);
- ``documents``: documents with stable ids, deduplication, the split by distribution.
"""
