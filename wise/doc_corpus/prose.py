"""The running prose of a docstring (or of a plain-text manual page): what is worth training a
language model on once code, doctests and reference boilerplate are gone.

Docstrings in the wild mix three conventions (numpydoc sections under underlined headings, Google
``Args:`` blocks, Sphinx ``:param x:`` fields) with reStructuredText markup. ``prose_paragraphs``
walks the lines once and
- drops doctest lines (``>>>`` / ``...``) and the output lines that follow them, fenced code
  (```` ``` ````), literal blocks (the indented block after a line ending in ``::``), and directives
  whose body is code, maths or a table (``.. code-block::``, ``.. math::``, ``.. plot::`` ...);
- drops the sections that are lists of names or citations (Examples, See Also, References,
  Methods ...); in parameter-like sections (Parameters, Returns, Raises, Attributes ...) drops the
  ``name : type`` entry lines and keeps the descriptions under them, each its own paragraph;
- turns inline markup into its text (``:class:`~a.B``` -> ``B``, ````x```` -> ``x``, links -> their
  text);
then keeps a paragraph only if it reads as prose (``is_prose``: enough words, mostly letters, few
identifier-like tokens, and English function words in it), so a code line that slipped through
the structural rules is still dropped.
"""
from __future__ import annotations

import re

DOCTEST = re.compile(r"^\s*(>>>|\.\.\.)(\s|$)")
FENCE = re.compile(r"^\s*(```|~~~)")
DIRECTIVE = re.compile(r"^\s*\.\.\s+([\w:-]+)::\s*(.*)$")
RST_COMMENT = re.compile(r"^\s*\.\.(\s|$)")  # targets (.. _x:), citations (.. [1]), comments
UNDERLINE = re.compile(r"^\s*([-=~^*+#])\1{2,}\s*$")
GOOGLE_HEADING = re.compile(r"^\s*([A-Z][A-Za-z ]{1,30}):\s*$")
FIELD = re.compile(r"^\s*:(param|parameter|arg|argument|key|keyword|type|rtype|returns?|yields?|raises?|"
                   r"except|exception|var|ivar|cvar|vartype|meta)\b[^:]*:\s*(.*)$")
ENTRY = re.compile(r"^\s*\*{0,2}[\w.\[\], |]+(\s*\([^)]*\))?\s*:\s+(\S.*)$")  # Google "x (int): text"
# "name (type): text" / "name (type):" anywhere (transformers documents outputs and configs so,
# often without an Args heading): the entry's name and type are dropped, its description kept
TYPED_ENTRY = re.compile(r"^\s*\*{0,2}[A-Za-z_][\w.]*\*{0,2}\s*\((?:[^()]|\([^()]*\))*\)\s*:\s*(.*)$")
BULLET = re.compile(r"^\s*([-*+\u2022]|\d+[.)]|\(\w\)|#\.)\s+")
ROLE = re.compile(r":[\w:+.-]+:`([^`]*)`")
LINK = re.compile(r"`([^`<]+?)\s*<[^>]*>`_{1,2}")
LITERAL = re.compile(r"``([^`]+)``")
INTERPRETED = re.compile(r"`([^`]+)`_{0,2}")
MARKDOWN_LINK = re.compile(r"\[([^\]]+)\]\((?:https?://|#|\.)[^)]*\)")
# transformers' [`~a.B`] once the backticks are gone (not list[str], not a markdown link)
CROSS_REF = re.compile(r"(?<![\w\]])\[(~?)([\w.]+)\](?!\()")
EMPHASIS = re.compile(r"(?<![\w*])\*\*?([^*\s][^*]*?)\*\*?(?![\w*])")

# Headings whose section is a list of names, citations or code, not prose.
DROP_SECTIONS = frozenset({
    "example", "examples", "example usage", "usage", "see also", "references", "reference", "methods",
    "todo", "citation", "citations", "shape", "shapes", "signature", "code", "doctest", "doctests"})
# Headings whose entries are ``name : type`` lines followed by an indented description.
FIELD_SECTIONS = frozenset({
    "parameters", "parameter", "params", "param", "args", "arguments", "argument", "keyword args",
    "keyword arguments", "kwargs", "other parameters", "returns", "return", "yields", "yield", "raises",
    "raise", "warns", "receives", "attributes", "attribute", "properties", "inputs", "outputs",
    "type parameters", "class attributes", "instance attributes", "fields"})
# Directives whose body is prose (kept); every other directive's body is dropped.
PROSE_DIRECTIVES = frozenset({
    "note", "warning", "tip", "important", "attention", "caution", "danger", "hint", "admonition",
    "deprecated", "versionadded", "versionchanged", "versionremoved", "topic", "sidebar", "rubric", "hlist"})
# The commonest English function words: running prose has many, code and name lists almost none.
FUNCTION_WORDS = frozenset(
    "the a an of to in is are be it this that for on with as by or and if not can will which when from "
    "at its these those has have was were should may must would been than then there their only also "
    "each any all but so such into used use does do".split())


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _inline(text: str) -> str:
    """reStructuredText inline markup -> the text a reader sees."""
    def role(m: re.Match) -> str:
        inner = m.group(1)
        label = re.match(r"(.*?)\s*<[^>]*>$", inner)
        if label and label.group(1):
            return label.group(1)
        return inner.rsplit(".", 1)[-1] if inner.startswith("~") else inner.lstrip("!")

    text = ROLE.sub(role, text)
    text = LINK.sub(r"\1", text)
    text = LITERAL.sub(r"\1", text)
    text = INTERPRETED.sub(r"\1", text)
    text = MARKDOWN_LINK.sub(r"\1", text)
    text = CROSS_REF.sub(lambda m: m.group(2).rsplit(".", 1)[-1] if m.group(1) else m.group(2), text)
    text = EMPHASIS.sub(r"\1", text)
    return re.sub(r"\s+", " ", text).strip()


def _heading(lines: list[str], i: int) -> str | None:
    """The lowercase title when line i is a heading (numpydoc: a title over an underline; Google: a
    short capitalised line ending in a colon), else None."""
    line = lines[i]
    if line.strip() and i + 1 < len(lines) and UNDERLINE.match(lines[i + 1]) and not UNDERLINE.match(line):
        return line.strip().lower().rstrip(":")
    m = GOOGLE_HEADING.match(line)
    if m:
        title = m.group(1).strip().lower()
        if title in DROP_SECTIONS or title in FIELD_SECTIONS or title in PROSE_DIRECTIVES or title == "notes":
            return title
    return None


def _skip_indented(lines: list[str], i: int, base: int) -> int:
    """Index of the first line after the block that starts at i and is indented deeper than `base`
    (blank lines inside the block belong to it)."""
    while i < len(lines) and (not lines[i].strip() or _indent(lines[i]) > base):
        i += 1
    return i


def _structural_lines(text: str) -> list[str | None]:
    """The docstring's lines with code, doctests, dropped sections and entry lines removed; None
    marks a paragraph break."""
    lines = text.expandtabs().splitlines()
    out: list[str | None] = []
    section, entry_indent, heading_indent, i = None, None, -1, 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if not stripped:
            out.append(None)
            i += 1
            continue
        if heading_indent >= 0 and _indent(line) <= heading_indent:  # a Google section ends on dedent
            section, heading_indent = None, -1
        title = _heading(lines, i)
        if title is not None:
            underlined = i + 1 < len(lines) and UNDERLINE.match(lines[i + 1])
            section, entry_indent = title, None
            heading_indent = -1 if underlined else _indent(line)
            out.append(None)
            i += 2 if underlined else 1
            continue
        if UNDERLINE.match(line):  # an overline or a stray rule
            i += 1
            continue
        if DOCTEST.match(line):  # the prompt, its continuation and its output up to a blank line
            while i < len(lines) and lines[i].strip():
                i += 1
            out.append(None)
            continue
        if FENCE.match(line):
            fence = stripped[:3]
            i += 1
            while i < len(lines) and not lines[i].strip().startswith(fence):
                i += 1
            i += 1
            out.append(None)
            continue
        directive = DIRECTIVE.match(line)
        if directive:
            name = directive.group(1).lower()
            if name in PROSE_DIRECTIVES:
                out.append(None)
                if directive.group(2):
                    out.append(directive.group(2))
                i += 1
            else:
                i = _skip_indented(lines, i + 1, _indent(line))
                out.append(None)
            continue
        if RST_COMMENT.match(line):
            i = _skip_indented(lines, i + 1, _indent(line))
            out.append(None)
            continue
        if section in DROP_SECTIONS:
            i += 1
            continue
        field = FIELD.match(line)
        if field:
            out.append(None)
            if field.group(1) not in ("type", "rtype", "vartype") and field.group(2):
                out.append(field.group(2))
            i += 1
            continue
        typed = TYPED_ENTRY.match(line)
        if typed:
            out.append(None)
            if typed.group(1):
                out.append(typed.group(1))
            i += 1
            continue
        if section in FIELD_SECTIONS:
            if entry_indent is None:
                entry_indent = _indent(line)
            if _indent(line) <= entry_indent:  # "name : type", a bare type, or "name (type): description"
                out.append(None)
                google = ENTRY.match(line)
                if google and " : " not in line:
                    out.append(google.group(2))
                elif " : " not in line and " " in stripped:  # a Returns description without a name
                    out.append(stripped)
                i += 1
                continue
        if stripped.endswith("::"):  # a literal block follows: keep the sentence, drop the block
            head = stripped[:-2].rstrip()
            if head:
                out.append(head + (":" if not stripped.endswith(" ::") else ""))
            i = _skip_indented(lines, i + 1, _indent(line))
            out.append(None)
            continue
        if BULLET.match(line):
            out.append(None)
            line = BULLET.sub("", line, count=1)
        out.append(line.strip())
        i += 1
    return out


def _paragraphs(lines: list[str | None]) -> list[str]:
    paragraphs, current = [], []
    for line in lines + [None]:
        if line is None:
            if current:
                paragraphs.append(_inline(" ".join(current)))
            current = []
        else:
            current.append(line)
    return [p for p in paragraphs if p]


def is_prose(paragraph: str, min_words: int) -> bool:
    """Running English text, not code, a signature or a list of names."""
    words = paragraph.split()
    if len(words) < min_words:
        return False
    visible = [c for c in paragraph if not c.isspace()]
    if sum(c.isalpha() for c in visible) < 0.8 * len(visible):
        return False
    codeish = sum(bool(re.search(r"[_=(){}\[\]<>|\\@$#]|\w\.\w|^[a-z]+[A-Z]", w)) for w in words)
    if codeish > 0.2 * len(words):
        return False
    function_words = sum(w.lower().strip(".,;:!?()\"'") in FUNCTION_WORDS for w in words)
    return function_words >= 0.15 * len(words)


def prose_paragraphs(text: str, min_words: int) -> list[str]:
    """The paragraphs of `text` (a cleaned docstring or plain-text page) that are running prose."""
    return [p for p in _paragraphs(_structural_lines(text)) if is_prose(p, min_words)]
