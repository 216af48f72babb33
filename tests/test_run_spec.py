"""The run spec result rows carry (pipelines.config.run_spec): the weights' hash, the code version, and the
device and dtype of the worker that ran the item; and the conditions stage's pairing checks: a run
whose support differs from the trace's fails the stage, or with conditions.allow_support_mismatch
is kept flagged."""
import dataclasses
import hashlib
import json
from pathlib import Path

import pytest

from pipelines.config import schemas
from pipelines.store.artifacts import to_table
from pipelines.conditions import PairingError, SupportMismatchError, result_rows
from params_files import default_params
from pipelines.config.params import Params
from pipelines.compute.pool import ModelWorker
from pipelines.compute.tasks.contexts import TraceContext
from pipelines.config.run_spec import code_id, code_version, run_spec, weights_id
from wise.engine.runner import PAPER_SETTINGS, WiseSettings

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "data/models/wise-tiny-random"
CPU = {"device": "cpu", "device_name": "cpu", "dtype": "float32"}


def test_weights_id_is_the_sha256_of_the_weights_or_of_the_shard_listing(tmp_path):
    single = hashlib.sha256((TINY / "model.safetensors").read_bytes()).hexdigest()
    assert weights_id(str(TINY)) == f"sha256:{single}"
    shards = tmp_path / "sharded"
    shards.mkdir()
    (shards / "a.safetensors").write_bytes(b"first shard")
    (shards / "b.safetensors").write_bytes(b"second shard")
    (shards / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"x": "b.safetensors", "y": "a.safetensors"}}))
    listing = "".join(f"{hashlib.sha256(data).hexdigest()}  {name}\n"
                      for name, data in (("a.safetensors", b"first shard"), ("b.safetensors", b"second shard")))
    assert weights_id(str(shards)) == f"sha256:{hashlib.sha256(listing.encode()).hexdigest()}"
    assert weights_id("preset:tiny-random@3") == "preset:tiny-random@3"
    assert weights_id("preset:tiny-random") == "preset:tiny-random@0"


def test_code_version_names_the_package_and_the_hash_of_the_stages_code():
    got = code_version("supports")
    assert set(got) == {"code_version", "code_id"}  # no commit, time or host: rows stay byte-identical
    assert got["code_id"] == code_id("supports") and got["code_id"].startswith("sha256:")
    assert got["code_version"] is None or got["code_version"][0].isdigit()


def _mini_project(root: Path) -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "a.py").write_text("A = 1\n")
    (root / "pkg" / "__pycache__").mkdir()
    (root / "pkg" / "__pycache__" / "a.cpython.pyc").write_bytes(b"compiled")
    (root / "run.py").write_text("import pkg.a\n")
    (root / "README.md").write_text("docs\n")
    (root / "dvc.yaml").write_text("stages:\n  one:\n    cmd: python run.py\n    deps: [data/in.parquet, run.py, pkg]\n"
                                   "  many:\n    foreach: [x, y]\n    do:\n      cmd: python run.py ${item}\n"
                                   "      deps: [run.py, \"data/${item}\"]\n")
    return root


def test_code_id_hashes_exactly_the_code_deps_that_dvc_yaml_lists(tmp_path):
    root = _mini_project(tmp_path / "p")
    first = code_id("one", root)
    expected = hashlib.sha256()
    for rel in ("pkg/a.py", "run.py"):  # path order; data/ deps and caches are not code
        data = (root / rel).read_bytes()
        expected.update(f"{rel}\0{len(data)}\0".encode() + data)
    assert first == f"sha256:{expected.hexdigest()}"
    code_id.cache_clear()
    (root / "README.md").write_text("other docs\n")  # outside the stage's code
    (root / "pkg" / "__pycache__" / "a.cpython.pyc").write_bytes(b"recompiled")
    assert code_id("one", root) == first
    code_id.cache_clear()
    (root / "pkg" / "a.py").write_text("A = 2\n")  # inside a folder dep
    assert code_id("one", root) != first
    assert code_id("many@x", root) == code_id("many@y", root) != code_id("one", root)  # foreach: `do`'s deps
    with pytest.raises(KeyError, match="no stage 'none'"):
        code_id("none", root)
    assert code_id("one", tmp_path / "elsewhere") is None  # not run from a project checkout
    code_id.cache_clear()


def test_a_worker_stamps_its_device_and_dtype_on_every_result():
    worker = ModelWorker(dataclasses.replace(default_params().model, source="preset:tiny-random@0", device="cpu",
                                             dtype="float32"))
    ctx = TraceContext(PAPER_SETTINGS.replace(steps=3, discovery_step=2, window=1, block_size=16, eta=0.9), init_seed=0,
                       topk=16, diagnostics=True)
    out = worker.run("trace", {"example_id": "e", "token_ids": list(range(3, 40)), "question_start": 30}, ctx)
    assert out["worker"] == CPU
    assert ModelWorker(dataclasses.replace(default_params().model, source="preset:tiny-random@0", device="cpu",
                                    dtype="bfloat16")).spec()["dtype"] \
        == "bfloat16"


class Tok:
    """Decodes id lists to words: enough of a tokenizer for scoring."""

    def decode(self, ids):
        return " ".join(f"w{i}" for i in ids)


def _stage_inputs(run_bits: bytes, trace_bits: bytes, hashes=("h", "h")):
    cohort = [{"example_id": "q1@64", "base_id": "q1", "benchmark": "synthhop", "context_length": 64,
               "n_tokens": 40, "answers": ["w5"], "hops": None, "refine": None}]
    outputs = [{"worker": CPU, "rows": [
        {"condition": "full", "prediction_ids": [5], "gold_logprob": -1.0, "state_hash_td": hashes[0],
         "layout_bits": None, "discovery_step": 12},
        {"condition": "wise", "prediction_ids": [6], "gold_logprob": -2.0, "state_hash_td": hashes[1],
         "layout_bits": [run_bits], "discovery_step": 12}]}]
    support = {("q1@64", "wise"): {"density": 0.5, "retained_future_mass": 0.9, "block_count": 3}}
    layouts = {("q1@64", "wise"): {0: trace_bits}}
    return cohort, outputs, support, layouts


def _params(allow: bool) -> Params:
    p = default_params()
    return dataclasses.replace(p, model=dataclasses.replace(p.model, source=str(TINY)),
                               conditions=dataclasses.replace(p.conditions, names=("full", "wise"),
                                                              allow_support_mismatch=allow))


def test_result_rows_carry_the_run_spec_and_fit_the_results_schema():
    p = _params(allow=False)
    rows = result_rows(p, *_stage_inputs(b"\x01", b"\x01"), Tok())
    assert [(r["condition"], r["em"], r["support_matches_trace"]) for r in rows] == [("full", 1.0, None),
                                                                                    ("wise", 0.0, True)]
    spec = run_spec(p, CPU, "conditions")
    assert all({k: r[k] for k in spec} == spec for r in rows)
    assert spec["weights_id"].startswith("sha256:") and spec["device"] == "cpu" and spec["generation"] == "cached"
    assert to_table(rows, schemas.CONDITION_RESULTS, "results").num_rows == 2


def test_a_support_that_differs_from_the_trace_fails_the_stage_naming_example_and_condition():
    with pytest.raises(SupportMismatchError, match=r"example q1@64, condition wise: .*allow_support_mismatch"):
        result_rows(_params(allow=False), *_stage_inputs(b"\x01", b"\x03"), Tok())
    rows = result_rows(_params(allow=True), *_stage_inputs(b"\x01", b"\x03"), Tok())
    assert [r["support_matches_trace"] for r in rows] == [None, False]  # kept, flagged
    with pytest.raises(PairingError, match="q1@64"):
        result_rows(_params(allow=True), *_stage_inputs(b"\x01", b"\x01", hashes=("h", "g")), Tok())
