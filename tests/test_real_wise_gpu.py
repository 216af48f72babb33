"""The real-WISE GPU run of issue 51 (params/real-wise-gpu.yaml, scripts/real_wise_gpu.sh): its
params, the test-split pack it carries, and the report's WISE-vs-Truncate sentence (pipelines.real.gpu_study)."""
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from scripts.real_wise_pack import split_rows
from pipelines.config.params import load_params
from pipelines.real.gpu_study import wise_vs_truncate_sentence

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_params_cover_item_5_inside_the_trained_depth_and_the_positions():
    p = load_params(ROOT / "params" / "real-wise-gpu.yaml")
    r, m = p.real_wise, p.real_model
    assert r.retrofit == "lma" and p.compute.executor == "local"
    assert len(r.lengths) == 5 and r.lengths[0] == 512 and r.lengths[-1] >= 8000
    assert max(r.lengths) + p.conditions.max_new_tokens <= 8192  # SmolLM2's positions
    assert r.needles >= 64 and r.windows >= 32
    for T, t_d, w in r.settings:
        assert m.loops_min <= T <= m.loops_max and w <= t_d < T


def test_pack_keeps_the_test_split_in_order_and_refuses_a_corpus_without_it():
    corpus = pa.table({"split": ["train", "test", "heldout", "test"], "distribution": ["a", "b", "c", "b"],
                       "text": ["t0", "t1", "t2", "t3"]})
    assert split_rows(corpus).column("text").to_pylist() == ["t1", "t3"]
    with pytest.raises(ValueError, match="no document of the test split"):
        split_rows(corpus.slice(0, 1))
    with pytest.raises(ValueError, match="no 'split' column"):
        split_rows(corpus.drop(["split"]))


def _row(task, length, condition, accuracy, nll, T=8, t_d=3, w=2):
    return {"T": T, "t_d": t_d, "w": w, "task": task, "length": length, "condition": condition,
            "accuracy": accuracy, "mean_nll": nll}


def test_wise_vs_truncate_sentence_follows_the_table():
    summary = [_row("text", 512, "wise", None, 3.0), _row("text", 512, "truncate", None, 3.5),
               _row("text", 1024, "wise", None, 4.0), _row("text", 1024, "truncate", None, 3.9),
               _row("qa", 512, "wise", 0.9, 0.5), _row("qa", 512, "truncate", 0.8, 0.1),
               _row("qa", 1024, "wise", 0.8, 0.2), _row("qa", 1024, "truncate", 0.8, 0.1),
               _row("qa", 2048, "full", 1.0, 0.1)]
    sentence = wise_vs_truncate_sentence(summary)
    beats, not_beats = sentence.split("; it does not at ")
    assert "text 512" in beats and "qa 512" in beats and "accuracy 0.90 vs 0.80" in beats
    assert "text 1024" in not_beats and "qa 1024" in not_beats and "2048" not in sentence
    assert wise_vs_truncate_sentence(summary[-1:]).startswith("WISE vs Truncate: the table has no pair")


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU `bench` runs the benchmarks themselves")
def test_bench_times_the_study_this_machine_joined_not_the_trees_sample(tmp_path):
    """A call's fresh copy of the tree puts the tracked 512-token sample back at data/real/wise, so `bench`
    in a later call must take the layouts the study's join left under WORK (2026-12-06: it timed the sample)."""
    def bench(work):
        env = {**os.environ, "PYTHON": sys.executable, "WORK": str(work), "OUT": str(tmp_path / "out")}
        done = subprocess.run(["bash", "scripts/real_wise_gpu.sh", "bench"], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        return (tmp_path / "out" / "bench.log").read_text().splitlines()[0]

    joined = tmp_path / "work" / "wise-results" / "layouts.parquet"
    joined.parent.mkdir(parents=True)
    pq.write_table(pa.table({"length": [8160, 512, 8160]}), joined)
    assert bench(tmp_path / "work") == f"bench: layouts {joined}, lengths [512, 8160]"
    tree = pq.read_table(ROOT / "data" / "real" / "wise" / "layouts.parquet", columns=["length"])
    lengths = sorted(set(tree.column("length").to_pylist()))
    assert bench(tmp_path / "cold") == f"bench: layouts data/real/wise/layouts.parquet, lengths {lengths}"


def _kernel_row(length, label, pack, x_cudnn, density=0.2):
    return dict(label=label, status="ok", gpu="GPU-X", n=length - 32, nominal_length=length, pack=pack,
                density=density, neighbour_overlap=0.5, call_vs_cudnn=x_cudnn)


def test_benchmark_table_takes_each_lengths_faster_pack_and_pairs_the_random_forward():
    from pipelines.real.gpu_study import benchmark_lines
    smollm2 = [_kernel_row(512, "real", 1, 0.9), _kernel_row(512, "real", 2, 1.4),
               _kernel_row(512, "random-matched", 1, 1.1), _kernel_row(8160, "real", 2, 3.5)]
    huginn = [_kernel_row(512, "real", 0, 1.2), _kernel_row(512, "random-matched", 0, 1.3)]
    whole = [dict(label="real:needle-test-0@512", gpu="GPU-X", n=480, ratio=0.98, bound=1.01, bound_reached=0.97),
             dict(label="random-matched", gpu="GPU-X", n=480, ratio=0.99, bound=1.01, bound_reached=0.98),
             dict(label="real:needle-test-0@8160", gpu="GPU-X", n=8096, ratio=1.04, bound=1.06, bound_reached=0.99)]
    # whole_model rows carry their nominal length; files from before it did name it only in the real label
    tagged = [{**r, "nominal_length": n, "label": r["label"].split("@")[0]} for r, n in zip(whole, [512, 512, 8160])]
    for forward in (whole, tagged):
        rows = [line for line in benchmark_lines(smollm2, huginn, forward) if line.startswith("| ")][2:]
        assert rows[0] == ("| 512 | 480 | 0.200 | 0.50 | 1.40 (pack 2) [1.10] | 1.20 [1.30] | 0.980 [0.990] | 1.010 "
                           "| 97% |")
        assert rows[1] == "| 8160 | 8128 | 0.200 | 0.50 | 3.50 (pack 2) [–] | – [–] | 1.040 [–] | 1.060 | 99% |"
    assert benchmark_lines([], [], []) == []


def test_the_report_shows_the_benchmarks_of_the_committed_study():
    from pipelines.real.gpu_study import REAL_WISE, REAL_WISE_BENCH, gpu_study_markdown, latest_run
    run = latest_run(ROOT / REAL_WISE[0], REAL_WISE[1])
    if run is None or not all((run / f).is_file() for f in REAL_WISE_BENCH):
        pytest.skip("no committed real-WISE study with its benchmarks")
    text = gpu_study_markdown(load_params(ROOT / "params.yaml"), ROOT)
    assert "**Kernel and whole forward on these supports**" in text
