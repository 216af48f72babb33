"""The code deps of dvc.yaml, generated from the import graph (tests/import_graph.py).

Each stage's `deps` are its data deps (anything that is not the project's code: data files, the
params stamp, model folders), kept as written, followed by the smallest list of code paths that
covers the import closure of its `python -m <module>` command: a folder when every file under it
is a module the stage runs, else the single files. So editing a module reruns exactly the stages
that run it, and nothing else (a README or a result file beside the code reruns nothing).

    python tests/dvc_deps.py            # exit 1 and name the stages whose code deps differ
    python tests/dvc_deps.py --write    # rewrite those deps in place (comments and order kept)

tests/test_dvc_deps.py checks that dvc.yaml equals what this writes.
"""
from __future__ import annotations

import functools
import re
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from import_graph import PACKAGES, ROOT, closure, repo_modules, run_graph  # noqa: E402

DVC_YAML = ROOT / "dvc.yaml"


def is_code(dep: str) -> bool:
    """A path inside one of the project's code packages (a module or a folder of them)."""
    return dep.split("/", 1)[0] in PACKAGES


def stage_module(cmd: str) -> str:
    m = re.match(r"python -m ([\w.]+)", cmd)
    if not m:
        raise ValueError(f"stage command {cmd!r} is not `python -m <module>`: its code deps cannot be derived")
    return m.group(1)


@functools.lru_cache(maxsize=None)
def _files_under(folder: str) -> tuple[str, ...]:
    """The files under `folder` (relative to ROOT), walked once per run: every file of every stage's
    closure asks about each folder above it."""
    return tuple(sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / folder).rglob("*")
                        if p.is_file() and "__pycache__" not in p.parts))


def code_deps(module: str, graph=None) -> list[str]:
    """The smallest sorted list of files and folders covering the files of `module`'s closure,
    where a folder stands for its files only when every file under it is in the closure."""
    modules = repo_modules()
    files = {modules[m].relative_to(ROOT).as_posix() for m in closure(module, graph or run_graph())}
    out: set[str] = set()
    for f in sorted(files):
        parts = f.split("/")
        chosen = f
        for depth in range(1, len(parts)):  # coarsest folder first
            folder = "/".join(parts[:depth])
            if files.issuperset(_files_under(folder)):
                chosen = folder
                break
        out.add(chosen)
    return sorted(out)


def _block_module(lines: list[str], start: int, indent: int) -> str:
    """The `cmd:` of the stage (or foreach `do:`) block that holds the deps line at `start`."""
    for j in range(start - 1, -1, -1):
        m = re.match(r"^(\s*)cmd:\s*(.+)$", lines[j])
        if m and len(m.group(1)) == indent:
            return stage_module(m.group(2).strip())
    for j in range(start + 1, len(lines)):  # cmd after deps
        m = re.match(r"^(\s*)cmd:\s*(.+)$", lines[j])
        if m and len(m.group(1)) == indent:
            return stage_module(m.group(2).strip())
        if lines[j].strip() and len(lines[j]) - len(lines[j].lstrip()) < indent:
            break
    raise ValueError(f"dvc.yaml line {start + 1}: a deps list without a cmd beside it")


def render(text: str) -> tuple[str, list[str]]:
    """dvc.yaml with every deps list's code paths regenerated; the names of the stages changed."""
    graph = run_graph()
    lines = text.splitlines(keepends=True)
    out, changed, i = [], [], 0
    while i < len(lines):
        line = lines[i]
        out.append(line)
        m = re.match(r"^(\s*)deps:\s*$", line)
        if not m:
            i += 1
            continue
        indent = len(m.group(1))
        item_indent = None
        j = i + 1
        items = []
        while j < len(lines):
            mm = re.match(r"^(\s*)- (.+?)\s*$", lines[j])
            if not mm or (item_indent is not None and len(mm.group(1)) != item_indent):
                break
            item_indent = len(mm.group(1))
            items.append(mm.group(2))
            j += 1
        module = _block_module(lines, i, indent)
        data = [d for d in items if not is_code(d)]
        new = data + code_deps(module, graph)
        if new != items:
            changed.append(module)
        pad = " " * (item_indent if item_indent is not None else indent + 2)
        out.extend(f"{pad}- {d}\n" for d in new)
        i = j
    return "".join(out), changed


def main(argv: list[str]) -> int:
    text = DVC_YAML.read_text()
    new, changed = render(text)
    yaml.safe_load(new)  # still valid YAML
    if not changed:
        print("dvc.yaml: every stage's code deps follow its imports")
        return 0
    if "--write" in argv:
        DVC_YAML.write_text(new)
        print(f"dvc.yaml: code deps rewritten for {', '.join(changed)}")
        return 0
    print(f"dvc.yaml: code deps differ from the imports for {', '.join(changed)} "
          "(python tests/dvc_deps.py --write)", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
