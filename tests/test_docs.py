"""Docs point only at files that exist: every document (`*.md`) a module docstring names, and every
source path (`wise/...`, `kernels/...`, `params/...`) a module docstring, a README or a page of docs/
names.
History (CHANGELOG.md) may name deleted files; nothing else may. Paths under data/ are outputs
and downloads, absent from a fresh clone, so they are not checked."""
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CODE = ("wise", "kernels", "benchmarks", "pipelines", "stages", "tests")
TOP = CODE + ("params", "docs")  # data/ holds outputs and downloads, which a fresh clone lacks
MD = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w.-]+\.md)\b")
REPO_PATH = re.compile(r"(?<![\w/.-])((?:%s)/[\w./-]*[\w])" % "|".join(TOP))


def missing(text: str, here: Path, names=MD) -> list[str]:
    """Names in `text` that resolve neither from the repo root nor from the file's folder. A
    name with a ${...} or <...> placeholder, or a glob, is a pattern, not a file."""
    out = []
    for name in names.findall(text):
        name = name.rstrip(".")
        if any(c in name for c in "*<>{}$"):
            continue
        if not any((base / name).exists() for base in (ROOT, here, here.parent)):
            out.append(name)
    return out


def docstrings():
    for pkg in CODE:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            yield path, ast.get_docstring(ast.parse(path.read_text())) or ""


def test_the_checker_sees_a_missing_file():
    assert missing("see DESIGN.md and README.md", ROOT) == ["DESIGN.md"]
    assert missing("in kernels/key_major.py, not kernels/schedule.py", ROOT, REPO_PATH) == ["kernels/key_major.py"]


def test_module_docstrings_name_only_existing_documents_and_paths():
    bad = {}
    for path, doc in docstrings():
        found = missing(doc, path.parent) + missing(doc, path.parent, REPO_PATH)
        if found:
            bad[str(path.relative_to(ROOT))] = found
    assert not bad, bad


def user_docs():
    """Every document written for users: the READMEs and the pages under docs/."""
    return [ROOT / "README.md", *sorted(ROOT.glob("*/README.md")), ROOT / "data/models/wise-small/README.md",
            *sorted((ROOT / "docs").glob("*.md"))]


def test_readmes_name_only_existing_repo_paths():
    bad = {}
    for path in user_docs():
        found = missing(path.read_text(), path.parent, REPO_PATH)
        if found:
            bad[str(path.relative_to(ROOT))] = found
    assert not bad, bad


def test_readmes_name_only_existing_documents():
    """A document path a user document names (`docs/recurtrace.md`, `kernels/README.md`) exists. A
    bare name (`calibrated.md`) names an output beside the text; paths under data/ are outputs
    (model cards, the report), absent from a fresh clone."""
    bad = {}
    for path in user_docs():
        found = [name for name in missing(path.read_text(), path.parent) if "/" in name and not name.startswith("data/")]
        if found:
            bad[str(path.relative_to(ROOT))] = found
    assert not bad, bad
