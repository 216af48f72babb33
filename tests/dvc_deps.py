"""The code deps of a DVC stage: the folders (and root modules) its command runs, from the import
graph (tests/import_graph.py).

A module inside a sub-package is covered by that sub-package's top folder (``wise/engine``,
``wise/models``, ``pipelines/config``, ``pipelines/compute``, ``kernels``); a module at the root of
``wise/``, ``pipelines/``, ``benchmarks/`` or ``stages/`` is listed as its file (those folders hold
sub-packages a stage may not run), and so is one of ``pipelines/real`` (the bodies of five stages:
corpus, training, evaluation and the WISE study must not rerun each other). A package ``__init__``
that is only a docstring runs no code and needs no dep. tests/test_dvc_deps.py checks that every
stage's deps cover its closure this way and list nothing it does not run; to print the deps a stage
needs (e.g. after adding an import):

    python tests/dvc_deps.py stages.conditions
"""
from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from import_graph import PACKAGES, ROOT, closure, repo_modules, run_graph  # noqa: E402

DVC_YAML = ROOT / "dvc.yaml"


FILE_BY_FILE = [["pipelines", "real"]]  # sub-packages whose modules are deps one by one


def is_code(dep: str) -> bool:
    """A path inside one of the project's code packages (a module or a folder of them); committed
    benchmark results (benchmarks/results/) are data."""
    return dep.split("/", 1)[0] in PACKAGES and not dep.startswith("benchmarks/results/")


def stage_module(cmd: str) -> str:
    m = re.match(r"python -m ([\w.]+)", cmd)
    if not m:
        raise ValueError(f"stage command {cmd!r} is not `python -m <module>`: its code deps cannot be derived")
    return m.group(1)


def runs_code(path: Path) -> bool:
    """False for a module that is only a docstring (an ``__init__`` that names its package)."""
    body = ast.parse(path.read_text()).body
    return not (len(body) <= 1 and all(isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) for n in body))


def code_files(module: str, graph=None) -> set[str]:
    """Repo-relative files of every module `module` runs that holds code."""
    modules = repo_modules()
    return {modules[m].relative_to(ROOT).as_posix() for m in closure(module, graph or run_graph())
            if runs_code(modules[m])}


def unit(path: str) -> str:
    """The dep that covers `path`: its sub-package's top folder, `kernels`, or the root module itself."""
    parts = path.split("/")
    if parts[0] == "kernels":
        return "kernels"
    if parts[:2] in FILE_BY_FILE:
        return path
    return "/".join(parts[:2]) if len(parts) > 2 else path


def code_deps(module: str, graph=None) -> list[str]:
    """The code deps of a stage whose command is ``python -m <module>``."""
    return sorted({unit(f) for f in code_files(module, graph)})


if __name__ == "__main__":
    for name in sys.argv[1:] or ["stages.validate"]:
        print(f"{name}:", *code_deps(name), sep="\n  - ")
