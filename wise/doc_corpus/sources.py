"""Where the documentation corpus comes from: the distributions pinned exactly in pyproject.toml,
and CPython's standard library and language reference, read offline from this interpreter's installation.

The set of texts is fixed by the pins: ``pinned_distributions`` reads every ``name==version``
requirement of ``[project] dependencies``; ``check_installed`` refuses (one line naming the
package) an environment where one of them is missing or at another version, before any work, so
the same pins always give the same corpus. A distribution's files are the ones its RECORD lists
(``importlib.metadata``), so every file belongs to exactly one distribution and a package is split
as a whole. ``docstrings_of`` parses one file with ``ast`` and returns the docstrings of its
module, classes and functions (``ast.get_docstring``, cleaned by ``inspect.cleandoc``);
``comment_blocks_of`` tokenizes it (``tokenize``) and returns its runs of full-line ``#`` comments
(comments after code, the shebang / coding lines and tool pragmas are not prose). ``stdlib_files``
lists the standard library's .py files (its test suites and site-packages left out), filed under the
``python`` distribution beside the language reference.
"""
from __future__ import annotations

import ast
import importlib.metadata as metadata
import io
import re
import sys
import sysconfig
import textwrap
import tokenize
import tomllib
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

PYTHON = "python"  # the distribution name under which CPython's own text (stdlib, pydoc_data.topics) is filed
# Comment lines that are instructions to a tool, not prose: they split a block and are dropped.
PRAGMA = re.compile(r"^#\s*(noqa|type:|pragma|fmt:|pylint:|isort:|mypy:|pyright:|ruff:|flake8:|nosec|-\*-|vim?:)",
                    re.IGNORECASE)
CODING = re.compile(r"^#.*coding[:=]")  # PEP 263, on line 1 or 2
# Folders of the standard library that are not its documentation: test suites and installed packages.
STDLIB_SKIPPED = frozenset({"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"})


@dataclass(frozen=True)
class Distribution:
    name: str  # canonical (PEP 503) name
    version: str  # the installed version, local part included (torch 2.13.0+cpu)
    license: str  # as the metadata states it: License-Expression, else License's first line, else classifiers
    files: tuple[str, ...]  # absolute paths of its .py files, sorted


def pinned_distributions(pyproject: Path) -> dict[str, str]:
    """canonical name -> version of every ``name==version`` dependency of `pyproject` (sorted by name)."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {})
    pins = {}
    for text in project.get("dependencies", []):
        req = Requirement(text)
        exact = [s.version for s in req.specifier if s.operator == "=="]
        if len(exact) == 1 and "*" not in exact[0]:
            pins[canonicalize_name(req.name)] = exact[0]
    if not pins:
        raise ValueError(f"{pyproject}: no dependency is pinned exactly (name==version): nothing fixes the corpus")
    return dict(sorted(pins.items()))


def check_installed(pins: dict[str, str]) -> None:
    """Raise a one-line error naming the first pinned distribution that is missing or at another version."""
    for name, pinned in pins.items():
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            raise RuntimeError(f"pyproject.toml pins {name}=={pinned} but it is not installed: install the pins "
                               "(README command (a)) before building the corpus") from None
        if Version(installed).public != Version(pinned).public:  # a local tag (+cpu, +cu128) is the same release
            raise RuntimeError(f"pyproject.toml pins {name}=={pinned} but {installed} is installed: install the "
                               "pins (README command (a)) before building the corpus")


def _license(meta) -> str:
    expression = meta.get("License-Expression")
    if expression:
        return expression.strip()
    text = (meta.get("License") or "").strip()
    if text and "\n" not in text and len(text) <= 200:
        return text
    classifiers = [c.split("::")[-1].strip() for c in meta.get_all("Classifier") or [] if c.startswith("License ::")]
    if classifiers:
        return " / ".join(classifiers)
    return text.splitlines()[0][:200] if text else "not stated"


def distribution(name: str) -> Distribution:
    """The installed distribution `name` with its .py files (from its RECORD)."""
    dist = metadata.distribution(name)
    files = sorted(str(f.locate()) for f in dist.files or [] if str(f).endswith(".py"))
    return Distribution(canonicalize_name(dist.metadata["Name"]), dist.version, _license(dist.metadata),
                        tuple(files))


def relative_path(path: str) -> str:
    """A file's path inside site-packages (stable across machines and venvs)."""
    parts = Path(path).parts
    for anchor in ("site-packages", "dist-packages"):
        if anchor in parts:
            return "/".join(parts[parts.index(anchor) + 1:])
    return Path(path).name


def _defs_under(node: ast.AST, prefix: str) -> list[tuple[str, ast.AST]]:
    """The classes and functions directly in `node`'s body, looking through if / try / with / loops
    (definitions under ``if TYPE_CHECKING:`` or ``try: ... except ImportError:``)."""
    out = []
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            out.append((f"{prefix}.{child.name}" if prefix else child.name, child))
        elif isinstance(child, (ast.If, ast.Try, ast.With, ast.For, ast.While, ast.ExceptHandler)):
            out.extend(_defs_under(child, prefix))
    return out


def _documented(tree: ast.Module):
    """(qualified name, node) of the module and every class and function in it, in source order. Only
    statement bodies are walked (a docstring sits nowhere else): much faster than ast.walk."""
    stack: list[tuple[str, ast.AST]] = [("", tree)]
    while stack:
        prefix, node = stack.pop()
        yield prefix or "<module>", node
        stack.extend(reversed(_defs_under(node, prefix)))


def docstrings_of(source: bytes) -> list[tuple[str, str]]:
    """(qualified name, cleaned docstring) of the module, classes and functions in `source`, in
    source order; a file that does not parse under this Python gives none."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    out = []
    for name, node in _documented(tree):
        doc = ast.get_docstring(node, clean=True)
        if doc:
            out.append((name, doc))
    return out


def comment_blocks_of(source: bytes) -> list[str]:
    """The blocks of full-line ``#`` comments of `source` (comments on consecutive lines), in source
    order, each as text with the ``#`` and the common indentation removed; a bare ``#`` line gives an
    empty line (a paragraph break). Comments after code, the shebang and coding lines, and tool pragmas
    (``# noqa``, ``# type:`` ...) are left out; a pragma line ends a block. A file that does not
    tokenize under this Python gives none."""
    blocks: list[list[str]] = []
    last_row = -2
    try:
        for tok in tokenize.tokenize(io.BytesIO(source).readline):
            if tok.type != tokenize.COMMENT or tok.line[:tok.start[1]].strip():
                continue  # not a comment, or a comment after code on its line
            row, text = tok.start[0], tok.string
            if (row <= 2 and (text.startswith("#!") or CODING.match(text))) or PRAGMA.match(text):
                last_row = -2
                continue
            if row != last_row + 1:
                blocks.append([])
            blocks[-1].append(text[1:].rstrip())
            last_row = row
    except (tokenize.TokenError, SyntaxError, UnicodeDecodeError, LookupError):
        return []
    return [textwrap.dedent("\n".join(lines)).strip("\n") for lines in blocks]


def stdlib_folder() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(folder: Path | None = None) -> list[tuple[str, str]]:
    """(absolute path, path relative to the stdlib folder) of the standard library's .py files, sorted
    by relative path, without its test suites (test/, tests/, idlelib/idle_test) and site-packages."""
    folder = folder or stdlib_folder()
    out = []
    for path in folder.rglob("*.py"):
        rel = path.relative_to(folder)
        if STDLIB_SKIPPED.isdisjoint(rel.parts[:-1]) and path.is_file():
            out.append((str(path), rel.as_posix()))
    if not out:
        raise FileNotFoundError(f"{folder}: no .py files: this interpreter ships no standard library source")
    return sorted(out, key=lambda f: f[1])


def pydoc_topics() -> dict[str, str]:
    """topic -> text of this interpreter's language reference (sorted by topic)."""
    from pydoc_data.topics import topics

    if not topics:
        raise ValueError("pydoc_data.topics is empty: this interpreter ships no language reference")
    return dict(sorted(topics.items()))


def python_version() -> str:
    return ".".join(map(str, sys.version_info[:3]))


def pydoc_license() -> str:
    return "PSF-2.0"  # CPython's documentation ships under the PSF License Agreement (Doc/license.rst)

