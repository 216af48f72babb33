"""The report's GPU-study sections name the retrofits they ran on: a study whose checkpoints.txt lists other
files than the committed checkpoints is labelled, and the training table reads the per-variant NLL files."""
import hashlib

import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def _checkpoint(root, variant: str, payload: bytes) -> str:
    path = root / "data" / "models" / f"smollm2-135m-{variant}" / "retrofit.safetensors"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(payload)
    return f"{hashlib.sha256(payload).hexdigest()}  data/models/smollm2-135m-{variant}/retrofit.safetensors\n"


def _run(root, listing: str):
    run = root / "benchmarks" / "results" / "real-train-h200" / "2026-12-05"
    run.mkdir(parents=True)
    (run / "checkpoints.txt").write_text(listing)
    (run / "gpu.txt").write_text("NVIDIA H200, 580, 143771 MiB\n")
    for variant, depths in (("t1", (1,)), ("plain", (1, 2)), ("lma", (1, 2))):
        rows = [{"variant": v, "loops": d, "window": w, "tokens": 8, "nll": 3.0 - 0.1 * d + 0.01 * w}
                for v, ds in (("base", (1,)), (variant, depths)) for d in ds for w in range(4)]
        pq.write_table(pa.Table.from_pylist(rows), run / f"nll_{variant}.parquet")
    return run


def test_a_study_on_the_committed_retrofits_has_no_label_and_one_on_others_has(tmp_path):
    from pipelines.real.gpu_study import checkpoint_sentence

    listing = "".join(_checkpoint(tmp_path, v, v.encode()) for v in ("lma", "plain", "t1"))
    run = _run(tmp_path, listing)
    assert checkpoint_sentence(run, tmp_path) == ""
    _checkpoint(tmp_path, "plain", b"retrained")
    assert "smollm2-135m-plain/retrofit.safetensors differs" in checkpoint_sentence(run, tmp_path)
    (run / "checkpoints.txt").unlink()
    assert "does not list the retrofits" in checkpoint_sentence(run, tmp_path)


def test_the_training_table_has_every_variant_and_depth_with_its_interval(tmp_path):
    from pipelines.real.gpu_study import gpu_study_markdown
    from tests.params_files import default_params

    listing = "".join(_checkpoint(tmp_path, v, v.encode()) for v in ("lma", "plain", "t1"))
    _run(tmp_path, listing)
    md = gpu_study_markdown(default_params(), tmp_path)
    assert "**Real retrofits, GPU training** (`benchmarks/results/real-train-h200/2026-12-05`, NVIDIA H200)" in md
    assert "on 4 test-split windows" in md and "differs" not in md
    lines = {line.split(" | ")[0]: line for line in md.splitlines() if line.startswith("| ")}
    assert lines["| lma"].count("[") == 2 and lines["| t1"].count("[") == 1  # t1 is scored at T = 1 only
    assert "| 2.915 [" in lines["| lma"]  # 3.0 - 0.1 + mean(0.00, 0.01, 0.02, 0.03) at T = 1
