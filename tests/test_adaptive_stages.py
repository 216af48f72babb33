"""The stages recurtrace_train_halting and recurtrace_halting_eval end to end on a tiny random retrofit (in-process,
seconds): every artifact with exactly its schema, the heads' card, the table's McNemar equal to
wise.analysis.stats.mcnemar on the example rows, WISE rows paired with Full-adaptive, a stale card refused."""
import json
import shutil

import pyarrow.parquet as pq
import pytest
import torch
import yaml

from wise.models.looped.base import build_base
from wise.model_files.fingerprint import base_fingerprint
from wise.models.looped.checkpoint import base_pointer, save_retrofit
from wise.models.looped.model import build_looped

TOKENIZER = "data/models/wise-tiny-random"


def make_retrofit(root):
    models = root / "data/models"
    base = build_base("llama", 0, vocab_size=2048, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                      bos_token_id=0, eos_token_id=1, pad_token_id=2).eval()
    base.save_pretrained(models / "tiny-base")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(f"{TOKENIZER}/{name}", models / "tiny-base" / name)
    out = models / "tiny-lma"
    model = build_looped(base, base_pointer(str(models / "tiny-base"), out), base_fingerprint(models / "tiny-base"),
                         block_start=1, block_layers=2, window=3, lma_heads=2, lma_head_dim=8, gate_hidden=4)
    with torch.no_grad():
        model.alpha.fill_(0.5)
        for lma in model.lma:
            lma.gamma.fill_(0.5)
    save_retrofit(model, out, tokenizer_from=models / "tiny-base")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    import os

    from stages import recurtrace_halting_eval, recurtrace_train_halting

    root = tmp_path_factory.mktemp("adaptive")
    make_retrofit(root)
    raw = yaml.safe_load(open("params.yaml").read())
    r = raw["recurtrace"]
    r.update(base="data/models/tiny-base", name="tiny")
    r["eval"].update(n=3, context=256)
    r["halting"].update(train_n=3, heldout_n=3, t_max=4, steps=20)
    r["halting_eval"].update(timing_examples=1, timing_repeats=2, wise_examples=2)
    r["halting_eval"]["wise"].update(discovery_step=2, window=1)
    (root / "params.yaml").write_text(yaml.safe_dump(raw))
    cwd = os.getcwd()
    os.chdir(root)
    try:
        assert recurtrace_train_halting.main(["--device", "cpu"]) == 0
        assert recurtrace_halting_eval.main(["--device", "cpu"]) == 0
        # a card trained for other params is refused, naming the stage to run
        r["halting"]["delta"] = 0.5
        (root / "stale.yaml").write_text(yaml.safe_dump(raw))
        assert recurtrace_halting_eval.main(["--device", "cpu", "--params", "stale.yaml"]) == 1
    finally:
        os.chdir(cwd)
    return root


def test_every_artifact_has_exactly_its_schema(run):
    from pipelines.config import paths, schemas

    for view in ("halting_loops", "halting_selection", "adaptive_loops", "adaptive_examples", "adaptive_summary",
                 "adaptive_depth", "adaptive_histogram", "adaptive_wise", "adaptive_wise_summary"):
        [path] = run.glob(paths.VIEWS[view].as_posix())  # data/retrofit/<recurtrace.name>/...
        got = pq.read_schema(path)
        assert got.equals(schemas.BY_VIEW[view]), view
    assert (run / "data/retrofit/tiny" / paths.ADAPTIVE_MD).read_text().startswith("# RecurTrace — adaptive depth")


def test_the_card_and_the_selection(run):
    card = json.loads((run / "data/models/tiny-halting/halting.json").read_text())
    assert card["examples"] == {"train": 6, "heldout": 6} and (card["t_min"], card["t_max"]) == (2, 4)
    sel = pq.read_table(run / "data/retrofit/tiny/halting_selection.parquet").to_pylist()
    chosen = {r["rule"]: r for r in sel if r["chosen"]}
    assert set(chosen) == {"fixed", "halting", "confidence"}
    assert chosen["halting"]["threshold"] == card["tau"] and chosen["fixed"]["T"] == card["best_fixed_depth"]
    loops = pq.read_table(run / "data/retrofit/tiny/halting_loops.parquet").to_pylist()
    assert len(loops) == 12 * 4 and all((r["label"] is None) == (r["loop"] == 4) for r in loops)


def test_the_table_pairs_every_method_with_the_best_fixed_depth(run):
    from wise.analysis.stats import mcnemar

    examples = pq.read_table(run / "data/retrofit/tiny/adaptive_examples.parquet").to_pylist()
    summary = pq.read_table(run / "data/retrofit/tiny/adaptive_summary.parquet").to_pylist()
    methods = {r["method"] for r in examples}
    assert methods == {"fixed@1", "fixed@2", "fixed@3", "fixed@4", "halting", "confidence", "act", "pondernet",
                       "stability", "oracle_correct"}
    assert all(r["weights_id"].startswith("sha256:") and r["device"] == "cpu" for r in examples)
    for s in (r for r in summary if r["benchmark"] == "all"):
        a = {r["example_id"]: r["correct"] for r in examples if r["method"] == s["method"]}
        b = {r["example_id"]: r["correct"] for r in examples if r["method"] == s["best_fixed"]}
        ids = sorted(a)
        assert s["n"] == 6 and s["mcnemar_p"] == mcnemar([a[i] for i in ids], [b[i] for i in ids])
        assert s["timed"] == 2 and "wall_ms" not in s  # one row per benchmark; its wall time: adaptive.json
    # the ceiling is never below any method (it answers from the first right loop)
    acc = {s["method"]: s["accuracy"] for s in summary if s["benchmark"] == "all"}
    assert acc["oracle_correct"] == max(acc.values())
    wise = pq.read_table(run / "data/retrofit/tiny/adaptive_wise.parquet").to_pylist()
    assert {r["method"] for r in wise} == {"halting", "act", "pondernet"} and len(wise) == 3 * 4
    by = {(r["example_id"], r["method"]): r for r in examples}
    for w in wise:
        assert w["full_depth"] == by[(w["example_id"], w["method"])]["depth"]
        assert w["wise_tiles"] <= w["full_tiles"] or w["wise_depth"] > w["full_depth"]


def test_metrics_json_is_accuracy_and_mean_loops_of_the_best_fixed_depth_and_each_rule(run):
    """adaptive.json (`dvc metrics show`): the pooled accuracy and mean loops of the best fixed depth
    (under a fixed key) and of the halting head, equal to the summary table's, and their wall time per
    example (a measurement: only here); nothing else."""
    summary = pq.read_table(run / "data/retrofit/tiny/adaptive_summary.parquet").to_pylist()
    card = json.loads((run / "data/models/tiny-halting/halting.json").read_text())
    best = f"fixed@{card['best_fixed_depth']}"
    pooled = {("best_fixed" if r["method"] == best else r["method"]): r for r in summary
              if r["benchmark"] == "all" and (r["kind"] != "fixed" or r["method"] == best)}
    assert set(pooled) == {"best_fixed", "halting", "confidence", "act", "pondernet", "stability", "oracle_correct"}
    metrics = json.loads((run / "data/retrofit/tiny/adaptive.json").read_text())
    wall = metrics.pop("wall_ms")
    headline = {m: r for m, r in pooled.items() if m in ("best_fixed", "halting")}
    assert metrics == {k: {m: r[k] for m, r in headline.items()} for k in ("accuracy", "mean_loops")}
    assert set(wall) == set(headline) and all(ms > 0 for ms in wall.values())
    assert metrics["mean_loops"]["best_fixed"] == card["best_fixed_depth"]


def test_the_report_section_reads_the_views(run, monkeypatch):
    from pipelines.reports.adaptive_report import adaptive_data, adaptive_section, fig_accuracy_vs_loops
    from pipelines.store.db import connect_views
    from pipelines.reports.figures import plt, save_figure
    from pipelines.reports.report import f, table

    monkeypatch.chdir(run)
    con = connect_views(run)
    try:
        d = adaptive_data(con)
    finally:
        con.close()
    card = json.loads((run / "data/models/tiny-halting/halting.json").read_text())
    assert (d["notes"]["tau"], d["notes"]["best_fixed"]) == (card["tau"], card["best_fixed_depth"])
    assert d["wise_settings"] == {"t_d": 2, "w": 1, "B": 16, "eta": 0.95}
    figure = fig_accuracy_vs_loops(d["summary"], save_figure, plt)
    text = "\n".join(adaptive_section(d, figure, f, table))
    assert text.startswith("## RecurTrace — adaptive depth") and "| oracle_correct |" in text
    assert (run / "data/report" / figure).is_file()
    # the same text as the stage's own markdown, from the card there and from the views here
    stage = (run / "data/retrofit/tiny/adaptive.md").read_text().rstrip("\n")
    section = adaptive_section(d, figure, f, table)[0]
    assert stage.split("\n", 1)[1] == section.split("\n", 1)[1].rstrip("\n")
