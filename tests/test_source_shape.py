"""Every Python file of the project stays short enough to read: at most 400 lines, and no line over
120 characters (the house style: modules of roughly 100-400 lines; a longer line is a smell, so a
file is not squeezed under 400 lines by lengthening its lines). Reads the files as text and imports
nothing of the project.

The files checked are git's (tracked, plus untracked ones not ignored, so a new module counts before
its first commit); outside a git checkout, every .py under the code folders. benchmarks/results/ and
data/ hold outputs, not code, and are skipped.
"""
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 400
MAX_WIDTH = 120  # characters, not bytes: "η" or "→" counts as one
CODE_FOLDERS = ("wise", "pipelines", "stages", "kernels", "benchmarks", "scripts", "tests")
SKIPPED = ("benchmarks/results/", "data/")


def python_files(root: Path = ROOT) -> list[str]:
    """Paths (relative to `root`, sorted) of the project's .py files."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", "*.py"],
                                cwd=root, capture_output=True, text=True, check=True).stdout.split("\0")
    except (OSError, subprocess.CalledProcessError):  # no git, or not a checkout
        return walked_python_files(root)
    return sorted({f for f in listed if f and not f.startswith(SKIPPED) and (root / f).is_file()})


def walked_python_files(root: Path) -> list[str]:
    listed = [p.relative_to(root).as_posix() for folder in CODE_FOLDERS for p in (root / folder).rglob("*.py")]
    return sorted(f for f in listed if not f.startswith(SKIPPED))


def shape_problems(root: Path, files: list[str]) -> list[str]:
    """One line per problem: `path: N lines (over 400)` or `path:line: N characters (over 120)`."""
    problems = []
    for rel in files:
        lines = (root / rel).read_text(encoding="utf-8").splitlines()
        if len(lines) > MAX_LINES:
            problems.append(f"{rel}: {len(lines)} lines (over {MAX_LINES})")
        problems += [f"{rel}:{number}: {len(line)} characters (over {MAX_WIDTH})"
                     for number, line in enumerate(lines, 1) if len(line) > MAX_WIDTH]
    return problems


def test_the_check_flags_a_long_file_and_a_long_line_and_passes_the_limits(tmp_path):
    at_limits = ["x = 1"] * (MAX_LINES - 1) + ["#" + "η" * (MAX_WIDTH - 1)]  # 240 bytes, 120 characters
    (tmp_path / "at_limits.py").write_text("\n".join(at_limits) + "\n", encoding="utf-8")
    (tmp_path / "too_long.py").write_text("x = 1\n" * (MAX_LINES + 1), encoding="utf-8")
    (tmp_path / "too_wide.py").write_text("x = 1\n" + "#" + "→" * MAX_WIDTH + "\n", encoding="utf-8")
    assert shape_problems(tmp_path, ["at_limits.py", "too_long.py", "too_wide.py"]) == [
        f"too_long.py: {MAX_LINES + 1} lines (over {MAX_LINES})",
        f"too_wide.py:2: {MAX_WIDTH + 1} characters (over {MAX_WIDTH})"]


def test_the_files_checked_are_the_projects_code(tmp_path):
    files = python_files()
    assert "tests/test_source_shape.py" in files and "wise/__init__.py" in files
    assert not [f for f in files if f.startswith(SKIPPED)]
    # outside a git checkout: the code folders, without benchmarks/results
    for rel in ("wise/a.py", "benchmarks/results/b.py", "benchmarks/c.py", "data/d.py", "notes/e.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x = 1\n")
    assert walked_python_files(tmp_path) == ["benchmarks/c.py", "wise/a.py"]


def test_no_python_file_is_over_400_lines_or_has_a_line_over_120_characters():
    problems = shape_problems(ROOT, python_files())
    assert not problems, f"{len(problems)} over the limits:\n" + "\n".join(problems)
