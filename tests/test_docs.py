"""Docs point only at files that exist: every document (`*.md`) a module docstring names, and every
source path (`wise/...`, `kernels/...`, `params/...`) a module docstring, a README or a page of docs/
names.
History (CHANGELOG.md) may name deleted files; nothing else may. Paths under data/ are outputs
and downloads, absent from a fresh clone, so they are not checked."""
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CODE = ("wise", "kernels", "benchmarks", "pipelines", "stages", "scripts", "tests")
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
    assert missing("in kernels/no_such.py, not kernels/schedule.py", ROOT, REPO_PATH) == ["kernels/no_such.py"]


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
        found = [name for name in missing(path.read_text(), path.parent)
                 if "/" in name and not name.startswith("data/")]
        if found:
            bad[str(path.relative_to(ROOT))] = found
    assert not bad, bad


def _readme_edit_example() -> tuple[str, list[str]]:
    """The README's params edit (its `sed -i` line) and the stages its `dvc status` line names."""
    block = (ROOT / "README.md").read_text().split("## Changing params and rerunning", 1)[1].split("```bash", 1)[1]
    lines = block.split("```", 1)[0].strip().splitlines()
    sed = next(line for line in lines if line.startswith("sed -i "))
    status = next(line for line in lines if line.startswith("dvc status")).split("params changed:", 1)[1]
    return sed.split("#", 1)[0].strip(), [s.strip() for s in status.split(",")]


def test_the_readme_edit_changes_exactly_the_key_it_names_and_names_the_stages_that_read_it(tmp_path):
    import shlex
    import subprocess

    import yaml

    sed, said = _readme_edit_example()
    params = tmp_path / "params.yaml"
    params.write_text((ROOT / "params.yaml").read_text())
    subprocess.run([*shlex.split(sed)[:-1], str(params)], check=True)
    before, after = yaml.safe_load((ROOT / "params.yaml").read_text()), yaml.safe_load(params.read_text())

    def leaves(d, prefix=""):
        for k, v in d.items():
            yield from leaves(v, f"{prefix}{k}.") if isinstance(v, dict) else [(f"{prefix}{k}", v)]

    changed = {k for k, v in leaves(after) if dict(leaves(before)).get(k) != v}
    assert changed == {"wise.eta"}  # not real_wise.eta or any other eta
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    reading = sorted(name + ("@*" if "foreach" in st else "") for name, st in stages.items()
                     if {"wise", "wise.eta"} & set(st.get("do", st).get("params", [])))
    named = sorted(s.replace(" (all five)", "") for s in said)
    assert named == reading, (named, reading)
