"""Every test module collects on the GPU machines' image, which has torch, triton, transformers, pyarrow
and pyyaml but no ray, dvc, duckdb or lm_eval: `pytest -m gpu` there must not stop at collection. The
packages are hidden by stand-ins earlier on the path that raise the ModuleNotFoundError a missing one
raises, so a module that imports one at its top fails here as it would there."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ABSENT_ON_GPU_IMAGE = ("ray", "dvc", "duckdb", "lm_eval")


def test_every_test_module_collects_without_ray_dvc_duckdb_or_lm_eval(tmp_path):
    for name in ABSENT_ON_GPU_IMAGE:
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"raise ModuleNotFoundError(\"No module named '{name}'\")\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           str(ROOT / "tests")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    errors = [line for line in done.stdout.splitlines() if line.startswith("ERROR ")]
    assert done.returncode == 0 and not errors, "\n".join(errors) or done.stdout[-2000:] + done.stderr[-2000:]
