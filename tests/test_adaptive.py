"""Adaptive depth (wise.halting): the loss-improvement oracle's labels on hand-made loss curves,
the threshold selection on constructed cases, the ACT / PonderNet weights, the halting floor and
budget (replayed and online, on a tiny random looped model), every rule deciding online exactly as
replayed, WISE under adaptive depth, and McNemar on adaptive pairs equal to wise.analysis.stats.mcnemar."""
import pytest
import torch

from wise.halting import heads as H
from wise.halting import rules as R
from wise.halting.online import causal_tiles, run_online, wise_adaptive
from wise.halting.depth_tables import paired, summarize
from wise.halting.trajectory import LoopSignal, Trajectory, trajectory
from wise.models.looped.base import build_base
from wise.looped.data import PromptRow
from wise.models.looped.model import build_looped
from wise.engine.runner import PAPER_SETTINGS, WiseSettings
from wise.analysis.stats import mcnemar

TINY = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 512,
        "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # batch-of-one runs of a tiny model: one intra-op thread is several times faster on a busy CPU
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def model():
    base = build_base("llama", 0, **TINY).eval()
    m = build_looped(base, block_start=1, block_layers=2, window=3, lma_heads=2, lma_head_dim=8, gate_hidden=4)
    with torch.no_grad():  # open gates, as after training: the loops change the state
        m.alpha.fill_(0.5)
        for lma in m.lma:
            lma.gamma.fill_(0.5)
    return m.eval()


def rows(n: int, length: int = 40) -> list[PromptRow]:
    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(n):
        ids = torch.randint(3, TINY["vocab_size"], (length + 3,), generator=g).tolist()
        out.append(PromptRow(f"ex{i}", "synthchain" if i % 2 else "syntharith", tuple(ids[:length]),
                             tuple(ids[length:]) + (1,), ("x",), i % 3 + 1))
    return out


def constant_head(hidden: int, p: float) -> H.LinearHead:
    head = H.LinearHead(hidden)
    with torch.no_grad():
        head.bias.fill_(float(torch.logit(torch.tensor(p))) if 0 < p < 1 else (40.0 if p == 1 else -40.0))
    return head


# -- the oracle ------------------------------------------------------------------------------------
def test_oracle_labels_on_hand_made_loss_curves():
    assert H.oracle_labels([1.0, 0.8, 0.9, 0.5], 0.1) == [1, 1, 1]  # a later loop is far better
    assert H.oracle_labels([0.5, 0.6, 0.7, 0.8], 0.0) == [0, 0, 0]  # looping only hurts
    assert H.oracle_labels([0.5, 0.6, 0.55, 0.7], 0.01) == [0, 1, 0]  # U-shape: only from loop 2
    # the margin is strict: an improvement of exactly delta (or less) is not "helps"
    assert H.oracle_labels([1.0, 0.75, 0.75], 0.25) == [0, 0]
    assert H.oracle_labels([1.0, 0.7499, 0.75], 0.25) == [1, 0]
    assert H.oracle_labels([2.0, 2.0], 0.0) == [0]
    with pytest.raises(ValueError):
        H.oracle_labels([1.0], 0.0)
    with pytest.raises(ValueError):
        H.oracle_labels([1.0, 0.5], -0.1)


def test_halting_head_learns_the_oracle_of_a_constructed_case():
    # feature 0 says whether loops 3.. help: examples with z0 = +1 improve later, z0 = -1 do not
    N, T, hid = 40, 4, 3
    sign = torch.tensor([1.0 if i % 2 else -1.0 for i in range(N)])
    z = torch.randn(N, T, hid, generator=torch.Generator().manual_seed(0)) * 0.1
    z[:, :, 0] = sign[:, None]
    nll = torch.where(sign[:, None] > 0, torch.tensor([1.0, 0.9, 0.5, 0.4]), torch.tensor([0.5, 0.6, 0.7, 0.8]))
    head, log = H.fit_halting(z, nll, t_min=2, delta=0.05, steps=200, lr=0.1, l2=0.0)
    assert log["rows"] == N * 2 and log["positive_rate"] == pytest.approx(0.5)  # loops 2 and 3
    assert log["train_label_accuracy"] == 1.0
    p = head(z[:, 1])
    assert (p[sign > 0] > 0.9).all() and (p[sign < 0] < 0.1).all()


# -- ACT and PonderNet -------------------------------------------------------------------------------
def test_act_weights_remainder_and_budget():
    p, N, R_ = H.act_weights(torch.tensor([[0.3, 0.4, 0.5, 0.2], [0.1, 0.1, 0.1, 0.1]]), 0.01)
    assert N.tolist() == [3, 4]  # 0.3 + 0.4 + 0.5 >= 0.99; the second never reaches it: the budget
    assert R_.tolist() == pytest.approx([0.3, 0.7])
    assert p.tolist()[0] == pytest.approx([0.3, 0.4, 0.3, 0.0])
    assert p.sum(1).tolist() == pytest.approx([1.0, 1.0])


def test_pondernet_weights_and_prior_are_distributions():
    lam = torch.tensor([[0.5, 0.5, 0.5], [0.0, 0.0, 0.0]])
    p = H.pondernet_weights(lam)
    assert p.tolist()[0] == pytest.approx([0.5, 0.25, 0.25]) and p.tolist()[1] == pytest.approx([0, 0, 1])
    g = H.geometric_prior(0.5, 3)
    assert g.tolist() == pytest.approx([4 / 7, 2 / 7, 1 / 7])


def test_a_ponder_cost_that_outweighs_the_gain_collapses_act_to_one_loop():
    # deeper loops help a little (the gold tokens' log-prob rises by 0.05 per loop); a ponder cost
    # of 1 per loop outweighs it, so ACT learns to halt after the first loop
    N, T = 16, 4
    z = torch.randn(N, T, 3, generator=torch.Generator().manual_seed(0))
    gold = (-1.0 + 0.05 * torch.arange(T, dtype=torch.float32))[None, :, None].expand(N, T, 2).clone()
    head, log = H.fit_act(z, gold, torch.ones(N, 2, dtype=torch.bool), epsilon=0.01, ponder_cost=1.0,
                          steps=200, lr=0.1, l2=0.0)
    assert log["train_mean_loops"] == 1.0


# -- threshold selection -----------------------------------------------------------------------------
def test_threshold_selection_on_a_constructed_case():
    rows_ = [{"threshold": 0.1, "mean_depth": 5.0, "mean_nll": 0.50},
             {"threshold": 0.5, "mean_depth": 3.0, "mean_nll": 0.52},
             {"threshold": 0.7, "mean_depth": 2.5, "mean_nll": 0.53},
             {"threshold": 0.9, "mean_depth": 2.0, "mean_nll": 0.60}]
    assert R.select_threshold(rows_, reference=0.51, tolerance=0.02) == (2, True)  # 0.53 <= 0.53: kept
    assert R.select_threshold(rows_, reference=0.51, tolerance=0.015) == (1, True)
    assert R.select_threshold(rows_, reference=0.40, tolerance=0.01) == (0, False)  # none: the lowest NLL
    tie = [{"threshold": 0.2, "mean_depth": 2.0, "mean_nll": 0.5},
           {"threshold": 0.3, "mean_depth": 2.0, "mean_nll": 0.4}]
    assert R.select_threshold(tie, reference=0.5, tolerance=0.0) == (1, True)  # same depth: the lower NLL
    fixed = [{"T": 1, "mean_nll": 0.4, "accuracy": 0.5}, {"T": 2, "mean_nll": 0.45, "accuracy": 0.6},
             {"T": 3, "mean_nll": 0.45, "accuracy": 0.6}, {"T": 4, "mean_nll": 0.5, "accuracy": 0.6}]
    assert R.reference_nll(fixed, 2, 4) == (2, 0.45)  # the floor excludes T=1; ties: the smaller T
    assert R.best_fixed_depth(fixed) == 2  # best accuracy, then lower NLL, then smaller T


def _traj(example_id: str, ps: list[float], nll: list[float]) -> Trajectory:
    # z holds the head's logit in feature 0 (a head with weight e0 and no bias reads it back)
    sig = [LoopSignal(z=torch.tensor([float(torch.logit(torch.tensor(p))), 0.0]), nll=l, correct=False, top1=0.5,
                      pred=(1,), gold_logprob=(-l,)) for p, l in zip(ps, nll)]
    return Trajectory(example_id, "synthchain", 1, sig)


def test_tau_is_the_smallest_mean_depth_that_loses_no_likelihood():
    # example a improves at loop 3, example b gets worse after loop 2; the head says "continue"
    # with p = 0.8 where continuing helps and p = 0.3 where it does not
    trajs = [_traj("a", [0.8, 0.8, 0.1, 0.1], [1.0, 0.9, 0.5, 0.5]),
             _traj("b", [0.3, 0.3, 0.3, 0.3], [0.4, 0.4, 0.6, 0.8])]
    head = H.LinearHead(2)
    with torch.no_grad():
        head.weight.copy_(torch.tensor([1.0, 0.0]))
    fixed = R.fixed_curve(trajs)
    ref_T, ref = R.reference_nll(fixed, 2, 4)
    assert (ref_T, ref) == (3, pytest.approx(0.55))
    grid = [0.0, 0.2, 0.5, 0.9, 1.0]
    curve = R.curve(lambda th: R.Halting(head, th, 2), grid, trajs)
    assert [r["mean_depth"] for r in curve] == [4.0, 3.5, 2.5, 2.0, 2.0]
    assert [r["mean_nll"] for r in curve] == pytest.approx([0.65, 0.65, 0.45, 0.65, 0.65])
    pick, ok = R.select_threshold(curve, ref, 0.0)
    # tau = 0.5: a continues to loop 3 (p 0.8 >= 0.5), b stops at the floor; mean NLL (0.5 + 0.4) / 2
    assert ok and grid[pick] == 0.5 and curve[pick]["mean_nll"] == pytest.approx(0.45)


# -- floor and budget ----------------------------------------------------------------------------------
def test_halting_obeys_t_min_and_t_max(model):
    hidden = model.config.hidden
    stop, go = constant_head(hidden, 0.0), constant_head(hidden, 1.0)
    for row in rows(2):
        tr = trajectory(model, row, 5, "mean")
        for t_min in (1, 2, 3):
            assert R.replay(R.Halting(stop, 0.5, t_min), tr) == R.Decision(t_min, t_min)  # never before the floor
            assert R.replay(R.Halting(go, 0.5, t_min), tr) == R.Decision(5, 5)  # never past the budget
            assert R.replay(R.Halting(go, 0.5, t_min), tr, t_max=4) == R.Decision(4, 4)
            d, answer, _ = run_online(model, row, R.Halting(stop, 0.5, t_min), 5, "mean")
            assert d == R.Decision(t_min, t_min) and answer.nll == tr.signals[t_min - 1].nll
            d, _, _ = run_online(model, row, R.Halting(go, 0.5, t_min), 3, "mean")
            assert d == R.Decision(3, 3)
        # the floor applies to the other floored rules too; the token-mismatch oracle looks one loop ahead
        assert R.replay(R.Confidence(0.0, 3), tr).depth == 3
        d = R.replay(R.Stability(2), tr)
        assert d.computed in (d.depth + 1, 5) and d.depth >= 2


def test_every_rule_decides_online_as_on_its_trajectory(model):
    hidden = model.config.hidden
    g = torch.Generator().manual_seed(3)
    heads = {name: H.LinearHead(hidden) for name in H.HEADS}
    for head in heads.values():
        with torch.no_grad():
            head.weight.copy_(torch.randn(hidden, generator=g) * 0.2)
    card = {"t_min": 2, "t_max": 4, "tau": 0.5, "confidence_threshold": 0.01, "act_epsilon": 0.01, "seed": 0}
    for row in rows(3):
        tr = trajectory(model, row, 4, "last")
        for rule in R.method_rules(heads, card):
            d, answer, seconds = run_online(model, row, rule, 4, "last")
            ref = R.replay(rule, tr)
            assert d == ref, rule.name
            assert (answer.correct, answer.nll) == (tr.signals[ref.depth - 1].correct, tr.signals[ref.depth - 1].nll)
            assert seconds > 0


# -- WISE under adaptive depth -----------------------------------------------------------------------
def test_wise_under_adaptive_depth(model):
    hidden = model.config.hidden
    row = rows(1, length=60)[0]
    n = len(row.prompt_ids) + len(row.answer_ids)
    per_loop = 2 * 4 * causal_tiles(n, 16)
    go = R.Halting(constant_head(hidden, 1.0), 0.5, 2)  # never stops: to the budget
    dense = PAPER_SETTINGS.replace(steps=6, discovery_step=3, window=2, block_size=16, eta=1.0)
    res = wise_adaptive(model, row, go, 6, "mean", dense, seed=0)
    tr = trajectory(model, row, 6, "mean")
    assert res["full"]["decision"] == R.replay(go, tr) == R.Decision(6, 6)
    assert res["full"]["answer"].nll == pytest.approx(tr.signals[5].nll, abs=1e-5)
    # eta = 1 keeps every causal tile: WISE is Full
    assert res["density"] == 1.0 and res["wise"]["tiles"] == res["full"]["tiles"] == 6 * per_loop
    assert res["wise"]["answer"].nll == pytest.approx(res["full"]["answer"].nll, abs=1e-4)
    sparse = PAPER_SETTINGS.replace(steps=6, discovery_step=3, window=2, block_size=16, eta=0.5)
    res = wise_adaptive(model, row, go, 6, "mean", sparse, seed=0)
    assert res["density"] < 1.0
    assert res["wise"]["tiles"] == 3 * per_loop + 3 * round(res["density"] * per_loop)
    # a rule that stops by t_d never reaches the working set: one run, Full's
    stop = R.Halting(constant_head(hidden, 0.0), 0.5, 2)
    res = wise_adaptive(model, row, stop, 6, "mean", sparse, seed=0)
    assert res["wise"]["decision"] == res["full"]["decision"] == R.Decision(2, 2)
    assert res["density"] is None and res["wise"]["tiles"] == 2 * per_loop
    assert res["full"]["answer"].nll == pytest.approx(tr.signals[1].nll, abs=1e-5)


# -- McNemar ---------------------------------------------------------------------------------------------
def test_mcnemar_on_adaptive_pairs_equals_wise_stats():
    g = torch.Generator().manual_seed(5)
    ex = []
    for i in range(30):
        bench = "synthchain" if i < 18 else "syntharith"
        for method in ("fixed@2", "halting"):
            right = bool(torch.rand(1, generator=g) < (0.4 if method == "fixed@2" else 0.6))
            ex.append({"example_id": f"e{i:02d}", "benchmark": bench, "method": method,
                       "kind": "fixed" if method == "fixed@2" else "adaptive", "threshold": None, "depth": 2,
                       "loops_computed": 2, "correct": right, "nll": 0.5, "correct_at_1": False})
    ex.reverse()  # pairing is on example id, not on row order
    summary = summarize(ex, "fixed@2", ["fixed@2", "halting"])
    for r in summary:
        a = {e["example_id"]: e["correct"] for e in ex if e["method"] == r["method"]
             and r["benchmark"] in ("all", e["benchmark"])}
        b = {e["example_id"]: e["correct"] for e in ex if e["method"] == "fixed@2"
             and r["benchmark"] in ("all", e["benchmark"])}
        ids = sorted(a)
        assert r["mcnemar_p"] == mcnemar([a[i] for i in ids], [b[i] for i in ids])
        assert r["only_method_right"] == sum(a[i] and not b[i] for i in ids)
    assert {(r["benchmark"], r["method"]) for r in summary} == {
        (b, m) for b in ("synthchain", "syntharith", "all") for m in ("fixed@2", "halting")}
    with pytest.raises(ValueError, match="different examples"):
        paired(ex[1:], "halting", "fixed@2")


# -- params --------------------------------------------------------------------------------------------
def test_halting_and_adaptive_params_name_the_bad_key():
    from params_files import retrofit_params

    for raw, key in [({"halting": {"t_max": 2}}, "recurtrace.halting.t_max"),  # must exceed t_min = 2
                     ({"halting": {"tau_grid": [0.5, 1.5]}}, "recurtrace.halting.tau_grid"),
                     ({"halting": {"confidence_grid": []}}, "recurtrace.halting.confidence_grid"),
                     ({"halting": {"pool": "max"}}, "recurtrace.halting.pool"),
                     ({"halting": {"variant": "big"}}, "recurtrace.halting.variant"),
                     ({"halting": {"act_epsilon": 1.0}}, "recurtrace.halting.act_epsilon"),
                     ({"halting_eval": {"wise": {"window": 3}}}, "recurtrace.halting_eval.wise.window"),  # > t_d = 2
                     ({"halting_eval": {"wise": {"discovery_step": 8}}}, "recurtrace.halting_eval.wise.discovery_step"),
                     ({"halting_eval": {"timing_repeats": 0}}, "recurtrace.halting_eval.timing_repeats")]:
        with pytest.raises(ValueError, match=key.replace(".", r"\.")):
            retrofit_params(raw)
    # the heads and the evaluation are downstream of the checkpoints: not part of their recipe
    assert retrofit_params({"halting": {"delta": 0.5}}).recipe("lma") == retrofit_params().recipe("lma")


def test_validate_requires_every_halting_and_adaptive_key():
    import yaml

    from pipelines.config.params import ParamsError
    from stages.validate import check_retrofit

    raw = yaml.safe_load(open("params.yaml").read())
    check_retrofit(raw, "params.yaml")
    for section, key in (("halting", "delta"), ("halting_eval", "wise.eta")):
        broken = yaml.safe_load(open("params.yaml").read())
        *parents, last = key.split(".")
        node = broken["recurtrace"][section]
        for k in parents:
            node = node[k]
        del node[last]
        with pytest.raises(ParamsError, match=rf"recurtrace\.{section}\.{key}"):
            check_retrofit(broken, "params.yaml")
